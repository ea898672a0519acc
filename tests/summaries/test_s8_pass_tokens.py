"""A new turn's line is counted from its parts (issue #8): the counts of ``- [``, each
run of up to three digits, ``]``, `` {who}:`` and `` {body}``, each encoded alone, add up
to the line's own count with cl100k_base, whose pre-tokenizer never joins "]" or ":" with
the space after it. Checked against the encoder on random lines with the characters that
pattern treats specially; any other counter counts the line whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()

_PIECES = st.sampled_from(
    [
        "a", "Berserk", "vol", " ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", ".", ",", "!?",
        "-", ":", " :", "]", "[", "'s", "'ll", "42", "12345", "¥8,000", "ベルセルク", "42巻",
        "é", "😀", "(", ")", "…", "\u0301",
    ]
)  # fmt: skip
_BODY = st.lists(_PIECES, max_size=10).map("".join)
_WHO = st.sampled_from(
    ["User", "Assistant", "Result of search_books", "Result of a tool (failed)", "Result of x1"]
)
_DIGITS = st.one_of(
    st.integers(min_value=0, max_value=10**12).map(str),
    st.sampled_from(["0", "007", "000123", "١٢"]),  # leading zeros; non-ASCII digits
)


@settings(max_examples=500, deadline=None)
@given(digits=_DIGITS, who=_WHO, body=_BODY)
def test_a_line_counts_as_the_encoder_counts_it(digits: str, who: str, body: str) -> None:
    summarizer = ExtractiveSummarizer(COUNTER)
    line = f"- [{digits}] {who}: {body}"
    assert summarizer._indexed_tokens(line, digits, who, body) == COUNTER.count(line) + 1
    # ...again from the kept parts, and as the line's kept count.
    assert summarizer._indexed_tokens(line, digits, who, body) == COUNTER.count(line) + 1
    assert summarizer._line_tokens(line) == COUNTER.count(line) + 1


class _Words:
    """A counter that is not cl100k_base: lines are not counted from their parts."""

    def count(self, text: str) -> int:
        return len(text.split())


def test_another_counter_counts_the_line_whole() -> None:
    summarizer = ExtractiveSummarizer(_Words())  # type: ignore[arg-type]
    line = "- [12] User: my budget is ¥8,000."
    assert summarizer._indexed_tokens(line, "12", "User", "my budget is ¥8,000.") == 7 + 1
