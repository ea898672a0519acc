"""A Session handle kept past the session's whole retention (the hot TTL and the durable
tier's) still stores its turns; its reads now find the session again.

Before, the appends went on (from turn 0 on the in-memory store, from the old count on
SQLite) while the same handle's ``history()``, ``view()`` and ``context()`` raised
NotFoundError ("no longer exists (cleared or purged)") until the session was opened again,
and the archive held turns with no metadata record. Now a read that finds no session,
after this handle stored turns, writes the metadata again as ``memory.session()`` does.
A read never brings back by itself a session that is gone: a handle that stored nothing
since still gets NotFoundError."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import NotFoundError
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.testing.backend import fresh_id
from tiermem.tiers import SessionTierConfig, WritePolicy

CASES = [
    (pairing, policy)
    for pairing in ("memory+memory", "memory+sqlite")
    for policy in (WritePolicy.WRITE_THROUGH, WritePolicy.WRITE_BEHIND)
]


@pytest.fixture(params=CASES, ids=[f"{p}-{w.value}" for p, w in CASES])
async def memory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[MemoryService, FakeClock]]:
    pairing, policy = request.param
    clock = FakeClock()
    durable = (
        MemoryDurableStore(clock=clock)
        if pairing == "memory+memory"
        else SQLiteDurableStore(tmp_path / "tiermem.db", clock=clock)
    )
    service = MemoryService(
        MemoryHotStore(clock=clock),
        durable,
        clock=clock,
        config=SessionTierConfig(
            window=10, write_policy=policy, write_behind_every=5, durable_ttl=timedelta(hours=1)
        ),
        auto_detect=False,
        index_turns=False,
        auto_summarize=False,
    )
    try:
        yield service, clock
    finally:
        await service.aclose()


async def test_a_handle_kept_past_retention_reads_what_it_stored(
    memory: tuple[MemoryService, FakeClock],
) -> None:
    service, clock = memory
    session = await service.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(6):
        await session.add_turn("user", f"t{i}")
    clock.advance(timedelta(days=40))

    late = await session.add_turn("user", "late")
    await session.add_turn("assistant", "welcome back")
    assert [t.text for t in await session.history()] == ["late", "welcome back"]
    assert (await session.metadata()).user_id == session.user_id
    window = await session.context(budget=4000)
    assert window.messages[0].role == "user"
    batch = await session.add_turns([{"role": "user", "content": "and again"}])
    assert [t.index for t in batch] == [late.index + 2]
    assert [t.text for t in await session.history()] == ["late", "welcome back", "and again"]

    again = await service.session(session.id, user_id=session.user_id)
    assert [t.text for t in await again.history()] == ["late", "welcome back", "and again"]


async def test_add_turns_on_a_handle_kept_past_retention(
    memory: tuple[MemoryService, FakeClock],
) -> None:
    service, clock = memory
    session = await service.session(fresh_id("s"), user_id=fresh_id("u"))
    await session.add_turns(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    )
    clock.advance(timedelta(days=40))
    await session.add_turns(
        [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    )
    assert [t.text for t in (await session.view()).turns] == ["c", "d"]


async def test_a_read_alone_never_brings_a_session_back(
    memory: tuple[MemoryService, FakeClock],
) -> None:
    service, _ = memory
    user = fresh_id("u")
    cleared = await service.session(fresh_id("s"), user_id=user)
    await cleared.add_turn("user", "x")  # stored, never read since
    await cleared.clear()
    with pytest.raises(NotFoundError, match="no longer exists"):
        await cleared.history()

    purged = await service.session(fresh_id("s"), user_id=user)
    await purged.add_turn("user", "y")
    await service.purge_user(user)
    with pytest.raises(NotFoundError, match="no longer exists"):
        await purged.history()
    with pytest.raises(NotFoundError, match="no longer exists"):
        await purged.context(budget=4000)
    assert await service.list_sessions(user) == []
