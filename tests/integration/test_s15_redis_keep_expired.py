"""Redis: the hot append that keeps a held expired session (``hot_append_keep_expired``)
takes every argument list ``hot_append`` takes.

Its script dropped its own first argument with ``{unpack(ARGV, 2)}``: Lua 5.1 unpacks at
most about 8,000 values, so an append with a large entity change (two arguments a kind)
failed with "too many results to unpack" where the same append without ``keep_expired``
succeeded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import open_backend
from tiermem.clock import FakeClock
from tiermem.models import ActiveEntity
from tiermem.store.contract import EntityChange
from tiermem.testing.backend import BackendUnderTest, fresh_id, text_turn

KINDS = 4500
"""Entity kinds in one change: 9,000 arguments, past what Lua 5.1's ``unpack`` returns."""


@pytest.fixture(params=["redis", "redis-cluster"])
async def redis(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BackendUnderTest]:
    backend = await open_backend(request.param, FakeClock(), tmp_path)
    try:
        yield backend
    finally:
        await backend.hot.aclose()
        await backend.durable.aclose()


@pytest.mark.parametrize("keep_expired", [False, True])
async def test_an_append_with_a_large_entity_change_keeps_expired_as_without(
    redis: BackendUnderTest, keep_expired: bool
) -> None:
    sid = fresh_id("s")
    now = redis.clock.now()
    change = EntityChange(
        upsert={
            f"k{i}": ActiveEntity(kind=f"k{i}", value=str(i), turn_index=0, updated_at=now)
            for i in range(KINDS)
        }
    )
    result = await redis.hot.append_turns(
        sid,
        [text_turn("a")],
        window=5,
        expires_at=redis.later(60),
        entities=change,
        keep_expired=keep_expired,
    )
    assert (result.version, result.turns[0].index) == (1, 0)
    snap = await redis.hot.load(sid)
    assert snap is not None
    assert len(snap.entities) == KINDS
