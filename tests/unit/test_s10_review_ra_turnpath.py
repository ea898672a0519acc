"""Review of session 10's turn path and turn analysis changes (reviewer RA).

Pins what the restructure must keep, on the real parts:

* ``add_turn`` whose background item finds its lane full waits its turn (the slow path
  after :meth:`BackgroundWork.offer_batched` says no); cancelled while it waits, the turn
  stays stored, its item is never queued nor left tracked; not cancelled, the item is
  queued exactly once.
* :meth:`PhraseIndex.find` and ``search`` give what the previous code gave: the
  leftmost-longest merge of the patterns of only the groups whose first word is in the
  text (``_firsts_in``), not of every group, on random lists built from awkward
  characters (Latin-1 letters and signs, dotted I, long s, ligatures, CJK, full-width
  forms, control whitespace, curly apostrophes, combining marks).
* ``TurnText.of``'s inline ASCII path builds what ``TurnText._build`` builds for every
  ASCII character, CRLF, tabs, ``\\x1c``-``\\x1f`` and lengths around 12,000.
"""

from __future__ import annotations

import asyncio
import random
import re
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from tiermem.background import BackgroundWork
from tiermem.policies.phrases import PhraseIndex, TextView
from tiermem.policies.turn_text import TurnText
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock

_TURNS: tuple[Literal["turn"]] = ("turn",)


