"""Progressive roll-up over four months of daily sessions on a fake clock: 7 days kept
individually, then weeks, then months; the user's history stays within 800 tokens; a
superseded budget stays superseded; nothing is deleted; a repeat writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import ValidationError
from tiermem.models import MemoryRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries.rollup import RollupPolicy

START = datetime(2030, 1, 1, 9, tzinfo=UTC)
DAYS = 120
CHANGE_DAY = 60


def budget(day: int) -> str:
    return "¥5,000" if day < CHANGE_DAY else "¥8,000"


async def daily_sessions(memory: MemoryService, clock: FakeClock, days: int) -> list[int]:
    """One short session a day (closed: handoff, then roll-up); the history's size after
    each."""
    sizes = []
    for day in range(days):
        session = await memory.session(f"s-day-{day}", user_id="u-roll")
        await session.add_turn(
            "user", f"I want volume {day % 40 + 1} of Vagabond. My budget is {budget(day)}."
        )
        await session.add_turn("assistant", f"Volume {day % 40 + 1} is ¥990 and in stock.")
        await session.add_turn("user", "Thanks, that was helpful!")
        await session.close()
        sizes.append((await memory.rollup.history("u-roll")).tokens)
        clock.advance(timedelta(days=1))
    return sizes


async def everything(memory: MemoryService) -> list[MemoryRecord]:
    return await memory.longterm.list(
        "u-roll", types=["interaction_summary"], include_superseded=True, limit=2000
    )


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def test_four_months_of_sessions_roll_up_within_800_tokens() -> None:
    clock = FakeClock(START)
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
    )
    try:
        sizes = await daily_sessions(memory, clock, DAYS)
        assert max(sizes) <= 800
        assert memory.handoff.failures == 0  # every roll-up after a handoff succeeded
        await memory.roll_up("u-roll")  # a day has passed since the last session
        now = clock.now()
        records = await everything(memory)
        live = [r for r in records if r.invalid_from is None or r.invalid_from > now]
        individual = [r for r in live if "rollup" not in r.metadata]
        weeks = [r for r in live if r.metadata.get("rollup") == "week"]
        months = [r for r in live if r.metadata.get("rollup") == "month"]
        # Individual sessions: the last 7 days only.
        assert individual
        for record in individual:
            ended = datetime.fromisoformat(str(record.metadata["session_ended"]))
            assert now - ended < timedelta(days=7)
        assert weeks
        assert months
        # Weeks between 7 and 30 days old; months older.
        for record in weeks:
            start = datetime.fromisoformat(str(record.metadata["period_start"]))
            assert now - (start + timedelta(days=7)) < timedelta(days=30)
        history = await memory.rollup.history("u-roll")
        assert history.tokens <= 800
        assert history.weeks
        assert history.months
        assert history.sessions
        # The budget changed on day 60: no live summary presents ¥5,000 as current.
        for record in live:
            assert "5,000" not in record.content, record.content
        assert any("¥8,000" in r.content for r in weeks + months)
        # Nothing was deleted: rolled-up sessions are superseded, with a pointer.
        rolled = [r for r in records if "rollup" not in r.metadata and r not in individual]
        assert rolled
        for record in rolled:
            assert record.invalid_from is not None
            assert record.invalid_from <= now
            assert "superseded_by" in record.metadata
        # A roll-up with nothing new writes nothing.
        assert await memory.roll_up("u-roll") == 0
    finally:
        await memory.aclose()


async def test_too_many_recent_sessions_roll_into_their_week_early() -> None:
    clock = FakeClock(START)
    policy = RollupPolicy(individual_tokens=120)
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
        rollup_policy=policy,
    )
    try:
        for n in range(12):  # twelve sessions in one afternoon
            session = await memory.session(f"s-busy-{n}", user_id="u-roll")
            await session.add_turn("user", f"Is volume {n + 1} of Berserk in stock? Budget ¥3,000.")
            await session.close()
            clock.advance(timedelta(minutes=10))
        history = await memory.rollup.history("u-roll")
        assert history.tokens <= policy.total_tokens
        assert history.weeks  # the overflow went into this week's digest
        live = [
            r
            for r in await everything(memory)
            if "rollup" not in r.metadata and (r.invalid_from is None)
        ]
        assert sum(memory.tokens.count(r.content) for r in live) <= 120
        assert len(live) < 12
    finally:
        await memory.aclose()


def test_rollup_policy_is_checked() -> None:
    with pytest.raises(ValidationError):
        RollupPolicy(individual_days=30, monthly_after_days=7)
    with pytest.raises(ValidationError):
        RollupPolicy(weekly_tokens=5)
    assert RollupPolicy().total_tokens == 800
