"""The offline summarizer counts a summary's tokens as the sum of its lines' counts (each
with its newline) instead of encoding the joined text (issue #8): exact only because
cl100k_base's pre-tokenizer never puts a newline and the non-space character after it in
one piece. Checked here against the encoder itself, on random lines with the characters
that pattern treats specially (spaces, newlines, punctuation, contractions, CJK, digits)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.summaries._lru import counted
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
SUMMARIZER = ExtractiveSummarizer(COUNTER)

_PIECES = st.sampled_from(
    [
        "a", "Berserk", "vol", " ", "  ", "\t", "\n", "\r", "\r\n", "\u3000", "\xa0", ".", ",",
        "!?", "-", "- [12] User:", "'s", "'ll", "'VE", "42", "12345", "¥8,000", "ベルセルク",
        "42巻", "é", "ß", "😀", "\u2028", "(", ")", "/", "…",
    ]
)  # fmt: skip
_TEXT = st.lists(_PIECES, max_size=12).map("".join)
_START = st.sampled_from(["-", "A", "日", "1", "(", "'", "é", "¥", "…"])
_LATER = st.tuples(_START, _TEXT).map("".join)
"""A line after the first: starts with a non-space character, as every summary line does."""


@settings(max_examples=400, deadline=None)
@given(first=_TEXT, later=st.lists(_LATER, max_size=6))
def test_joined_lines_count_as_the_encoder_counts_their_text(first: str, later: list[str]) -> None:
    lines = [first, *later]
    text = "\n".join(lines)
    assert SUMMARIZER._joined_tokens(lines, text) == COUNTER.count(text)
    # ...and that count is what the builder then finds for the text.
    assert counted(COUNTER, text) == COUNTER.count(text)


@settings(max_examples=100, deadline=None)
@given(first=_TEXT, later=st.lists(_TEXT, min_size=1, max_size=4))
def test_lines_starting_with_a_space_or_empty_are_counted_whole(
    first: str, later: list[str]
) -> None:
    """Lines that may start with whitespace (never made by the summarizer) fall back to
    encoding the text: still exact."""
    lines = [first, *later]
    text = "\n".join(lines)
    assert SUMMARIZER._joined_tokens(lines, text) == COUNTER.count(text)


def test_a_counter_not_known_to_be_additive_counts_the_whole_text() -> None:
    class Words:
        """A counter whose counts are not additive over lines (one per word)."""

        def count(self, text: str) -> int:
            return len(text.split())

    summarizer = ExtractiveSummarizer(Words())  # type: ignore[arg-type]
    lines = ["- one two", "- three"]
    assert summarizer._joined_tokens(lines, "\n".join(lines)) == 5
