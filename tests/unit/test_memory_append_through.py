"""The in-memory pair's one-step append (``MemoryHotStore.append_through``): the tiered
write-through path of memory+memory uses it, so the turns are checked once and both tiers
change together. The same behaviour as the Redis pair's script (tests/integration/
test_redis_specific.py), and the same rejections as the stores' own ``append_turns``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from tiermem.errors import ConflictError, ValidationError
from tiermem.models import ActiveEntity, Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import (
    ENTITIES_RECORD,
    MAX_TURN_BYTES,
    EntityChange,
    HotAppendResult,
)
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn


class _Pair:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.hot = MemoryHotStore(clock=self.clock)
        self.durable = MemoryDurableStore(clock=self.clock)

    def later(self, seconds: int) -> datetime:
        return self.clock.now() + timedelta(seconds=seconds)

    async def through(
        self, sid: str, *texts: str, **options: Any
    ) -> tuple[list[Turn], HotAppendResult | None]:
        return await self.hot.append_through(
            self.durable,
            sid,
            [text_turn(text) for text in texts],
            window=3,
            hot_expires_at=self.later(60),
            durable_expires_at=self.later(3600),
            **options,
        )

    def entity(self, value: str) -> ActiveEntity:
        return ActiveEntity(kind="series", value=value, turn_index=0, updated_at=self.clock.now())


async def test_both_tiers_take_the_turns_and_the_entity_change() -> None:
    pair = _Pair()
    change = EntityChange(upsert={"series": pair.entity("Berserk")})
    stored, hot = await pair.through("s", "a", "b", idempotency_key="k-1", entities=change)
    assert [t.index for t in stored] == [0, 1]
    assert hot is not None
    assert (hot.version, hot.next_index, hot.turns) == (1, 2, tuple(stored))
    await pair.through("s", "c", "d")
    assert [t.text for t in await pair.durable.get_turns("s")] == ["a", "b", "c", "d"]
    snap = await pair.hot.load("s")
    assert snap is not None
    assert [t.text for t in snap.turns] == ["b", "c", "d"]  # window 3
    assert (snap.version, snap.next_index, snap.expires_at) == (2, 4, pair.later(60))
    assert snap.entities == {"series": pair.entity("Berserk")}
    record = await pair.durable.get_record("s", ENTITIES_RECORD)
    assert record is not None
    assert record.data == {"series": pair.entity("Berserk").model_dump(mode="json")}
    pair.clock.advance(3599)
    assert await pair.durable.next_index("s") == 4  # the durable lifetime was written too
    pair.clock.advance(1)
    assert await pair.durable.get_turns("s") == []


async def test_a_retry_is_answered_from_the_archive_and_skips_the_hot_tier() -> None:
    pair = _Pair()
    first, _ = await pair.through("s", "a", idempotency_key="k-1")
    await pair.through("s", "b")
    again, hot = await pair.through("s", "a-again", idempotency_key="k-1")
    assert (again, hot) == (first, None)
    snap = await pair.hot.load("s")
    assert snap is not None
    assert [t.text for t in snap.turns] == ["a", "b"]
    assert snap.version == 2


async def test_a_hot_session_that_missed_a_write_is_left_to_the_caller() -> None:
    pair = _Pair()
    await pair.through("s", "a")
    await pair.durable.append_turns("s", [text_turn("durable only")])
    stored, hot = await pair.through("s", "b")
    assert hot is None
    assert [t.index for t in stored] == [2]
    snap = await pair.hot.load("s")
    assert snap is not None
    assert (snap.next_index, snap.version) == (1, 1)


async def test_an_absent_hot_session_starts_at_the_archive_index() -> None:
    pair = _Pair()
    await pair.durable.append_turns("s", [text_turn("a"), text_turn("b")])
    stored, hot = await pair.through("s", "c")
    assert hot is not None
    assert (hot.version, hot.next_index) == (1, 3)  # version 1: the caller rebuilds it
    assert [t.index for t in stored] == [2]


async def test_a_wrong_first_index_writes_nothing() -> None:
    pair = _Pair()
    await pair.through("s", "a")
    with pytest.raises(ConflictError) as info:
        await pair.through("s", "b", first_index=5, entities=EntityChange(remove=("x",)))
    assert info.value.actual == 1
    assert await pair.durable.next_index("s") == 1
    assert await pair.durable.get_record("s", ENTITIES_RECORD) is None
    snap = await pair.hot.load("s")
    assert snap is not None
    assert snap.version == 1


async def test_an_oversized_turn_writes_nothing_in_either_tier() -> None:
    pair = _Pair()
    await pair.through("s", "a")
    with pytest.raises(ValidationError, match="bytes serialized"):
        await pair.through("s", "ok", "x" * MAX_TURN_BYTES)
    assert await pair.durable.next_index("s") == 1
    snap = await pair.hot.load("s")
    assert snap is not None
    assert (snap.version, snap.next_index) == (1, 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"session_id": "bad\nid"}, "session_id contains the control character"),
        ({"turns": []}, "needs at least one turn"),
        ({"turns": ["hello"]}, "takes NewTurn objects"),
        ({"window": 0}, "window must be at least 1"),
        ({"hot_expires_at": datetime(2030, 1, 1)}, "hot_expires_at has no timezone"),
        ({"durable_expires_at": datetime(2030, 1, 1)}, "durable_expires_at has no timezone"),
        ({"idempotency_key": ""}, "idempotency_key must not be empty"),
        ({"entities": {"series": "Berserk"}}, "entities takes an EntityChange"),
    ],
)
async def test_a_direct_callers_bad_input_is_rejected_before_any_write(
    change: dict[str, Any], message: str
) -> None:
    pair = _Pair()
    arguments: dict[str, Any] = {
        "session_id": "s",
        "turns": [text_turn("a")],
        "window": 3,
        "hot_expires_at": pair.later(60),
        "durable_expires_at": None,
        **change,
    }
    with pytest.raises(ValidationError, match=message):
        await pair.hot.append_through(pair.durable, **arguments)
    assert await pair.durable.next_index("s") == 0
    assert await pair.hot.load("s") is None


class _OwnHot(MemoryHotStore):
    """A subclass (a test's fault injection, say) whose append_turns the path would skip."""


class _OwnDurable(MemoryDurableStore):
    pass


async def test_only_the_plain_memory_pair_appends_through() -> None:
    pair = _Pair()
    assert pair.hot.can_append_through(pair.durable)
    assert not pair.hot.can_append_through(_OwnDurable())
    assert not _OwnHot().can_append_through(pair.durable)
    with pytest.raises(ValidationError, match="needs a MemoryDurableStore"):
        await pair.hot.append_through(
            _OwnDurable(),
            "s",
            [text_turn("a")],
            window=3,
            hot_expires_at=pair.later(60),
            durable_expires_at=None,
        )


async def test_the_service_rebuilds_a_hot_session_that_was_lost() -> None:
    clock = FakeClock()
    hot = MemoryHotStore(clock=clock)
    memory = MemoryService(hot, MemoryDurableStore(clock=clock), clock=clock)
    try:
        session = await memory.session(user_id="u-1")
        for i in range(3):
            await session.add_turn("user", f"turn {i}")
        await hot.delete(session.id)  # the hot tier loses the session (an eviction, say)
        await session.add_turn("user", "turn 3")
        snap = await hot.load(session.id)
        assert snap is not None
        assert snap.metadata is not None  # rebuilt whole, not a half-built session
        assert [t.text for t in snap.turns] == [f"turn {i}" for i in range(4)]
        assert [t.text for t in await session.history()] == [f"turn {i}" for i in range(4)]
    finally:
        await memory.aclose()
