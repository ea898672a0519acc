"""The turn that opened an agent loop is read from the archive once per loop, not per call.

Since fdc4996, a window inside an agent loop longer than the hot window opens with the
loop's request, read from the archive (one range read of up to ``OPENING_REACH`` turns).
Every ``context()`` of the loop repeated the read. Now what the read found, and what the
later calls' hot windows show, is kept (``ContextCache.openings``) while the session's
summary records are those read with it: a redaction in any process rewrites them, so the
next call reads the archive again and never shows the redacted text.

Here: the read count (all pairings at hand: memory+memory, memory+sqlite, redis+redis with
the services, ``TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh``),
round trips, windows identical to the old read-every-call path (a reference copy of
fdc4996's ``Session._opening`` on generated programs of turns, redactions and passes),
redaction and re-creation through another MemoryService over the same stores (the same
SQLite file and Redis server, each with its own clients and, for SQLite, its own memory
hot tier), and the memo's bounds.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.context.test_context_round_trips import EXPECTED
from tests.context.test_s15_loop_opening import REQUEST, _add_pair, _check_anthropic
from tests.integration.conftest import open_composed_pairing
from tiermem.clock import FakeClock
from tiermem.context.models import ContextWindow
from tiermem.models import Message, TextBlock, ToolResultBlock, ToolUseBlock, Turn
from tiermem.models.turns import REDACTED_TEXT
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.session_context import (
    OPENING_REACH,
    UNKNOWN,
    KnownOpenings,
    SummarySections,
    latest_opening,
    opening_message,
)
from tiermem.store.contract import DurableStore, HotStore
from tiermem.summaries import SummaryPolicy
from tiermem.testing.round_trips import RoundTrips
from tiermem.tiers.config import SessionTierConfig, WritePolicy
from tiermem.tiers.tiered import SessionView

SECRET = "card 4111-1111-1111-1111"
PAIRINGS = ["memory+memory", "memory+sqlite", "redis+redis"]


def _service(
    hot: HotStore,
    durable: DurableStore,
    clock: FakeClock,
    *,
    summaries: bool = False,
    config: SessionTierConfig | None = None,
) -> MemoryService:
    return MemoryService(
        hot,
        durable,
        clock=clock,
        config=config,
        summary_policy=SummaryPolicy(min_preservation=0.0, recover_preservation=0.0),
        auto_summarize=summaries,
        auto_detect=False,
    )


class _CountingReads:
    """Counts the durable tier's range reads of turns (the opening's read is one)."""

    def __init__(self, durable: DurableStore) -> None:
        self.calls = 0
        inner = durable.get_turns

        async def get_turns(*args: Any, **kwargs: Any) -> list[Turn]:
            self.calls += 1
            return await inner(*args, **kwargs)

        durable.get_turns = get_turns  # type: ignore[method-assign]


# -- the read happens once per loop ---------------------------------------------------


@pytest.mark.parametrize("pairing_name", PAIRINGS)
async def test_a_loop_reads_its_request_from_the_archive_once(
    pairing_name: str, tmp_path: Path
) -> None:
    """40 tool pairs after the request, a window after each: the request leaves the hot
    window at pair 10 and every later window opens with it. It was read 30 times."""
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing.hot, pairing.durable, pairing.clock)
        session = await memory.session(user_id="u-once")
        await session.add_turn("user", REQUEST)
        reads = _CountingReads(pairing.durable)
        windows = []
        for i in range(40):
            await _add_pair(session, i)
            windows.append(await session.context(budget=8_000))
        await memory.aclose()
    assert reads.calls == 1
    for window in windows:
        _check_anthropic(window)
        assert REQUEST in str(window.messages[0].content)
    opening = next(i for i in windows[-1].items if i.kind == "turn")
    assert opening.provenance.tier == "archive"
    assert opening.provenance.turn_indexes == (0,)


async def _trips(session: Session) -> int:
    await session.context()  # warm
    trips = RoundTrips()
    with trips.counting():
        await session.context()
    return trips.total


@pytest.mark.parametrize("pairing_name", [p for p in PAIRINGS if p in EXPECTED])
async def test_later_calls_of_a_loop_cost_the_round_trips_of_a_plain_call(
    pairing_name: str, tmp_path: Path
) -> None:
    """memory+sqlite 4 -> 3, redis+redis 2 -> 1 per call once the loop's request is known;
    also once the user's next request starts a window inside the loop before it."""
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing.hot, pairing.durable, pairing.clock)
        chat = await memory.session(user_id="u-trips-chat")
        for i in range(25):
            await chat.add_turn("user" if i % 2 == 0 else "assistant", f"Turn {i}.")
        plain = await _trips(chat)
        session = await memory.session(user_id="u-trips-loop")
        await session.add_turn("user", REQUEST)
        for i in range(15):
            await _add_pair(session, i)
        loop = await _trips(session)
        await _add_pair(session, 15)
        moved = await _trips(session)
        await session.add_turn("user", "Now do shop 8 too.")
        after = await _trips(session)
        window = await session.context()
        await memory.aclose()
    assert plain <= EXPECTED[pairing_name]
    assert (loop, moved, after) == (plain, plain, plain)
    _check_anthropic(window)
    assert REQUEST in str(window.messages[0].content)
    assert "Now do shop 8 too." in str(window.messages[-1].content)


