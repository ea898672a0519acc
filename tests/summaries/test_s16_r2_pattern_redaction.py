"""Review of session 16 (R2): a redaction takes away the observed patterns counted from the
redacted session itself, as it does the roll-up digests built from it, not only through
the roll-up it runs afterwards. When that roll-up failed (logged and counted, the redaction
still returns) or the deployment turned observed patterns off since they were written,
"Often asks about Berserk (3 sessions ...)" stayed recallable, counted from the redacted
turn. The first two fail on 5d94d0d (the redaction forgot only summaries); the third, a
redacted turn's intent counted again by the rebuilt summary, too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.clock import FakeClock
from tiermem.composition import catalogue_engines
from tiermem.errors import BackendError
from tiermem.models import MemoryRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries.patterns import PATTERN_KEY
from tiermem.summaries.rollup import RollupPolicy

START = datetime(2030, 1, 1, 9, tzinfo=UTC)
USER = "u-r2"
BERSERK = [
    "Do you have Berserk vol 42 in stock?",
    "Is the new volume of Berserk out yet?",
    "What does the Berserk deluxe edition cost?",
]


def _service(
    hot: MemoryHotStore, durable: MemoryDurableStore, clock: FakeClock, policy: RollupPolicy
) -> MemoryService:
    return MemoryService(
        hot,
        durable,
        clock=clock,
        auto_detect=False,
        rollup_policy=policy,
        **dict(catalogue_engines({"Berserk": "Berserk"})),
    )


class World:
    def __init__(self) -> None:
        self.clock = FakeClock(START)
        self.hot = MemoryHotStore(clock=self.clock)
        self.durable = MemoryDurableStore(clock=self.clock)
        self.memory = _service(self.hot, self.durable, self.clock, RollupPolicy())

    async def three_sessions(self) -> list[str]:
        sessions = []
        for at, line in enumerate(BERSERK):
            session = await self.memory.session(f"s-{at}", user_id=USER)
            await session.add_turn("user", line)
            await session.add_turn("user", "Thanks!")
            await session.close()
            await self.memory.drain()
            if at < len(BERSERK) - 1:  # the last one's turns stay in the archive to redact
                self.clock.advance(timedelta(days=1))
            sessions.append(f"s-{at}")
        assert "3 sessions" in (await self.pattern_texts(self.memory))[0]
        return sessions

    async def pattern_texts(self, memory: MemoryService) -> list[str]:
        records: list[MemoryRecord] = await memory.longterm.list(
            USER, types=["behavioral_pattern"], include_superseded=True, limit=100
        )
        return [r.content for r in records if PATTERN_KEY in r.metadata]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    made = World()
    try:
        yield made
    finally:
        await made.memory.aclose()


async def test_a_redaction_whose_roll_up_fails_leaves_no_pattern_counted_from_it(
    world: World,
) -> None:
    sessions = await world.three_sessions()

    async def failing(user_id: str) -> int:
        raise BackendError("the durable tier is down", backend="memory")

    world.memory.handoff.after = failing
    session = await world.memory.session(sessions[2], user_id=USER)
    await session.redact_turn(0)  # the only turn of that session naming Berserk
    await world.memory.drain()
    assert world.memory.handoff.failures >= 1  # the roll-up did fail
    assert await world.pattern_texts(world.memory) == []


async def test_a_redaction_after_patterns_were_turned_off_leaves_none_counted_from_it(
    world: World,
) -> None:
    sessions = await world.three_sessions()
    off = _service(world.hot, world.durable, world.clock, RollupPolicy(patterns=None))
    try:
        session = await off.session(sessions[2], user_id=USER)
        await session.redact_turn(0)
        await off.drain()
        assert off.handoff.failures == 0
        assert await world.pattern_texts(off) == []
    finally:
        await off.aclose()


async def test_a_redacted_turns_intent_no_longer_counts(world: World) -> None:
    # Redaction drops a turn's content, entities and metadata but keeps its intent (the
    # slot stays); the summary the redaction builds again listed it among the topics, and
    # the roll-up then wrote "Recurring request: ..." counted from the redacted turn.
    for at in range(3):
        session = await world.memory.session(f"s-i{at}", user_id=USER)
        await session.add_turn("user", "Where is my parcel?", intent="order_tracking")
        await session.add_turn("assistant", "It ships tomorrow.")
        await session.add_turn("user", "Great, thanks!")
        await session.close()
        await world.memory.drain()
        if at < 2:
            world.clock.advance(timedelta(days=1))
    assert [t[:26] for t in await world.pattern_texts(world.memory)] == [
        "Recurring request: order t"
    ]
    session = await world.memory.session("s-i2", user_id=USER)
    await session.redact_turn(0)
    await world.memory.drain()
    assert world.memory.handoff.failures == 0
    assert await world.pattern_texts(world.memory) == []
    summaries = await world.memory.longterm.list(USER, types=["interaction_summary"])
    redacted = [s for s in summaries if s.provenance.session_id == "s-i2"]
    assert all("order_tracking" not in s.metadata.get("topics", []) for s in redacted)
