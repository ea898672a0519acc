"""Session 17: a plain ``add_turn`` reads the service's clock once for its write. The
turn's timestamp (the analysis' reading) is also its entities' ``updated_at`` and the
time the tiers' expiries count from, instead of two more readings moments later; a turn
added to a closed session reads the clock again after the reopen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.contract import ENTITIES_RECORD

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class TickingClock(FakeClock):
    """A clock that moves a millisecond on every reading: each reading is told apart."""

    def __init__(self) -> None:
        super().__init__(T0)
        self.readings = 0

    def now(self) -> datetime:
        self.readings += 1
        return self.advance(timedelta(milliseconds=1))


def _service(clock: FakeClock) -> MemoryService:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    service = MemoryService.from_settings(settings, clock=clock, auto_summarize=False)
    service.index_turns = service.auto_detect = False  # no background readings
    return service


async def test_a_plain_turns_entities_carry_its_timestamp() -> None:
    clock = TickingClock()
    async with _service(clock) as memory:
        session = await memory.session(user_id="u1")
        turn = await session.add_turn("user", "Do you have Berserk vol 42 in stock?")
        assert turn.entities  # the turn sets entities: the write has a change to stamp
        entities = await session.active_entities()
        assert entities
        assert {e.updated_at for e in entities.values()} == {turn.timestamp}
        record = await memory.tiers.durable.get_record(session.id, ENTITIES_RECORD)
        assert record is not None
        assert record.updated_at == turn.timestamp
        stamp = turn.timestamp.isoformat()[:-6] + "Z"
        assert {v["updated_at"] for v in record.data.values()} == {stamp}


async def test_a_plain_turn_reads_the_clock_once() -> None:
    clock = TickingClock()
    async with _service(clock) as memory:
        session = await memory.session(user_id="u1")
        await session.add_turn("user", "hello")  # the session's first write
        before = clock.readings
        await session.add_turn("user", "Do you have Berserk vol 42 in stock?")
        assert clock.readings - before == 1  # the analysis' reading, nothing more
        # The hot expiry counts from the turn's timestamp (the TTL policy's write).
        view = memory.tiers.view_now(session.id)
        assert view is not None
        last = view.turns[-1]
        metadata = view.stored_metadata
        expected = memory.tiers.hot_expiry(metadata, view.next_index, "write", None, last.timestamp)
        assert view.expires_at == expected


async def test_a_turn_after_a_close_reads_the_clock_after_the_reopen() -> None:
    clock = TickingClock()
    async with _service(clock) as memory:
        session = await memory.session(user_id="u1")
        await session.add_turn("user", "hello")
        await session.close()
        turn = await session.add_turn("user", "Do you have Berserk vol 42 in stock?")
        entities = await session.active_entities()
        # The reopen awaited a write: the entities' time is a reading taken after it.
        assert all(e.updated_at > turn.timestamp for e in entities.values())
        assert (await session.metadata()).closed_at is None
