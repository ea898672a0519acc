"""One Redis client per service: the composition root builds the hot store, the durable
store and the search index of a Redis deployment on ONE standalone client (one pool, one
:class:`~tiermem.store.backends.redis_scripts.DirectLane`), so the calls of all three made
in one turn of the event loop can go as one write (issue #8).

Against a real Redis (``TIERMEM_TEST_REDIS_URL``, the cluster at
``TIERMEM_TEST_REDIS_CLUSTER_URL``); the WAIT case starts its own master and replica.
Nothing is faked: the one spy (on the client's ``aclose``) calls the real method.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import server_url
from tests.integration.test_redis_wait import (
    PREFIX,
    MasterWithReplica,
    _archived_on,
    _replica_synced,
    _servers,
)
from tiermem.errors import NotReplicatedError
from tiermem.longterm.index import DocKind
from tiermem.longterm.index_redis import RedisIndex
from tiermem.service import MemoryService
from tiermem.settings import BackendName, TierMemSettings
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.backends.redis_scripts import DEFAULT_MAX_CONNECTIONS, DirectLane

TURNS: tuple[DocKind, ...] = ("turn",)


def _settings(
    hot: BackendName,
    durable: BackendName,
    url: str,
    tmp_path: Path,
    *,
    prefix: str | None = None,
    **more: Any,
) -> TierMemSettings:
    return TierMemSettings(
        hot_backend=hot,
        durable_backend=durable,
        redis_url=url,
        redis_prefix=prefix or f"sc{uuid.uuid4().hex[:8]}",
        sqlite_path=tmp_path / "tiermem.db",
        **more,
    )


def _index_client(memory: MemoryService) -> Redis:
    index = memory.longterm.index
    assert isinstance(index, RedisIndex)
    client = index._io.client  # the index exposes no client property
    assert isinstance(client, Redis)
    return client


def _lane(client: object) -> DirectLane:
    assert isinstance(client, Redis)
    lane = DirectLane.for_client(client)
    assert lane is not None
    return lane


@pytest.mark.parametrize(
    ("hot", "durable", "parts"),
    [("redis", "redis", 3), ("redis", "sqlite", 2), ("memory", "redis", 2)],
)
async def test_the_redis_parts_of_a_service_share_one_client(
    hot: BackendName, durable: BackendName, parts: int, tmp_path: Path
) -> None:
    settings = _settings(hot, durable, server_url("redis"), tmp_path)
    async with MemoryService.from_settings(settings) as memory:
        clients: list[object] = [_index_client(memory)]
        for store in (memory.tiers.hot, memory.tiers.durable):
            if isinstance(store, RedisHotStore | RedisDurableStore):
                clients.append(store.client)
        assert len(clients) == parts
        assert all(client is clients[0] for client in clients)
        # The pool holds as many connections as the separate pools did together.
        pool = _index_client(memory).connection_pool
        assert pool.max_connections == DEFAULT_MAX_CONNECTIONS * parts
        session = await memory.session(user_id="u-shared")
        await session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
        assert [t.text for t in await session.history()] == [
            "I prefer seinen. Is Berserk vol 42 in stock?"
        ]


async def test_calls_of_the_three_parts_in_one_loop_turn_are_written_together(
    tmp_path: Path,
) -> None:
    settings = _settings("redis", "redis", server_url("redis"), tmp_path)
    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(user_id="u-merge")
        await session.add_turn("user", "Berserk vol 42, is it in stock?")
        await memory.drain()
        hot, durable = memory.tiers.hot, memory.tiers.durable
        assert isinstance(hot, RedisHotStore)
        assert isinstance(durable, RedisDurableStore)
        clients = (hot.client, durable.client, _index_client(memory))
        lanes = {id(lane): lane for lane in map(_lane, clients)}

        def written() -> int:
            return sum(lane.writes for lane in lanes.values())

        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: hot.load(session.id),
            lambda: durable.get_session(session.id),
            lambda: memory.longterm.index.search("u-merge", "berserk", kinds=TURNS, limit=3),
        ]
        for call in calls:  # warm: scripts loaded, the index's caches filled
            await call()
        before = written()
        for call in calls:
            await call()
        alone = written() - before
        before = written()
        # One call per part, made in one turn of the loop: the first is in flight when
        # the others are made. On separate clients (a lane each) nothing could merge.
        await asyncio.gather(*(call() for call in calls))
        assert written() - before < alone
        assert len(lanes) == 1


async def test_closing_the_service_closes_the_shared_client_once(tmp_path: Path) -> None:
    settings = _settings("redis", "redis", server_url("redis"), tmp_path)
    memory = MemoryService.from_settings(settings)
    hot = memory.tiers.hot
    assert isinstance(hot, RedisHotStore)
    client = hot.client
    assert isinstance(client, Redis)
    closed = 0
    real_aclose = client.aclose

    async def counting_aclose(*args: Any, **kwargs: Any) -> None:
        nonlocal closed
        closed += 1
        await real_aclose(*args, **kwargs)

    client.aclose = counting_aclose  # type: ignore[method-assign]
    session = await memory.session(user_id="u-close")
    await session.add_turn("user", "hello")
    await memory.drain()
    pool = client.connection_pool
    assert pool._in_use_connections or pool._available_connections
    await memory.aclose()
    assert closed == 1
    connections = [*pool._in_use_connections, *pool._available_connections]
    assert connections
    assert not any(conn.is_connected for conn in connections), "a connection was left open"
    # Closing the parts again (as a second aclose would) closes nothing more.
    await memory.tiers.hot.aclose()
    await memory.tiers.durable.aclose()
    await memory.longterm.index.aclose()
    assert closed == 1


async def test_cluster_parts_keep_their_own_clients(tmp_path: Path) -> None:
    settings = _settings(
        "redis", "redis", server_url("redis-cluster"), tmp_path, redis_cluster=True
    )
    async with MemoryService.from_settings(settings) as memory:
        hot, durable = memory.tiers.hot, memory.tiers.durable
        assert isinstance(hot, RedisHotStore)
        assert isinstance(durable, RedisDurableStore)
        assert hot.client is not durable.client
        session = await memory.session(user_id="u-cluster")
        await session.add_turn("user", "hello")
        assert len(await session.history()) == 1


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[MasterWithReplica]:
    server, _ = _servers()
    servers = MasterWithReplica(server, tmp_path)
    try:
        servers.start()
        asyncio.run(_replica_synced(servers.replica))
        yield servers
    finally:
        servers.stop()


@pytest.mark.slow
async def test_wait_still_covers_every_acknowledged_turn_on_the_shared_client(
    pair: MasterWithReplica, tmp_path: Path
) -> None:
    settings = _settings(
        "redis",
        "redis",
        pair.url,
        tmp_path,
        prefix=PREFIX,
        redis_wait_replicas=1,
        redis_wait_timeout_ms=2000,
    )
    async with MemoryService.from_settings(settings, auto_summarize=False) as memory:
        hot = memory.tiers.hot
        assert isinstance(hot, RedisHotStore)
        assert hot.client is _index_client(memory)
        sessions = [await memory.session(user_id=f"u-w{i % 3}") for i in range(12)]
        # Many sessions at once, so the lane is merging the other parts' calls while the
        # waited appends go: each acknowledged turn must already be on the replica.
        turns = await asyncio.gather(*(s.add_turn("user", "ok thanks") for s in sessions))
        for session, turn in zip(sessions, turns, strict=True):
            archived = await _archived_on(pair.replica, session.id)
            assert archived, f"{session.id}: acknowledged but not on the replica"
            assert archived[-1].endswith(f',"index":{turn.index}}}'.encode())
        await memory.drain()
        pair.stall_replica()
        try:
            with pytest.raises(NotReplicatedError):
                await sessions[0].add_turn("user", "unconfirmed")
        finally:
            pair.resume_replica()