class _Counting(BackgroundWork):
    """A real BackgroundWork that counts the batch items it tracks (a spy, no fake)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tracked_items: list[Any] = []

    def _track(self, entry: Any) -> None:
        if entry.item is not None:
            self.tracked_items.append(entry.item)
        super()._track(entry)


async def _full_lane_service() -> tuple[MemoryService, _Counting, asyncio.Event]:
    work = _Counting(workers=1, max_pending=1)
    clock = FakeClock(datetime(2026, 3, 10, 12, tzinfo=UTC))
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    memory = MemoryService.from_settings(
        settings, clock=clock, auto_summarize=False, background=work
    )
    gate = asyncio.Event()

    async def blocked() -> None:
        await gate.wait()

    await work.submit("u0", "other", blocked)
    await asyncio.sleep(0)  # the worker runs the blocking job
    await work.submit("u0", "other", blocked)  # the lane's one slot: full now
    return memory, work, gate


async def test_add_turn_cancelled_while_waiting_for_room_keeps_the_turn_and_queues_nothing() -> (
    None
):
    memory, work, gate = await _full_lane_service()
    async with memory:
        session = await memory.session("s1", user_id="u1")
        task = asyncio.create_task(session.add_turn("user", "I prefer seinen"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()  # stored, waiting for room in the lane
        assert [t.index for t in await session.get_turns()] == [0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(work.tracked_items) == 1  # offered once, then put once: one entry
        assert not work._by_session.get("s1")  # nothing left to wait for
        gate.set()
        await memory.drain()
        assert work.queued == 0
        assert [t.index for t in await session.get_turns()] == [0]
        # The handle's view moved past the stored turn before the wait.
        turn = await session.add_turn("assistant", "ok")
        assert turn.index == 1


async def test_add_turn_waiting_for_room_queues_its_item_once() -> None:
    memory, work, gate = await _full_lane_service()
    async with memory:
        session = await memory.session("s1", user_id="u1")
        task = asyncio.create_task(session.add_turn("user", "I prefer seinen zebrafish"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()
        gate.set()
        turn = await task
        await memory.drain()
        assert len(work.tracked_items) == 1
        hits = await memory.longterm.recall("u1", "zebrafish", k=5, scope=_TURNS)
        assert [h.turn.index for h in hits if h.turn is not None] == [turn.index]


# -- phrases: the previous find, groups filtered by the text's first words -----------------

_span = re.Match.span


def _old_merge(patterns: list[re.Pattern[str]], text: str) -> list[tuple[int, int]]:
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


def _old_find(index: PhraseIndex, view: TextView) -> list[tuple[int, int, str]]:
    """The previous ``find``: only the groups ``_firsts_in`` names, merged."""
    keys = view.keys
    if keys.isdisjoint(index.firsts) and not index.punctuation_firsts:
        return []
    text = view.folded
    patterns = [index._pattern(first) for first in index._firsts_in(view)]
    if not patterns:
        return []
    if len(patterns) == 1:
        spans = [m.span() for m in patterns[0].finditer(text)]
    else:
        spans = _old_merge(patterns, text)
    return [(s, e, " ".join(text[s:e].split())) for s, e in spans]


_CHARS = [
    *"abcok '#-.!?12",
    *("\u00df", "\u00e9", "\u00d7", "\u00f7", "\u0130", "\u017f", "\ufb01"),
    *("\u597d", "\u304d", "\uff2f", "\u3000", "\t", "\n", "\x1c", "\x1f"),
    *("\u2019", "\u0301", "\u200b"),
]


@pytest.mark.parametrize("seed", range(4))
def test_find_and_search_match_the_previous_filtered_merge(seed: int) -> None:
    rnd = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rnd.choice(_CHARS) for _ in range(n))

    compared = 0
    for _ in range(300):
        phrases = [text(rnd.randint(1, 6)) for _ in range(rnd.randint(2, 12))]
        if not all(" ".join(TextView(p).folded.split()) for p in phrases):
            continue  # an empty phrase: rejected, as before
        index = PhraseIndex(phrases)
        for _ in range(15):
            sample = " ".join(
                rnd.choice([*phrases, text(3), text(5)]) for _ in range(rnd.randint(1, 6))
            )
            sample = "".join(c.upper() if rnd.random() < 0.2 else c for c in sample)
            expected = _old_find(index, TextView(sample))
            assert index.find(TextView(sample)) == expected, (phrases, sample)
            assert index.search(TextView(sample)) == bool(expected), (phrases, sample)
            compared += 1
    assert compared > 2_000


# -- TurnText.of's ASCII path -----------------------------------------------------------------


def _fields(tt: TurnText) -> tuple[Any, ...]:
    return (
        tt.text,
        tt.said_text,
        tt.nfkc,
        tt.truncated,
        tt.view.normal,
        tt.view.folded,
        tt.said.normal,
        tt.said.folded,
        tt.view is tt.said,
        list(tt.view.words),
        tt.view.keys,
    )


def _ascii_cases() -> list[str]:
    rnd = random.Random(7)
    cases = ["".join(map(chr, range(128))), "a\r\nb\tc", ""]
    cases += [chr(c) * k for c in range(128) for k in (1, 2)]
    for length in (11_999, 12_000, 12_001, 12_064):
        for fill in ("a", " ", "a b", "\x1c", "\r\n", "\t"):
            cases.append((fill * length)[:length])
            cases.append((fill * length)[: length - 1] + "\x1f")
    cases += [
        "".join(chr(rnd.randrange(128)) for _ in range(rnd.randint(0, 60))) for _ in range(500)
    ]
    return cases


def test_turn_text_of_ascii_is_what_build_gives() -> None:
    for text in _ascii_cases():
        fast, general = TurnText.of(text), TurnText._build(text, text)
        assert fast == general
        assert _fields(fast) == _fields(general), (text[:20], len(text))


async def test_add_turn_with_room_queues_its_item_once() -> None:
    work = _Counting(workers=1, max_pending=4)
    clock = FakeClock(datetime(2026, 3, 10, 12, tzinfo=UTC))
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    memory = MemoryService.from_settings(
        settings, clock=clock, auto_summarize=False, background=work
    )
    async with memory:
        session = await memory.session("s1", user_id="u1")
        await session.add_turn("user", "I prefer seinen")
        await session.add_turn("assistant", "noted")
        await memory.drain()
        assert len(work.tracked_items) == 2  # one background item per turn, no more
        assert work.queued == 0
        assert work.pending == 0