# -- the same windows as reading every call ---------------------------------------------


async def _reference_opening(
    self: Session, view: SessionView, built: SummarySections, first_shown: int
) -> Turn | Message:
    """fdc4996's Session._opening (the archive read on every call), for comparison."""
    hot = view.turns
    found = latest_opening(hot, first_shown)
    oldest = hot[0].index if hot else first_shown
    if found is None and oldest > 0:
        start = max(0, oldest - OPENING_REACH)
        found = latest_opening(await self._tiers.get_turns(self.id, start, oldest), oldest)
    return opening_message(found, first_shown)


async def _both(
    session: Session, monkeypatch: pytest.MonkeyPatch, budget: int
) -> tuple[ContextWindow, ContextWindow]:
    new = await session.context(budget=budget)
    with monkeypatch.context() as patch:
        patch.setattr(Session, "_opening", _reference_opening)
        old = await session.context(budget=budget)
    return new, old


async def _random_step(
    rng: random.Random, session: Session, other: Session, memory: MemoryService, step: int
) -> None:
    op = rng.choices(
        ["pair", "big", "pinned", "user", "assistant", "redact", "redact-other", "drain"],
        weights=[40, 6, 3, 6, 3, 3, 3, 4],
    )[0]
    if op in ("pair", "big", "pinned"):
        out = f"rows {step}" * (400 if op == "big" else 1)
        call = ToolUseBlock(tool_use_id=f"c{step}", name="query", input={"step": step})
        await session.add_turn("assistant", [TextBlock(text=f"Step {step}."), call])
        result = ToolResultBlock(tool_use_id=f"c{step}", content=(TextBlock(text=out),))
        await session.add_turn("user", [result], pinned=op == "pinned")
    elif op == "user":
        await session.add_turn("user", f"Request {step}: {SECRET}, then migrate shop {step}.")
    elif op == "assistant":
        await session.add_turn("assistant", f"Done with step {step}.")
    elif op in ("redact", "redact-other"):
        count = (await session.view()).next_index
        if count:
            # Mostly the user's requests (the opening), sometimes any turn.
            requests = [t.index for t in await session.get_turns(0, count) if t.role == "user"]
            index = (
                rng.choice(requests) if requests and rng.random() < 0.7 else rng.randrange(count)
            )
            await (session if op == "redact" else other).redact_turn(index)
    else:
        await memory.drain()


@dataclass(frozen=True)
class _Variant:
    summaries: bool
    write_behind: bool
    pairing: str = "memory+memory"


PROGRAMS = [
    *(
        pytest.param(seed, variant, id=f"{name}-{seed}")
        for name, variant in (
            ("plain", _Variant(False, False)),
            ("summaries", _Variant(True, False)),
            ("write-behind", _Variant(False, True)),
        )
        for seed in range(12)
    ),
    # Turns decoded from a store (the kept copy is the hot tier's, the read the archive's).
    *(
        pytest.param(seed, _Variant(seed == 1, False, pairing), id=f"{pairing}-{seed}")
        for pairing in ("memory+sqlite", "redis+redis")
        for seed in range(2)
    ),
]


