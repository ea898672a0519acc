"""A small phrase list's one pattern of all phrases (session 10, issue #8) finds what the
per-group patterns merged leftmost-longest found. The reference below is the previous
merge, copied verbatim, run on each group's own pattern (unchanged); compared on the
built-in cue and entity lists and on random lists, over random texts mixing words of the
lists, case, punctuation, CJK, full-width forms and odd whitespace."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.extraction.entities import _GENRES, _LANGUAGES
from tiermem.policies.importance import DEFAULT_IMPORTANCE_RULES as R
from tiermem.policies.phrases import PhraseIndex, TextView

_span = re.Match.span


def _leftmost_longest(patterns: list[re.Pattern[str]], text: str) -> list[tuple[int, int]]:
    heads = [pattern.search(text) for pattern in patterns]
    spans: list[tuple[int, int]] = []
    while True:
        best = None
        for match in heads:
            if match is not None and (
                best is None
                or match.start() < best.start()
                or (match.start() == best.start() and match.end() > best.end())
            ):
                best = match
        if best is None:
            return spans
        start, end = best.span()
        spans.append((start, end))
        for i, match in enumerate(heads):
            if match is not None and match.start() < end:
                heads[i] = patterns[i].search(text, end)


def reference_find(index: PhraseIndex, view: TextView) -> list[tuple[int, int, str]]:
    """Every group's own pattern, merged as before (all groups: one that cannot match
    finds nothing)."""
    text = view.folded
    patterns = [index._pattern(first) for first in sorted(index.firsts)]
    spans: Iterable[tuple[int, int]] = _leftmost_longest(patterns, text)
    return [(start, end, " ".join(text[start:end].split())) for start, end in spans]


_LISTS = [
    R.preference_cues,
    R.correction_cues,
    R.recommendation_cues,
    R.acknowledgement_cues + R.greeting_cues,
    tuple(_GENRES),
    tuple(_LANGUAGES),
    ("ok", "okay", "ok then", "o k", "'tis", "#tag", "a-b", "ab", "ab c", "ab cd", "好き", "好"),
]
_INDEXES = [PhraseIndex(cues) for cues in _LISTS]
_WORDS = sorted({w for cues in _LISTS for cue in cues for w in cue.split()})
_PIECES = [
    *_WORDS,
    " ", "  ", "\t", "\n", "\u00a0", "\u3000", ",", ".", "!", "'", "\u2019", "-", "42",
    "ＯＫ", "Ｉ", "x", "book", "this", "İ", "ß", "é", "です", "が", "ね",
]  # fmt: skip


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 30)):
        piece = rng.choice(_PIECES)
        if rng.random() < 0.3:
            piece = piece.upper() if rng.random() < 0.5 else piece.title()
        parts.append(piece)
        parts.append(rng.choice(["", " ", " ", " ", ", ", "\u00a0"]))
    return "".join(parts)


def _check(text: str) -> None:
    view = TextView(text)
    for index in _INDEXES:
        expected = reference_find(index, view)
        assert index.find(view) == expected, (text, index.firsts)
        assert index.search(TextView(text)) == bool(expected), text


def test_many_random_texts_find_as_the_merge() -> None:
    rng = random.Random(10)
    for _ in range(4_000):
        _check(_text(rng))


def test_random_phrase_lists_find_as_the_merge() -> None:
    rng = random.Random(11)
    letters = "abc 好x'-"
    for _ in range(300):
        phrases = {
            "".join(rng.choice(letters) for _ in range(rng.randint(1, 6))).strip() or "a"
            for _ in range(rng.randint(1, 12))
        }
        index = PhraseIndex(phrases)
        for _ in range(20):
            text = "".join(rng.choice(letters + "A \t") for _ in range(rng.randint(0, 40)))
            view = TextView(text)
            expected = reference_find(index, view)
            assert index.find(view) == expected, (phrases, text)
            assert index.search(TextView(text)) == bool(expected), (phrases, text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=8)), max_size=25))
def test_hypothesis_texts_find_as_the_merge(parts: list[str]) -> None:
    _check(" ".join(parts))


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=60),
    st.sampled_from([0, 1, 11_990, 11_999, 12_000, 12_001, 20_000]),
)
def test_turn_text_of_an_ascii_text_is_the_general_build(text: str, pad: int) -> None:
    """``TurnText.of``'s short path for ASCII text builds what ``_build`` builds."""
    from tiermem.policies.turn_text import TurnText

    text = "w " * (pad // 2) + text
    fast, general = TurnText.of(text), TurnText._build(text, text)
    assert fast == general
    assert (fast.nfkc, fast.truncated) == (general.nfkc, general.truncated)
    assert (fast.view.normal, fast.view.folded) == (general.view.normal, general.view.folded)
    assert (fast.said.normal, fast.said.folded) == (general.said.normal, general.said.folded)
    assert fast.view.keys == general.view.keys
    assert fast.view.words == general.view.words
