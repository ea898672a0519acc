"""The snapshot cache keeps the part markers in its entries (``CachedSession.entities_mark``
and ``state_mark``) and reuses a cached part the load script left out as it is; until
session 12 a layer over the cache (``_MarkedSnapshots`` in redis_hot.py, kept below as the
reference with the ``SnapshotCache`` methods it wrapped) held them beside the entries and
rebuilt the flat field lists of a left-out part for the cache to compare value by value.

On the real test Redis, randomised writes (appends with and without entity changes, through
both tiers and the hot tier alone, metadata, entities, state, copy_state, deletes, expiry,
writes by a former script that moves 'v' alone) by two caching stores, each followed or
not by a read: every call a store makes on its cache is made on a reference cache too, and
the load arguments (markers included), the snapshots handed out and the entries held must
be the reference's. With a cache of 2 sessions over 3 the reference forgets markers the
entries keep: then only the markers sent may differ, the reference's being empty.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import pytest
import redis.asyncio as aioredis

from tests.backends.redis import open_redis_stores
from tests.conftest import server_url
from tiermem.models import ActiveEntity, SessionMetadata, SessionSnapshot, StateBlob, Turn
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.backends.redis_scripts import Arg, from_us
from tiermem.store.backends.redis_snapshots import (
    CachedSession,
    SnapshotCache,
    _copy,
    _snapshot,
    decode_state,
)
from tiermem.store.codec import decode_turns
from tiermem.store.contract import EntityChange
from tiermem.testing import FakeClock
from tiermem.testing.backend import fresh_id, text_turn

KINDS = ["series", "topic", "place"]


# -- reference: the cache and its marker layer as of 6dfae84 ----------------------------------


class _RefCached(NamedTuple):
    epoch: bytes
    snapshot: SessionSnapshot
    metadata_raw: bytes
    entities_raw: dict[bytes, bytes]
    state_raw: dict[bytes, bytes]


class _RefCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._sessions: dict[str, _RefCached] = {}

    def get(self, session_id: str) -> _RefCached | None:
        return self._sessions.get(session_id)

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _put(self, session_id: str, entry: _RefCached) -> None:
        if not self.capacity:
            return
        held = self._sessions.pop(session_id, None)
        if (
            held is not None
            and held.epoch == entry.epoch
            and held.snapshot.version > entry.snapshot.version
        ):
            entry = held
        self._sessions[session_id] = entry
        while len(self._sessions) > self.capacity:
            del self._sessions[next(iter(self._sessions))]

    def load_args(self, cached: _RefCached | None) -> list[Arg]:
        if cached is None:
            return ["", "", ""]
        return [cached.epoch, cached.snapshot.version, cached.snapshot.next_index]

    def loaded(
        self, session_id: str, cached: _RefCached | None, reply: Sequence[Any] | None
    ) -> SessionSnapshot | None:
        if reply is None:
            self.drop(session_id)
            return None
        version, next_index, expires_us, epoch = reply[:4]
        if len(reply) == 4:
            assert cached is not None
            return _copy(cached.snapshot, from_us(expires_us))
        metadata_raw, first, sent_from, turns_raw, entities_flat, state_flat = reply[4:]
        first, sent_from = int(first), int(sent_from)
        base = cached if cached is not None and cached.epoch == epoch else None
        kept: tuple[Turn, ...] = ()
        if base is not None and sent_from > first:
            kept = tuple(t for t in base.snapshot.turns if first <= t.index < sent_from)
        turns = kept + tuple(decode_turns(turns_raw, session_id=session_id))
        if base is not None and metadata_raw == base.metadata_raw:
            metadata = base.snapshot.metadata
        else:
            metadata = SessionMetadata.model_validate_json(metadata_raw) if metadata_raw else None
        entities_raw = dict(zip(entities_flat[::2], entities_flat[1::2], strict=True))
        state_raw = dict(zip(state_flat[::2], state_flat[1::2], strict=True))
        entities: dict[str, ActiveEntity] = {}
        for kind, raw in entities_raw.items():
            name = kind.decode()
            if base is not None and base.entities_raw.get(kind) == raw:
                entities[name] = base.snapshot.entities[name]
            else:
                entities[name] = ActiveEntity.model_validate_json(raw)
        state: dict[str, StateBlob] = {}
        for key, raw in state_raw.items():
            name = key.decode()
            if base is not None and base.state_raw.get(key) == raw:
                state[name] = base.snapshot.state[name]
            else:
                state[name] = decode_state(name, raw)
        snap = _snapshot(
            session_id, turns, metadata, entities, state, int(version), int(next_index), expires_us
        )
        self._put(session_id, _RefCached(epoch, snap, metadata_raw, entities_raw, state_raw))
        return _copy(snap, snap.expires_at)

    def appended(
        self,
        session_id: str,
        *,
        epoch: bytes,
        version: int,
        fresh: bool,
        turns: Sequence[Turn],
        window: int,
        expires_us: int,
        metadata: tuple[str, SessionMetadata] | None,
        change: EntityChange | None,
    ) -> None:
        if not self.capacity:
            return
        base = self._sessions.get(session_id)
        if fresh:
            held_turns: tuple[Turn, ...] = ()
            meta_raw, meta = b"", None
            entities_raw: dict[bytes, bytes] = {}
            entities: dict[str, ActiveEntity] = {}
            state_raw: dict[bytes, bytes] = {}
            state: dict[str, StateBlob] = {}
        elif base is not None and base.epoch == epoch and base.snapshot.version == version - 1:
            snap = base.snapshot
            held_turns = snap.turns
            meta_raw, meta = base.metadata_raw, snap.metadata
            entities_raw, entities = base.entities_raw, snap.entities
            state_raw, state = base.state_raw, snap.state
        else:
            self.drop(session_id)
            return
        if metadata is not None:
            meta_raw, meta = metadata[0].encode(), metadata[1]
        if change is not None:
            entities_raw, entities = dict(entities_raw), dict(entities)
            for kind in change.remove:
                entities_raw.pop(kind.encode(), None)
                entities.pop(kind, None)
            for kind, entity in change.upsert.items():
                entities_raw[kind.encode()] = entity.model_dump_json().encode()
                entities[kind] = entity
        all_turns = (*held_turns, *turns)[-window:]
        snap = _snapshot(
            session_id, all_turns, meta, entities, state, version, turns[-1].index + 1,
            expires_us,
        )  # fmt: skip
        self._put(session_id, _RefCached(epoch, snap, meta_raw, entities_raw, state_raw))


class _RefMarked(_RefCache):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._part_marks: dict[str, tuple[bytes, int, bytes, bytes]] = {}

    def _remember(self, session_id: str, marks: tuple[bytes, int, bytes, bytes]) -> None:
        held = self._sessions.get(session_id)
        if held is None or held.epoch != marks[0] or held.snapshot.version != marks[1]:
            return
        if session_id not in self._part_marks and len(self._part_marks) >= self.capacity:
            self._part_marks.clear()
        self._part_marks[session_id] = marks

    def read_args(self, session_id: str, cached: _RefCached | None) -> list[Arg]:
        args = self.load_args(cached)
        marks = self._part_marks.get(session_id)
        if (
            cached is not None
            and marks is not None
            and marks[0] == cached.epoch
            and marks[1] == cached.snapshot.version
        ):
            args += marks[2:]
        else:
            args += ("", "")
        return args

    def loaded(
        self, session_id: str, cached: _RefCached | None, reply: Sequence[Any] | None
    ) -> SessionSnapshot | None:
        if reply is None or len(reply) == 4:
            return super().loaded(session_id, cached, reply)
        entities_flat, state_flat, entities_mark, state_mark = reply[8:12]
        if entities_flat is None or state_flat is None:
            assert cached is not None
            if entities_flat is None:
                entities_flat = [part for item in cached.entities_raw.items() for part in item]
            if state_flat is None:
                state_flat = [part for item in cached.state_raw.items() for part in item]
        snapshot = super().loaded(session_id, cached, [*reply[:8], entities_flat, state_flat])
        if self.capacity:
            self._remember(session_id, (reply[3], int(reply[0]), entities_mark, state_mark))
        return snapshot

    def appended(self, session_id: str, **append: Any) -> None:
        marks = self._part_marks.get(session_id)
        super().appended(session_id, **append)
        if append["fresh"]:
            if self.capacity:
                now = b"%d" % append["version"]
                self._remember(session_id, (append["epoch"], append["version"], now, now))
        elif marks is not None and marks[0] == append["epoch"]:
            version, change = append["version"], append["change"]
            if marks[1] == version - 1:
                if change is not None and (change.upsert or change.remove):
                    marks = (marks[0], version, b"%d" % version, marks[3])
                else:
                    marks = (marks[0], version, marks[2], marks[3])
                self._remember(session_id, marks)


# -- the mirror ---------------------------------------------------------------------------------


class Mirror:
    """Makes every call a store makes on its snapshot cache on a reference cache too, and
    compares what both answer and hold."""

    def __init__(self, store: RedisHotStore) -> None:
        new: SnapshotCache = store._snapshots
        self.new = new
        self.ref = _RefMarked(new.capacity)
        self.loads = self.left_out = self.forgotten = 0
        get, load_args, loaded = new.get, new.load_args, new.loaded
        appended, drop = new.appended, new.drop
        last = [""]

        def m_get(session_id: str) -> CachedSession | None:
            last[0] = session_id
            return get(session_id)

        def m_load_args(cached: CachedSession | None) -> list[Arg]:
            args = load_args(cached)
            ref = self.ref.read_args(last[0], self.ref.get(last[0]))
            assert args[:3] == ref[:3]
            if ref[3:] == ["", ""] and args[3:] != ["", ""]:
                self.forgotten += 1  # the reference forgot them (its clear-all bound)
            else:
                assert args[3:] == ref[3:]
            return args

        def m_loaded(
            session_id: str, cached: CachedSession | None, reply: Sequence[Any] | None
        ) -> SessionSnapshot | None:
            ref_cached = self.ref.get(session_id)
            snap = loaded(session_id, cached, reply)
            assert snap == self.ref.loaded(session_id, ref_cached, reply)
            self.loads += 1
            if reply is not None and len(reply) > 4:
                self.left_out += (reply[8] is None) + (reply[9] is None)
            self.compare(session_id)
            return snap

        def m_appended(session_id: str, **append: Any) -> None:
            appended(session_id, **append)
            self.ref.appended(session_id, **append)
            self.compare(session_id)

        def m_drop(session_id: str) -> None:
            drop(session_id)
            self.ref.drop(session_id)
            self.compare(session_id)

        new.get = m_get  # type: ignore[method-assign]
        new.load_args = m_load_args  # type: ignore[method-assign]
        new.loaded = m_loaded  # type: ignore[method-assign]
        new.appended = m_appended  # type: ignore[method-assign]
        new.drop = m_drop  # type: ignore[method-assign]

    def compare(self, session_id: str) -> None:
        assert list(self.new._sessions) == list(self.ref._sessions)
        entry, ref = self.new._sessions.get(session_id), self.ref._sessions.get(session_id)
        if entry is None or ref is None:
            assert entry is None
            assert ref is None
            return
        assert tuple(entry[:5]) == tuple(ref)
        marks = self.ref._part_marks.get(session_id)
        if marks is not None and marks[:2] == (ref.epoch, ref.snapshot.version):
            assert (entry.entities_mark, entry.state_mark) == marks[2:]
        else:
            self.forgotten += (entry.entities_mark, entry.state_mark) != (b"", b"")


# -- the workload --------------------------------------------------------------------------------


@pytest.fixture
async def stores() -> AsyncIterator[tuple[FakeClock, RedisHotStore, RedisDurableStore, str]]:
    url = server_url("redis")
    clock = FakeClock()
    writer, durable = open_redis_stores(url, clock)
    try:
        yield clock, writer, durable, url
    finally:
        await writer.aclose()
        await durable.aclose()


def _entity(kind: str, value: str, clock: FakeClock) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=0, updated_at=clock.now())


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


@pytest.mark.parametrize(("seed", "capacity"), [(0, 64), (1, 64), (2, 64), (3, 2), (4, 2)])
async def test_the_cache_matches_the_former_marker_layer_randomised(
    stores: tuple[FakeClock, RedisHotStore, RedisDurableStore, str], seed: int, capacity: int
) -> None:
    clock, writer, durable, url = stores
    prefix = writer.keys.prefix
    writer_cache = RedisHotStore.from_url(url, clock=clock, prefix=prefix, snapshot_cache=capacity)
    reader = RedisHotStore.from_url(url, clock=clock, prefix=prefix, snapshot_cache=capacity)
    plain = RedisHotStore.from_url(url, clock=clock, prefix=prefix, snapshot_cache=0)
    raw = aioredis.Redis.from_url(url)
    mirrors = [Mirror(writer_cache), Mirror(reader)]
    rng = random.Random(seed)
    sessions = [fresh_id("marks") for _ in range(3)]

    def expires(minutes: int = 30) -> Any:
        return clock.now() + timedelta(minutes=minutes)

    try:
        for step in range(240):
            sid = rng.choice(sessions)
            store = rng.choice([writer_cache, reader])
            turn = text_turn(f"turn {step} " + "w" * rng.randrange(30))
            roll = rng.random()
            if roll < 0.35:
                await store.append_through(
                    durable, sid, [turn], window=rng.choice([3, 8]),
                    hot_expires_at=expires(), durable_expires_at=None,
                    entities=_change(rng, clock),
                )  # fmt: skip
            elif roll < 0.5:
                await store.append_turns(
                    sid, [turn, turn], window=5, expires_at=expires(),
                    entities=_change(rng, clock),
                )  # fmt: skip
            elif roll < 0.58:
                await store.put_state(
                    sid, f"s{rng.randrange(2)}", {"n": step}, expires_at=expires()
                )
            elif roll < 0.66:
                change = _change(rng, clock) or EntityChange()
                await store.update_entities(sid, change.upsert, change.remove, expires_at=expires())
            elif roll < 0.71:
                blob = StateBlob(
                    name="copied", data={"n": step}, version=step + 1, updated_at=clock.now()
                )
                await store.copy_state(sid, blob, expires_at=expires())
            elif roll < 0.76:
                metadata = SessionMetadata(
                    session_id=sid,
                    user_id=f"u{rng.randrange(3)}",
                    created_at=clock.now(),
                    last_activity=clock.now(),
                )
                await store.put_metadata(sid, metadata, expires_at=expires())
            elif roll < 0.84:
                if await plain.load(sid) is not None:  # a former script's write: 'v' alone
                    meta = writer.keys.hot_meta(sid)
                    if rng.random() < 0.5:
                        ent = writer.keys.hot_keys(sid)[2]
                        data = _entity("topic", f"former {step}", clock).model_dump_json()
                        await raw.hset(ent, "topic", data)  # type: ignore[misc]
                    await raw.hincrby(meta, "v", 1)  # type: ignore[misc]
            elif roll < 0.88:
                await plain.touch(sid, expires_at=expires(rng.choice([1, 30])))
            elif roll < 0.9:
                await store.delete(sid)
            elif roll < 0.92:
                clock.advance(timedelta(minutes=rng.choice([20, 45])))
            for cached in (writer_cache, reader):
                if rng.random() < 0.6:
                    assert await cached.load(sid) == await plain.load(sid)
            clock.advance(timedelta(seconds=1))
        for sid in sessions:
            for cached in (writer_cache, reader):
                assert await cached.load(sid) == await plain.load(sid)
    finally:
        await raw.aclose()
        await plain.aclose()
        await reader.aclose()
        await writer_cache.aclose()
    assert sum(m.loads for m in mirrors) > 200
    assert sum(m.left_out for m in mirrors) > 20  # the reuse of left-out parts is exercised
