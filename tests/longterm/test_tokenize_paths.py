"""The tokenizer's ASCII fast path gives what its general path gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm.text import doc_terms, tokenize

ASCII_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=200
) | st.lists(
    st.sampled_from(["I", "the", "Stories", "boxes", "vol", "42", "ORD-12345", "don't", "_x_"]),
    max_size=20,
).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(ASCII_TEXT)
def test_an_ascii_text_is_tokenized_as_the_general_path_does(text: str) -> None:
    # A kanji after a space sends the text down the general (CJK-aware) path and adds
    # exactly one token of its own.
    assert tokenize(text + " 漢") == [*tokenize(text), "漢"]


def test_repeated_and_long_words_keep_their_terms() -> None:
    long_word = "x" * 100 + "s"  # longer than the memoised words
    for _ in range(2):
        assert tokenize(f"Stories and the {long_word}") == ["story", "x" * 100]
    assert doc_terms("stories Stories vol") == {"story": 2, "vol": 1}
