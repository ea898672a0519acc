"""The hot load leaves out the entities and the state a reader already holds (issue #8).

Every write script keeps part markers in the session's meta hash ('ev', 'sv': the
versions at which the entities and the state hash last changed; 'c': the version of the
last write that kept them), and ``hot_load`` sends a part only when the reader's cached
marker differs. On the real test Redis: what the script sends after a plain turn, an
entity change and a state put by another store; sessions written by scripts that predate
the markers (meta without them) and writes by such scripts in between (they move 'v'
alone); a restart after expiry, a delete, a restore; and randomised sequences of every
write, by two caching stores and by a former-script writer, whose cached loads must equal
a store's uncached ones.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.backends.redis import open_redis_stores
from tests.conftest import server_url
from tiermem.models import ActiveEntity, SessionMetadata, SessionSnapshot, StateBlob
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.contract import EntityChange
from tiermem.testing import FakeClock
from tiermem.testing.backend import fresh_id, text_turn

KINDS = ["series", "topic", "place"]


class Replies:
    """The load replies a store received (wraps its snapshot cache's ``loaded``)."""

    def __init__(self, store: RedisHotStore) -> None:
        self.seen: list[Sequence[Any] | None] = []
        cache = store._snapshots
        inner = cache.loaded

        def loaded(session_id: str, cached: Any, reply: Sequence[Any] | None) -> Any:
            self.seen.append(reply)
            return inner(session_id, cached, reply)

        cache.loaded = loaded  # type: ignore[method-assign]

    def last_parts(self) -> tuple[Any, Any]:
        """(entities, state) as the last reply carried them: None when left out."""
        reply = self.seen[-1]
        assert reply is not None
        assert len(reply) > 4, reply
        return reply[8], reply[9]


@dataclass
class Stores:
    clock: FakeClock
    writer: RedisHotStore
    durable: RedisDurableStore
    reader: RedisHotStore
    plain: RedisHotStore
    raw: aioredis.Redis

    def expires(self, minutes: int = 30) -> Any:
        return self.clock.now() + timedelta(minutes=minutes)

    def meta(self, session_id: str) -> str:
        return self.writer.keys.hot_meta(session_id)

    async def check(self, session_id: str) -> SessionSnapshot | None:
        """The reader's cached load, asserted equal to an uncached one."""
        cached, uncached = await self.reader.load(session_id), await self.plain.load(session_id)
        assert cached == uncached
        return cached

    async def former_write(self, session_id: str, *, entity: str | None = None) -> None:
        """What a write by a script that predates the markers does to them: it moves 'v'
        (here with an entity change) and writes no marker."""
        if entity is not None:
            data = _entity("topic", entity, self.clock)
            await self.raw.hset(  # type: ignore[misc]
                self.writer.keys.hot_keys(session_id)[2], "topic", data.model_dump_json()
            )
        await self.raw.hincrby(self.meta(session_id), "v", 1)  # type: ignore[misc]


@pytest.fixture
async def s() -> AsyncIterator[Stores]:
    url = server_url("redis")
    clock = FakeClock()
    writer, durable = open_redis_stores(url, clock)
    prefix = writer.keys.prefix
    reader = RedisHotStore.from_url(url, clock=clock, prefix=prefix)
    plain = RedisHotStore.from_url(url, clock=clock, prefix=prefix, snapshot_cache=0)
    raw = aioredis.Redis.from_url(url)
    try:
        yield Stores(clock, writer, durable, reader, plain, raw)
    finally:
        await raw.aclose()
        await plain.aclose()
        await reader.aclose()
        await writer.aclose()
        await durable.aclose()


def _entity(kind: str, value: str, clock: FakeClock) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=0, updated_at=clock.now())


async def _session_with_parts(s: Stores) -> str:
    sid = fresh_id("marks")
    change = EntityChange(upsert={"topic": _entity("topic", "manga", s.clock)})
    await s.writer.append_through(
        s.durable,
        sid,
        [text_turn("hello")],
        window=10,
        hot_expires_at=s.expires(),
        durable_expires_at=None,
        entities=change,
    )
    await s.writer.put_state(sid, "task", {"step": 1}, expires_at=s.expires())
    return sid


async def _plain_turn(s: Stores, sid: str, text: str = "more") -> None:
    await s.writer.append_through(
        s.durable, sid, [text_turn(text)], window=10, hot_expires_at=s.expires(),
        durable_expires_at=None,
    )  # fmt: skip


async def test_a_read_after_another_stores_plain_turn_gets_neither_part(s: Stores) -> None:
    sid = await _session_with_parts(s)
    replies = Replies(s.reader)
    first = await s.check(sid)
    assert first is not None
    assert first.entities
    assert first.state
    assert all(part is not None for part in replies.last_parts())  # nothing cached yet
    for i in range(3):
        await _plain_turn(s, sid, f"turn {i}")
        snap = await s.check(sid)
        assert replies.last_parts() == (None, None)
        assert snap is not None
        assert snap.entities == first.entities
        assert snap.state == first.state


