"""The offline summarizer counts a line with its newline from the line's own count where
cl100k_base's pre-tokenizer makes that exact (issue #8: one encode per new summary line
instead of two). Checked against the encoder itself on random lines ending in every way
the pattern treats differently: letters, digits, punctuation runs with and without a
space before, symbols, emoji, combining marks, whitespace, CJK and fullwidth forms."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()

_PIECES = st.sampled_from(
    [
        "a", "Berserk", "vol", " ", "  ", "\t", "\r", "\u3000", "\xa0", ".", ",", "!?", "-",
        "- [12] User:", "'s", "'", "'ll", "42", "12345", "¥8,000", "ベルセルク", "42巻", "é",
        "e\u0301", "\u0301", "ß", "😀", "🫨", "(", ")", "/", "…", "。", "！", "？", "）", "%",
        "$", "€", "™", "©", "\u200b", "\u00ad", "x\u0308", "١٢", "Ⅳ", "½", "²", "ǅ", "\x00",
        "<|endoftext|>", "...", ".)", "\"", "”", "»", "#", "@", "&", "*", "+", "=", "~", "^",
    ]
)  # fmt: skip
_LINE = st.lists(_PIECES, min_size=1, max_size=10).map("".join)


def _newline_tokens(line: str) -> int:
    # A fresh summarizer each time: nothing kept from another line answers for this one.
    return ExtractiveSummarizer(COUNTER)._newline_tokens(line)


@settings(max_examples=1500, deadline=None)
@given(line=_LINE)
def test_a_line_with_its_newline_counts_as_the_encoder_counts_it(line: str) -> None:
    assert _newline_tokens(line) == COUNTER.count(line + "\n")


def test_the_endings_the_pattern_treats_differently() -> None:
    summarizer = ExtractiveSummarizer(COUNTER)
    for line in [
        "- [3] User: My budget is ¥8,000.",
        "- [3] User: My budget is ¥8,000 .",
        "- [3] User: is it in stock?!",
        '- [4] Assistant called search({"q": "Berserk"})',
        "- [5] User: vol 42",
        "- [5] User: see 3½",
        "- [6] User: done 😀",
        "- [6] User: done😀.",
        "- [7] User: café\u0301",
        "- [7] User: café\u0301.",
        "- [8] User: trailing space ",
        "- [8] User: tab before\t.",
        "- [8] User: two spaces  .",
        "- [9] User: 予算は8000円です。",
        "- [9] User: ＯＫ！",
        "- [10] User: it's",
        "- [10] User: rock'",
        "- [10] User: quote'.",
        ".",
        " .",
        "a",
        "- " + "." * 40,
    ]:
        expected = COUNTER.count(line + "\n")
        assert summarizer._newline_tokens(line) == expected, line
        assert summarizer._newline_tokens(line) == expected, line  # with the kept endings
