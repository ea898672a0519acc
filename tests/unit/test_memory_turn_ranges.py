"""The in-memory archive reads a range of turns (``get_turns``, ``tail_turns``, a retried
append) without walking the whole session, and returns what the whole-session walk it
replaced returned: the live turns of the range, by index, whatever expired, was collected
or redacted meanwhile. Checked against a plain model of the archive on generated
histories (appends with and without expiry, clock moves, collection of expired turns,
redactions)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.models import NewTurn, TextBlock
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.testing import FakeClock

SID = "s1"

# One step: ("append", turns, ttl seconds or None) | ("advance", seconds) | ("redact", pick)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.integers(1, 4),
            st.one_of(st.none(), st.integers(1, 30)),
        ),
        st.tuples(st.just("advance"), st.integers(1, 20)),
        st.tuples(st.just("redact"), st.integers(0, 10_000)),
        st.tuples(st.just("collect")),
    ),
    max_size=25,
)
queries = st.lists(
    st.tuples(st.integers(0, 80), st.one_of(st.none(), st.integers(0, 90))), max_size=8
)


def _turn(clock: FakeClock, n: int) -> NewTurn:
    return NewTurn(
        role="user", content=(TextBlock(text=f"turn {n}"),), timestamp=clock.now(), token_count=2
    )


def _live(expiry: datetime | None, now: datetime) -> bool:
    return expiry is None or now < expiry


async def _check(plan: list[tuple[object, ...]], asked: list[tuple[int, int | None]]) -> None:
    clock = FakeClock()
    store = MemoryDurableStore(clock=clock)
    # The model: index -> (text, expiry, redacted). The first append never expires, so the
    # session itself lives on and its numbering never restarts.
    model: dict[int, tuple[str, datetime | None, bool]] = {}
    made = 0
    await store.append_turns(SID, [_turn(clock, made)], expires_at=None, idempotency_key="k0")
    model[0] = ("turn 0", None, False)
    made = 1
    for step in plan:
        if step[0] == "append":
            count, ttl = step[1], step[2]
            assert isinstance(count, int)
            expires = None if ttl is None else clock.now() + timedelta(seconds=int(str(ttl)))
            new = [_turn(clock, made + i) for i in range(count)]
            stored = await store.append_turns(SID, new, expires_at=expires)
            for turn in stored:
                model[turn.index] = (turn.content[0].text, expires, False)
            made += count
        elif step[0] == "advance":
            clock.advance(timedelta(seconds=int(str(step[1]))))
        elif step[0] == "collect":
            # What the store's amortised collection does to a live session's expired
            # turns (it runs only when a session's first lifetime has passed, which a
            # short history rarely reaches): drop them, leaving gaps in the numbering.
            now = clock.now()
            archive, expiry = store._turns[SID], store._turn_expiry[SID]
            for index in [i for i, exp in expiry.items() if not _live(exp, now)]:
                del archive[index], expiry[index]
        else:
            now = clock.now()
            live = [i for i, (_, exp, _) in model.items() if _live(exp, now)]
            index = live[int(str(step[1])) % len(live)]
            await store.redact_turn(SID, index)
            text, exp, _ = model[index]
            model[index] = (text, exp, True)
    now = clock.now()
    live = sorted(i for i, (_, exp, _) in model.items() if _live(exp, now))

    def seen(turns: list[object]) -> list[tuple[int, bool]]:
        return [(t.index, t.redacted) for t in turns]  # type: ignore[attr-defined]

    for start, end in asked:
        if end is not None and end < start:
            continue
        want = [i for i in live if i >= start and (end is None or i < end)]
        got = await store.get_turns(SID, start, end)
        assert seen(got) == [(i, model[i][2]) for i in want]
        assert [t.content[0].text for t in got if not t.redacted] == [
            model[i][0] for i in want if not model[i][2]
        ]
    for count in (0, 1, 2, 5, len(live), len(live) + 3):
        got = await store.tail_turns(SID, count)
        want = live[-count:] if count else []
        assert seen(got) == [(i, model[i][2]) for i in want]
    # A retried append returns the turns it stored that still live.
    again = await store.append_turns(SID, [_turn(clock, 0)], idempotency_key="k0")
    assert seen(again) == ([(0, model[0][2])] if 0 in live else [])


@settings(max_examples=200, deadline=None)
@given(steps, queries)
def test_ranges_read_the_live_turns_the_whole_session_walk_read(
    plan: list[tuple[object, ...]], asked: list[tuple[int, int | None]]
) -> None:
    asyncio.run(_check(plan, asked))


def test_a_range_of_a_long_session_reads_only_its_own_turns() -> None:
    """Turns far outside the range are never looked at: a range of 3 in 5,000 turns costs
    3 lookups (counted by wrapping the archive's dict)."""

    async def scenario() -> None:
        clock = FakeClock()
        store = MemoryDurableStore(clock=clock)
        turns = [_turn(clock, i) for i in range(50)]
        for _ in range(100):
            await store.append_turns(SID, turns)
        looked: list[int] = []

        class Counting(dict[int, object]):
            def get(self, key: int, default: object = None) -> object:
                looked.append(key)
                return super().get(key, default)

        store._turns[SID] = Counting(store._turns[SID])  # type: ignore[assignment]
        got = await store.get_turns(SID, 4_990, 4_993)
        assert [t.index for t in got] == [4_990, 4_991, 4_992]
        assert looked == [4_990, 4_991, 4_992]
        looked.clear()
        tail = await store.tail_turns(SID, 2)
        assert [t.index for t in tail] == [4_998, 4_999]
        assert len(looked) == 2

    asyncio.run(scenario())


def test_ranges_over_mostly_collected_turns_read_what_is_held() -> None:
    """A session whose turns are mostly collected (gaps in the numbering) is read from the
    turns held; those expired but not collected yet stay hidden."""

    async def scenario() -> None:
        clock = FakeClock()
        store = MemoryDurableStore(clock=clock)
        keep = [0, 37, 38, 60]
        later = clock.now() + timedelta(seconds=100)
        for n in range(64):
            expires = None if n in keep else clock.now() + timedelta(seconds=5)
            if n == 38:
                expires = later  # held, expires after the collection
            await store.append_turns(SID, [_turn(clock, n)], expires_at=expires)
        clock.advance(timedelta(seconds=10))
        now = clock.now()
        archive, expiry = store._turns[SID], store._turn_expiry[SID]
        for index in [i for i, exp in expiry.items() if not _live(exp, now)]:
            del archive[index], expiry[index]  # as the store's collection does
        assert sorted(archive) == keep
        clock.advance(timedelta(seconds=100))  # turn 38 expires, still held
        assert [t.index for t in await store.get_turns(SID)] == [0, 37, 60]
        assert [t.index for t in await store.get_turns(SID, 1, 61)] == [37, 60]
        assert [t.index for t in await store.tail_turns(SID, 1)] == [60]
        assert [t.index for t in await store.tail_turns(SID, 2)] == [37, 60]
        assert [t.index for t in await store.tail_turns(SID, 9)] == [0, 37, 60]

    asyncio.run(scenario())