@pytest.mark.parametrize(("seed", "variant"), PROGRAMS)
async def test_windows_are_those_of_reading_every_call(
    seed: int, variant: _Variant, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Generated programs (120 steps: tool pairs, large outputs, pinned results, new
    requests, answers, redactions here and through another service, summary passes):
    after each step the window equals the one the read-every-call path builds."""
    rng = random.Random(seed)
    config = SessionTierConfig(
        window=rng.choice([6, 12, 20]),
        write_policy=WritePolicy.WRITE_BEHIND
        if variant.write_behind
        else WritePolicy.WRITE_THROUGH,
        write_behind_every=3,
    )
    async with open_composed_pairing(variant.pairing, tmp_path) as pairing:
        memory = _service(
            pairing.hot, pairing.durable, pairing.clock, summaries=variant.summaries, config=config
        )
        other = _service(pairing.hot, pairing.durable, pairing.clock, config=config)
        session = await memory.session(user_id="u-equiv")
        await session.add_turn("user", f"{REQUEST} {SECRET}")
        other_session = await other.session(session.id, user_id="u-equiv")
        compared = opened = 0
        for step in range(120):
            await _random_step(rng, session, other_session, memory, step)
            pairing.clock.advance(timedelta(seconds=1))
            budget = rng.choice([600, 3_000, 8_000])
            # A summary pass landing between the two calls would change the window.
            await memory.drain()
            new, old = await _both(session, monkeypatch, budget)
            assert new.messages == old.messages, (seed, step)
            assert new.items == old.items, (seed, step)
            compared += 1
            opened += any(i.provenance.tier == "archive" for i in new.items)
        hits = memory.context_cache.openings.hits
        await memory.aclose()
        await other.aclose()
    assert compared == 120
    assert opened > 0, "no window opened with an archived turn: the case is not exercised"
    assert hits > 0, "nothing was reused: the memo is not exercised"


# -- redaction and re-creation in another process ---------------------------------------


@dataclass
class _Process:
    memory: MemoryService
    close: list[Any]


@asynccontextmanager
async def _two_processes(name: str, tmp_path: Path) -> AsyncIterator[tuple[FakeClock, Any, Any]]:
    """Two services as two processes would hold them: memory+memory shares the stores
    (one in-process deployment); memory+sqlite shares the file, each with its own memory
    hot tier and SQLite connection; redis+redis shares the server and prefix, each with
    its own client."""
    clock = FakeClock()
    if name == "memory+memory":
        from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

        hot, durable = MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock)
        stores = [(hot, durable), (hot, durable)]
    elif name == "memory+sqlite":
        from tiermem.store.backends.memory import MemoryHotStore
        from tiermem.store.backends.sqlite import SQLiteDurableStore

        path = tmp_path / "shared.db"
        stores = [
            (MemoryHotStore(clock=clock), SQLiteDurableStore(path, clock=clock)) for _ in "ab"
        ]
    else:
        from tests.backends.redis import fresh_prefix, open_redis_stores
        from tests.conftest import server_url

        prefix = fresh_prefix()
        stores = [open_redis_stores(server_url("redis"), clock, prefix=prefix) for _ in "ab"]
    a = _service(stores[0][0], stores[0][1], clock)
    b = _service(stores[1][0], stores[1][1], clock)
    try:
        yield clock, a, b
    finally:
        await a.aclose()
        await b.aclose()
        closed: set[int] = set()
        for hot, durable in stores:
            for store in (hot, durable):
                if id(store) not in closed:
                    closed.add(id(store))
                    await store.aclose()


async def _loop(session: Session, pairs: int = 30) -> None:
    await session.add_turn("user", f"{REQUEST} Charge it to {SECRET}.")
    for i in range(pairs):
        await _add_pair(session, i)


@pytest.mark.parametrize("pairing_name", PAIRINGS)
async def test_a_redaction_in_another_process_shows_at_the_next_call(
    pairing_name: str, tmp_path: Path
) -> None:
    async with _two_processes(pairing_name, tmp_path) as (clock, a, b):
        session = await a.session(user_id="u-redact")
        await _loop(session)
        before = [await session.context(budget=8_000) for _ in range(3)]
        assert a.context_cache.openings.hits >= 2  # kept from the first call
        assert all(SECRET in str(w.messages[0].content) for w in before)
        elsewhere = await b.session(session.id, user_id="u-redact")
        clock.advance(timedelta(seconds=5))
        await elsewhere.redact_turn(0)
        window = await session.context(budget=8_000)
        again = await session.context(budget=8_000)
    for shown in (window, again):
        assert [m.role for m in shown.messages[:2]] == ["user", "assistant"]
        assert SECRET not in str(shown.messages), "the redacted request was shown"
        first = shown.messages[0]
        assert first.role == "user"
        assert REDACTED_TEXT in str(first.content)


@pytest.mark.parametrize("pairing_name", PAIRINGS)
async def test_a_redacted_tool_result_in_another_process_is_seen(
    pairing_name: str, tmp_path: Path
) -> None:
    """A redacted tool result has the user's role and a text: it may open the window now
    (as the read-every-call path does), so what was kept must not hide it."""
    async with _two_processes(pairing_name, tmp_path) as (clock, a, b):
        session = await a.session(user_id="u-redact-result")
        await _loop(session)
        await session.context(budget=8_000)
        await session.context(budget=8_000)
        elsewhere = await b.session(session.id, user_id="u-redact-result")
        clock.advance(timedelta(seconds=5))
        await elsewhere.redact_turn(6)  # the result of call 2, before the hot window
        window = await session.context(budget=8_000)
    opening = next(i for i in window.items if i.kind == "turn")
    assert opening.provenance.turn_indexes == (6,)
    assert REDACTED_TEXT in str(window.messages[0].content)


@pytest.mark.parametrize("pairing_name", ["memory+memory", "redis+redis"])
async def test_a_session_cleared_and_created_again_elsewhere_shows_its_own_request(
    pairing_name: str, tmp_path: Path
) -> None:
    """With a shared hot tier (with a hot tier of its own, a process keeps showing the
    old session's hot turns after another process cleared it, with or without the
    memo: the old code mixed them with the new session's archived request)."""
    async with _two_processes(pairing_name, tmp_path) as (clock, a, b):
        session = await a.session(user_id="u-again")
        await _loop(session)
        await session.context(budget=8_000)
        await session.context(budget=8_000)
        elsewhere = await b.session(session.id, user_id="u-again")
        await elsewhere.clear()
        clock.advance(timedelta(seconds=5))
        anew = await b.session(session.id, user_id="u-again")
        await anew.add_turn("user", "Rename the invoices of shop 9.")
        for i in range(30):
            await _add_pair(anew, i)
        window = await (await a.session(session.id, user_id="u-again")).context(budget=8_000)
    assert "Rename the invoices of shop 9." in str(window.messages[0].content)
    assert SECRET not in str(window.messages)


async def test_a_redaction_through_the_same_service_shows_at_the_next_call(tmp_path: Path) -> None:
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing.hot, pairing.durable, pairing.clock)
        session = await memory.session(user_id="u-redact-here")
        await _loop(session)
        await session.context(budget=8_000)
        await session.redact_turn(0)
        window = await session.context(budget=8_000)
        await memory.aclose()
    assert SECRET not in str(window.messages)
    assert REDACTED_TEXT in str(window.messages[0].content)


# -- the memo itself ---------------------------------------------------------------------

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _turn(index: int, role: str = "user", text: str = "go", at: datetime = _T0) -> Turn:
    if role == "result":
        block: Any = ToolResultBlock(tool_use_id=f"c{index}", content=(TextBlock(text="ok"),))
        return Turn(index=index, role="user", content=(block,), timestamp=at)
    return Turn(index=index, role=role, content=(TextBlock(text=text),), timestamp=at)


def _loop_turns(start: int, end: int) -> list[Turn]:
    return [_turn(i, "assistant" if i % 2 else "result") for i in range(start, end)]


def _sections() -> SummarySections:
    from tiermem.session_context import summary_sections
    from tiermem.summaries.jobs import SessionSummaries
    from tiermem.summaries.rolling import Compression

    compression = Compression(keep_hot=6, trigger_tokens=1_000, every_turns=10)
    return summary_sections("s", SessionSummaries(session_id="s", compression=compression))


def _archive_answer(turns: Sequence[Turn], oldest: int) -> Turn | None:
    start = max(0, oldest - OPENING_REACH)
    return latest_opening([t for t in turns if start <= t.index < oldest], oldest)


def test_what_is_kept_answers_as_the_archive_would() -> None:
    """Generated logs and hot windows moving forward (by steps and jumps, some holding an
    older pinned turn, some calls answered by the hot window without asking): whenever
    what is kept answers, it is what the archive read answers."""
    rng = random.Random(7)
    answered = 0
    for _ in range(400):
        n = rng.randrange(5, 400)
        log = [
            _turn(i, "user", f"req {i}") if rng.random() < 0.04 else _loop_turns(i, i + 1)[0]
            for i in range(n)
        ]
        known = KnownOpenings()
        records = _sections()
        start, window = rng.randrange(0, 5), rng.choice([4, 20])
        while start < n:
            hot = log[start : start + window]
            if start > 12 and rng.random() < 0.2:  # a pinned turn from before: a gap
                hot = [log[rng.randrange(start - 12, start - 1)], *hot]
            oldest, next_index = hot[0].index, hot[-1].index + 1
            read = None
            if oldest > 0 and rng.random() < 0.7:
                held = known.before("s", records, _T0, next_index, oldest, _T0)
                truth = _archive_answer(log, oldest)
                if held is UNKNOWN:
                    read = (max(0, oldest - OPENING_REACH), oldest, truth)
                else:
                    answered += 1
                    assert held == truth, (oldest, held, truth)
            known.learn("s", records, _T0, next_index, hot, _T0, None, read=read)
            start += rng.choice([1, 2, 2, 2, 3, window + 5])
        assert known.size_bytes == sum(len(t.model_dump_json()) for t in _held_turns(known))
    assert answered > 5_000


def _held_turns(known: KnownOpenings) -> list[Turn]:
    return [t for entry in known._known.values() for t in entry.turns]


def test_other_records_another_creation_or_a_shorter_log_are_not_trusted() -> None:
    known = KnownOpenings()
    records = _sections()
    hot = _loop_turns(30, 50)
    known.learn("s", records, _T0, 50, hot, _T0, None, read=(0, 30, _turn(0)))
    assert known.before("s", records, _T0, 50, 30, _T0) == _turn(0)
    assert known.before("s", records, _T0, 52, 32, _T0) == _turn(0)
    assert known.before("s", _sections(), _T0, 52, 32, _T0) is UNKNOWN  # records changed
    known.learn("s", records, _T0, 50, hot, _T0, None, read=(0, 30, _turn(0)))
    later = _T0 + timedelta(seconds=1)
    assert known.before("s", records, later, 50, 30, _T0) is UNKNOWN  # created again
    known.learn("s", records, _T0, 50, hot, _T0, None, read=(0, 30, _turn(0)))
    assert known.before("s", records, _T0, 40, 30, _T0) is UNKNOWN  # fewer turns now
    assert len(known) == 0


def test_a_turn_is_dropped_when_the_archive_may_have_dropped_it() -> None:
    known = KnownOpenings()
    records = _sections()
    day = timedelta(hours=24)
    known.learn("s", records, _T0, 50, _loop_turns(30, 50), _T0, day, read=(0, 30, _turn(0)))
    assert known.before("s", records, _T0, 50, 30, _T0 + day - timedelta(seconds=1)) == _turn(0)
    assert known.before("s", records, _T0, 50, 30, _T0 + day) is UNKNOWN
    # A turn stamped in the future (an import) counts from when it was first seen.
    future = _turn(0, at=_T0 + 10 * day)
    known.learn("s", records, _T0, 50, _loop_turns(30, 50), _T0, day, read=(0, 30, future))
    assert known.before("s", records, _T0, 50, 30, _T0 + day) is UNKNOWN


def test_bounded_by_sessions_and_bytes_and_shrinks() -> None:
    records = _sections()
    known = KnownOpenings(sessions=3)
    for s in range(5):
        known.learn(
            f"s{s}", records, _T0, 50, _loop_turns(30, 50), _T0, None, read=(0, 30, _turn(0))
        )
    assert len(known) == 3
    assert known.before("s0", records, _T0, 50, 30, _T0) is UNKNOWN  # least recently used
    assert known.before("s4", records, _T0, 50, 30, _T0) == _turn(0)
    size = len(_turn(0).model_dump_json())
    small = KnownOpenings(max_bytes=2 * size)
    for s in range(3):
        small.learn(
            f"s{s}", records, _T0, 50, _loop_turns(30, 50), _T0, None, read=(0, 30, _turn(0))
        )
    assert len(small) == 2
    assert small.size_bytes == 2 * size
    big = _turn(0, text="x" * 3 * size)
    small.learn("s9", records, _T0, 50, _loop_turns(30, 50), _T0, None, read=(0, 30, big))
    assert small.before("s9", records, _T0, 50, 30, _T0) is UNKNOWN  # larger than the bound
    assert small.size_bytes <= 2 * size
    assert small.shrink() == 2
    assert (len(small), small.size_bytes) == (0, 0)


async def test_the_context_cache_shrink_and_clear_empty_it(tmp_path: Path) -> None:
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing.hot, pairing.durable, pairing.clock)
        session = await memory.session(user_id="u-shrink")
        await _loop(session)
        await session.context()
        assert len(memory.context_cache.openings) == 1
        memory.context_cache.shrink()
        assert len(memory.context_cache.openings) == 0
        await session.context()
        await session.clear()
        assert len(memory.context_cache.openings) == 0
        await memory.aclose()
