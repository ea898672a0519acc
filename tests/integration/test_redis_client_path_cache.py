"""The hot store's snapshot cache (``redis_snapshots``) hands out what a store without one
reads: randomised appends (with and without entity changes, through both tiers and the
hot tier alone), metadata, state and writes by another store, each followed by a load
through a caching store and through one with ``snapshot_cache=0``. Also: a caller changing
a snapshot's dicts does not change what the next load returns."""

from __future__ import annotations

import random
from datetime import timedelta

from tests.backends.redis import open_redis_stores
from tests.conftest import server_url
from tiermem.models import ActiveEntity, SessionMetadata
from tiermem.store.backends.redis import RedisHotStore
from tiermem.store.contract import EntityChange
from tiermem.testing import FakeClock
from tiermem.testing.backend import fresh_id, text_turn

KINDS = ["series", "topic", "place"]


def _change(rng: random.Random, clock: FakeClock, index: int) -> EntityChange | None:
    roll = rng.random()
    if roll < 0.4:
        return None
    upsert = {
        kind: ActiveEntity(
            kind=kind, value=f"v{rng.randrange(5)}", turn_index=index, updated_at=clock.now()
        )
        for kind in rng.sample(KINDS, rng.randrange(3))
    }
    remove = tuple(rng.sample(KINDS, 1)) if roll > 0.8 else ()
    return EntityChange(upsert=upsert, remove=remove)


async def test_cached_loads_equal_uncached_loads_randomised() -> None:
    url = server_url("redis")
    clock = FakeClock()
    hot, durable = open_redis_stores(url, clock)
    plain = RedisHotStore.from_url(url, clock=clock, prefix=hot.keys.prefix, snapshot_cache=0)
    rng = random.Random(8)
    try:
        for _ in range(4):
            session_id = fresh_id("cache")
            for step in range(60):
                expires = clock.now() + timedelta(minutes=30)
                turn = text_turn(f"turn {step} " + "w" * rng.randrange(40), role="user")
                roll = rng.random()
                if roll < 0.55:
                    snap = await hot.load(session_id)
                    change = _change(rng, clock, snap.next_index if snap else 0)
                    await hot.append_through(
                        durable,
                        session_id,
                        [turn],
                        window=rng.choice([3, 8, 50]),
                        hot_expires_at=expires,
                        durable_expires_at=None,
                        entities=change,
                    )
                elif roll < 0.7:
                    await hot.append_turns(
                        session_id,
                        [turn, turn],
                        window=5,
                        expires_at=expires,
                        metadata=SessionMetadata(
                            session_id=session_id,
                            user_id=f"u{rng.randrange(3)}",
                            created_at=clock.now(),
                            last_activity=clock.now(),
                        ),
                    )
                elif roll < 0.8:
                    await plain.append_turns(  # another process: the cached copy falls behind
                        session_id,
                        [turn],
                        window=8,
                        expires_at=expires,
                        entities=_change(rng, clock, 0),
                    )
                elif roll < 0.9:
                    await hot.put_state(
                        session_id, f"s{rng.randrange(2)}", {"n": step}, expires_at=expires
                    )
                else:
                    await plain.touch(session_id, expires_at=expires + timedelta(seconds=step))
                clock.advance(timedelta(seconds=1))
                cached, uncached = await hot.load(session_id), await plain.load(session_id)
                assert cached == uncached, f"step {step}"
                if cached is not None:
                    cached.entities.clear()  # the caller's copy, not the cache's
                    cached.state.clear()
                    assert await hot.load(session_id) == uncached
    finally:
        await plain.aclose()
        await hot.aclose()
        await durable.aclose()