async def test_a_read_after_an_entity_change_or_a_state_put_gets_that_part(s: Stores) -> None:
    sid = await _session_with_parts(s)
    replies = Replies(s.reader)
    await s.check(sid)
    await s.writer.append_through(
        s.durable, sid, [text_turn("x")], window=10, hot_expires_at=s.expires(),
        durable_expires_at=None,
        entities=EntityChange(upsert={"series": _entity("series", "One Piece", s.clock)}),
    )  # fmt: skip
    snap = await s.check(sid)
    entities, state = replies.last_parts()
    assert entities is not None
    assert state is None
    assert snap is not None
    assert set(snap.entities) == {"topic", "series"}

    await s.writer.put_state(sid, "task", {"step": 2}, expires_at=s.expires())
    snap = await s.check(sid)
    entities, state = replies.last_parts()
    assert entities is None
    assert state is not None
    assert snap is not None
    assert snap.state["task"].data == {"step": 2}

    await s.writer.update_entities(sid, {}, ["topic"], expires_at=s.expires())
    snap = await s.check(sid)
    entities, state = replies.last_parts()
    assert entities is not None
    assert state is None
    assert snap is not None
    assert set(snap.entities) == {"series"}

    blob = StateBlob(name="other", data={"a": 1}, version=7, updated_at=s.clock.now())
    assert await s.writer.copy_state(sid, blob, expires_at=s.expires())
    await s.check(sid)
    assert replies.last_parts()[0] is None
    assert replies.last_parts()[1] is not None

    metadata = SessionMetadata(
        session_id=sid, user_id="u", created_at=s.clock.now(), last_activity=s.clock.now()
    )
    await s.writer.put_metadata(sid, metadata, expires_at=s.expires())
    snap = await s.check(sid)
    assert replies.last_parts() == (None, None)
    assert snap is not None
    assert snap.metadata == metadata


async def test_a_session_without_markers_is_sent_whole_until_a_write_sets_them(
    s: Stores,
) -> None:
    """Meta as the former scripts left it (no 'c', 'ev', 'sv'): the parts are sent."""
    sid = await _session_with_parts(s)
    await s.raw.hdel(s.meta(sid), "c", "ev", "sv")  # type: ignore[misc]
    replies = Replies(s.reader)
    await s.check(sid)
    await s.former_write(sid)
    await s.check(sid)
    assert all(part is not None for part in replies.last_parts())
    await _plain_turn(s, sid)  # the first write of a current script sets both markers
    await s.check(sid)
    assert all(part is not None for part in replies.last_parts())
    await _plain_turn(s, sid)
    await s.check(sid)
    assert replies.last_parts() == (None, None)


async def test_a_former_scripts_entity_change_is_never_hidden_by_a_marker(s: Stores) -> None:
    sid = await _session_with_parts(s)
    replies = Replies(s.reader)
    await s.check(sid)
    await s.former_write(sid, entity="changed by a former script")
    snap = await s.check(sid)
    assert replies.last_parts()[0] is not None
    assert snap is not None
    assert snap.entities["topic"].value == "changed by a former script"
    # Read before the current script's next write, then after it: both see the change.
    await s.former_write(sid, entity="again")
    await _plain_turn(s, sid)
    snap = await s.check(sid)
    assert snap is not None
    assert snap.entities["topic"].value == "again"


async def test_a_restart_after_expiry_a_delete_and_a_restore_reset_the_parts(
    s: Stores,
) -> None:
    sid = await _session_with_parts(s)
    await s.check(sid)
    # Expired and collected by its native TTL or not: the next write starts afresh.
    s.clock.advance(timedelta(hours=2))
    await _plain_turn(s, sid, "after expiry")
    snap = await s.check(sid)
    assert snap is not None
    assert snap.entities == {}
    assert snap.state == {}
    await s.writer.update_entities(
        sid, {"topic": _entity("topic", "new life", s.clock)}, expires_at=s.expires()
    )
    await s.check(sid)
    await s.writer.delete(sid)
    assert await s.check(sid) is None
    await _plain_turn(s, sid, "after delete")
    snap = await s.check(sid)
    assert snap is not None
    assert snap.entities == {}

    await s.writer.restore(
        sid,
        turns=list(snap.turns),
        next_index=snap.next_index,
        metadata=SessionMetadata(
            session_id=sid, user_id="u", created_at=s.clock.now(), last_activity=s.clock.now()
        ),
        entities={"place": _entity("place", "Tokyo", s.clock)},
        state={},
        window=10,
        expires_at=s.expires(),
    )
    snap = await s.check(sid)
    assert snap is not None
    assert set(snap.entities) == {"place"}


