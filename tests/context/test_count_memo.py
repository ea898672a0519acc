"""MemoTokenCounter: the same counts as the counter it wraps, bounded, and shrinkable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.context.count_memo import MIN_MEMO_CHARS, MemoTokenCounter
from tiermem.models import ImageBlock, TextBlock
from tiermem.tokens import BaseTokenCounter, TiktokenCounter

COUNTER = TiktokenCounter()
LONG = "The Vagabond box set costs 120 EUR and ships from Osaka next week. " * 3


class _Counting(BaseTokenCounter):
    """Counts characters, and how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return len(text)


class _OwnBlocks(_Counting):
    """A counter with its own rule for blocks: the memo must not replace it."""

    def count_blocks(self, blocks: Sequence[Any]) -> int:
        return 1_000 * len(blocks)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=8))
def test_counts_are_the_wrapped_counters_counts(texts: list[str]) -> None:
    memo = MemoTokenCounter(COUNTER, max_entries=3)
    for text in [*texts, *reversed(texts)]:  # misses, hits and evicted entries alike
        assert memo.count(text) == COUNTER.count(text)
        blocks = (TextBlock(text=text), ImageBlock(format="png", data=b"x"))
        assert memo.count_blocks(blocks) == COUNTER.count_blocks(blocks)


def test_a_seen_text_is_not_counted_again() -> None:
    inner = _Counting()
    memo = MemoTokenCounter(inner)
    assert memo.count(LONG) == memo.count(LONG) == len(LONG)
    assert inner.calls == 1
    assert (memo.hits, memo.misses) == (1, 1)
    short = "ok" * (MIN_MEMO_CHARS // 4)
    memo.count(short)
    memo.count(short)
    assert inner.calls == 3, "short texts are counted every time, not held"
    assert memo.size == 1


def test_bounded_by_entries_and_characters_least_recently_used_first() -> None:
    memo = MemoTokenCounter(_Counting(), max_entries=2)
    a, b, c = (f"{n} {LONG}" for n in "abc")
    memo.count(a)
    memo.count(b)
    memo.count(a)  # a is now the most recently used
    memo.count(c)
    assert memo.size == 2
    inner = memo.counter
    assert isinstance(inner, _Counting)
    calls = inner.calls
    memo.count(a)
    assert inner.calls == calls, "a was kept"
    memo.count(b)
    assert inner.calls == calls + 1, "b was dropped"

    by_chars = MemoTokenCounter(_Counting(), max_chars=2 * len(a))
    for text in (a, b, c):
        by_chars.count(text)
    assert by_chars.size == 2
    assert by_chars.chars <= 2 * len(a)


def test_shrink_empties_or_trims() -> None:
    memo = MemoTokenCounter(COUNTER)
    for n in range(5):
        memo.count(f"{n} {LONG}")
    assert memo.shrink(2) == 3
    assert memo.size == 2
    assert memo.shrink() == 2
    assert memo.size == 0
    assert memo.chars == 0
    assert memo.count(LONG) == COUNTER.count(LONG)


def test_an_empty_memo_is_still_a_counter_in_a_boolean_test() -> None:
    # `counter or TiktokenCounter()` must keep the memo (a __len__ made it falsy once).
    memo = MemoTokenCounter(_Counting())
    assert memo.size == 0
    assert (memo or COUNTER) is memo


def test_a_counters_own_block_rule_is_kept() -> None:
    memo = MemoTokenCounter(_OwnBlocks())
    assert memo.count_blocks((TextBlock(text=LONG), TextBlock(text="x"))) == 2_000
