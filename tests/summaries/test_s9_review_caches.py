"""Review of the cheaper summary pass (d48db6a): the index-free line caches it added are
bounded by the characters they really hold, and kept lines end up untracked by the
garbage collector whatever state the collector was in when a pass ran."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from tiermem.models.turns import NewTurn, Turn
from tiermem.summaries import offline
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
WHEN = datetime(2024, 1, 1, tzinfo=UTC)


def _held_chars(value: Any) -> int:
    """Characters of every string inside ``value`` (nested tuples)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, tuple):
        return sum(_held_chars(item) for item in value)
    return 0


def _long_budget(i: int) -> str:
    # The value (a few thousand digits) is kept as a slot although the line's body is cut
    # to max_sentence_chars: a body-only weight misses it.
    return f"My budget is {str(i) * (4000 // len(str(i)))} dollars."


def test_index_free_lines_of_turns_are_bounded_by_what_they_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offline, "SAID_CHARS", 30_000)
    summarizer = ExtractiveSummarizer(COUNTER)
    for i in range(1, 40):
        summarizer._read_lines(i, "user", "User", _long_budget(i))
    held = sum(_held_chars(value) for value in summarizer._said._data.values())
    assert len(summarizer._said) > 0
    assert held <= 30_000


def test_index_free_carried_lines_are_bounded_by_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offline, "CARRIED_SAID_CHARS", 30_000, raising=False)
    summarizer = ExtractiveSummarizer(COUNTER)
    for i in range(1, 40):
        summarizer._carried_line(f"- [{i}] User: {_long_budget(i)}")
    held = sum(_held_chars(value) for value in summarizer._carried_said._data.values())
    assert len(summarizer._carried_said) > 0
    assert held <= 30_000


def _conversation(seed: int, turns: int) -> list[Turn]:
    generated = generate_conversation(seed, turns=turns, facts=6, corrections=2).turns
    return [
        NewTurn(role=t.role, content=tuple(t.content), timestamp=WHEN).with_index(i)  # type: ignore[arg-type]
        for i, t in enumerate(generated)
    ]


@contextmanager
def _collector_eager(threshold: int) -> Iterator[None]:
    """Young collections every ``threshold`` allocations and a full one at every third:
    the state a mixed test run can leave the collector in, which promotes a tuple to the
    old generation before a later collection could see its items untracked."""
    before = gc.get_threshold()
    gc.set_threshold(threshold, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("threshold", [5, 10, 50])
def test_kept_lines_are_untracked_once_the_collector_has_seen_them(threshold: int) -> None:
    """Kept lines hold only strings, numbers and tuples of them, so collections untrack
    them; a line promoted while still tracked (its inner tuples were seen after it) is
    untracked by the next collection of its generation. After two full collections
    nothing kept is tracked (a value holding a list, dict or object would stay so)."""
    summarizer = ExtractiveSummarizer(COUNTER)
    turns = _conversation(3, 80)
    with _collector_eager(threshold):
        prior = summarizer.summarize_sync(turns[:40], target_tokens=300)
        summarizer.summarize_sync(turns[40:], prior=prior, target_tokens=300)
    gc.collect()
    gc.collect()
    caches = (
        summarizer._text_cache,
        summarizer._carried_lines,
        summarizer._said,
        summarizer._carried_said,
    )
    for cache in caches:
        assert len(cache) > 0
        tracked = [k for k, v in cache._data.items() if gc.is_tracked(v) or gc.is_tracked(k)]
        assert tracked == []