async def test_the_reader_holds_only_parts_its_own_writes_keep_current(s: Stores) -> None:
    """The reader's own append moves its markers along (no read in between)."""
    sid = await _session_with_parts(s)
    replies = Replies(s.reader)
    await s.check(sid)
    await s.reader.append_turns(
        sid, [text_turn("mine")], window=10, expires_at=s.expires(),
        entities=EntityChange(upsert={"series": _entity("series", "Naruto", s.clock)}),
    )  # fmt: skip
    await s.writer.append_turns(sid, [text_turn("theirs")], window=10, expires_at=s.expires())
    snap = await s.check(sid)
    assert replies.last_parts() == (None, None)
    assert snap is not None
    assert snap.entities["series"].value == "Naruto"


def _change(rng: random.Random, clock: FakeClock) -> EntityChange | None:
    roll = rng.random()
    if roll < 0.4:
        return None
    upsert = {
        kind: _entity(kind, f"v{rng.randrange(5)}", clock)
        for kind in rng.sample(KINDS, rng.randrange(3))
    }
    remove = tuple(rng.sample(KINDS, 1)) if roll > 0.8 else ()
    return EntityChange(upsert=upsert, remove=remove)


@pytest.mark.parametrize("seed", range(4))
async def test_cached_loads_equal_uncached_loads_randomised(s: Stores, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(3):
        sid = fresh_id("marks")
        for step in range(70):
            store = rng.choice([s.writer, s.reader])
            turn = text_turn(f"turn {step} " + "w" * rng.randrange(30))
            roll = rng.random()
            if roll < 0.35:
                await store.append_through(
                    s.durable, sid, [turn], window=rng.choice([3, 8]),
                    hot_expires_at=s.expires(), durable_expires_at=None,
                    entities=_change(rng, s.clock),
                )  # fmt: skip
            elif roll < 0.5:
                await store.append_turns(
                    sid, [turn, turn], window=5, expires_at=s.expires(),
                    entities=_change(rng, s.clock),
                )  # fmt: skip
            elif roll < 0.58:
                await store.put_state(
                    sid, f"s{rng.randrange(2)}", {"n": step}, expires_at=s.expires()
                )
            elif roll < 0.66:
                change = _change(rng, s.clock) or EntityChange()
                await store.update_entities(
                    sid, change.upsert, change.remove, expires_at=s.expires()
                )
            elif roll < 0.71:
                blob = StateBlob(
                    name="copied", data={"n": step}, version=step + 1, updated_at=s.clock.now()
                )
                await store.copy_state(sid, blob, expires_at=s.expires())
            elif roll < 0.76:
                metadata = SessionMetadata(
                    session_id=sid,
                    user_id=f"u{rng.randrange(3)}",
                    created_at=s.clock.now(),
                    last_activity=s.clock.now(),
                )
                await store.put_metadata(sid, metadata, expires_at=s.expires())
            elif roll < 0.84:
                if await s.plain.load(sid) is not None:
                    entity = f"former {step}" if rng.random() < 0.5 else None
                    await s.former_write(sid, entity=entity)
            elif roll < 0.88:
                await s.plain.touch(sid, expires_at=s.expires(rng.choice([1, 30])))
            elif roll < 0.9:
                await store.delete(sid)
            elif roll < 0.92:
                s.clock.advance(timedelta(minutes=rng.choice([20, 45])))
            if rng.random() < 0.7:  # the reader does not always read between writes
                await s.check(sid)
            s.clock.advance(timedelta(seconds=1))
        await s.check(sid)


async def test_a_read_after_the_stores_own_state_put_fetches_the_state_alone(
    s: Stores,
) -> None:
    """Its copy is kept through the write (no turn is sent again, the entities neither)."""
    sid = await _session_with_parts(s)
    for i in range(5):
        await _plain_turn(s, sid, f"turn {i}")
    replies = Replies(s.reader)
    await s.check(sid)
    for name, data in (("task", {"step": 2}), ("other", {"x": 1})):
        await s.reader.put_state(sid, name, data, expires_at=s.expires())
        snap = await s.check(sid)
        reply = replies.seen[-1]
        assert reply is not None
        assert reply[7] == []  # no turn
        assert replies.last_parts()[0] is None
        assert replies.last_parts()[1] is not None
        assert snap is not None
        assert snap.state[name].data == data
    await s.reader.update_entities(
        sid, {"place": _entity("place", "Osaka", s.clock)}, expires_at=s.expires()
    )
    snap = await s.check(sid)
    assert replies.last_parts()[1] is None
    assert snap is not None
    assert set(snap.entities) == {"topic", "place"}


async def test_the_markers_are_bounded_as_the_snapshot_cache(s: Stores) -> None:
    small = RedisHotStore.from_url(
        server_url("redis"), clock=s.clock, prefix=s.writer.keys.prefix, snapshot_cache=2
    )
    try:
        sessions = [await _session_with_parts(s) for _ in range(5)]
        for sid in sessions * 2:
            assert await small.load(sid) == await s.plain.load(sid)
            assert len(small._snapshots) <= 2
            held = small._snapshots.get(sid)
            assert held is not None
            assert (held.entities_mark, held.state_mark) != (b"", b"")  # kept in the entry
    finally:
        await small.aclose()
