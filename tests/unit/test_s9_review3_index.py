"""Review of 38769ba: a turn's index terms from the analysis' words (ASCII turns whose rule
view is the whole text) against the tokenizer of f093b82, on texts mixing ASCII words with
characters that fold or normalise to ASCII, full-width forms and CJK, short and past the
rule window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_s9_index_equivalence import _reference_tokenize
from tiermem.longterm.text import doc_terms, tokenize
from tiermem.policies.turn_text import RULE_HEAD_CHARS, RULE_TAIL_CHARS, TurnText

_PIECES = (
    "Hello", "world", "the", "stories", "ORD-12345", "İstanbul", "\u212a", "ſ", "ß", "ﬁne",
    "ＡＢＣ", "４２", "café", "naïve", "漫画", "ベルセルク", "x漫", "ab好cd", "I’m", "e\u0301",
    "\u00a0", "\u3000", " ", "\n", "-", "_", "a_b", "",
)  # fmt: skip
_texts = st.lists(st.sampled_from(_PIECES), max_size=20).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=_texts)
def test_turn_terms_are_the_reference(text: str) -> None:
    read = TurnText.of(text)
    assert tokenize(read) == _reference_tokenize(read) == _reference_tokenize(text)
    assert list(doc_terms(read).elements()) == list(doc_terms(text).elements())


@settings(max_examples=30, deadline=None)
@given(text=_texts.filter(bool), extra=st.integers(-20, 20))
def test_long_turn_terms_are_the_reference(text: str, extra: int) -> None:
    # Around the rule window's bound: at it the view is the whole text, past it a window.
    size = RULE_HEAD_CHARS + RULE_TAIL_CHARS + extra
    long_text = (text + " ") * (size // (len(text) + 1)) + "tail words"
    read = TurnText.of(long_text)
    assert tokenize(read) == _reference_tokenize(read)
