"""The Redis backend under test: hot and durable stores on one client, isolated by prefix."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tiermem.clock import Clock
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore, client_from_url
from tiermem.store.backends.redis_scripts import RedisClient
from tiermem.store.contract import DEFAULT_GC_GRACE
from tiermem.testing import BackendUnderTest, FakeClock


def fresh_prefix() -> str:
    """A key prefix no other test uses, so tests sharing one server never meet."""
    return f"t{uuid.uuid4().hex[:8]}"


class _SharedClient:
    """A client that several stores use; the last store to close it closes it."""

    def __init__(self, client: RedisClient, users: int) -> None:
        self.client = client
        self._users = users

    async def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            await self.client.aclose()


class _HotUnderTest(RedisHotStore):
    def __init__(self, shared: _SharedClient, **options: object) -> None:
        super().__init__(shared.client, **options)  # type: ignore[arg-type]
        self._shared: _SharedClient | None = shared

    async def aclose(self) -> None:
        if self._shared is not None:
            shared, self._shared = self._shared, None
            await shared.release()


class _DurableUnderTest(RedisDurableStore):
    def __init__(self, shared: _SharedClient, **options: object) -> None:
        super().__init__(shared.client, **options)  # type: ignore[arg-type]
        self._shared: _SharedClient | None = shared

    async def aclose(self) -> None:
        if self._shared is not None:
            shared, self._shared = self._shared, None
            await shared.release()


def open_redis_stores(
    url: str,
    clock: Clock,
    *,
    prefix: str | None = None,
    gc_grace: timedelta = DEFAULT_GC_GRACE,
    activity_shards: int = 16,
    cluster: bool = False,
    **client_options: object,
) -> tuple[RedisHotStore, RedisDurableStore]:
    """Both stores on one client for ``url`` (a RedisCluster client with ``cluster``),
    under ``prefix`` (fresh when None).

    Closing either store leaves the other working; the client closes with the second.
    Closing a store twice is harmless.
    """
    prefix = prefix or fresh_prefix()
    shared = _SharedClient(client_from_url(url, cluster=cluster, **client_options), users=2)
    hot = _HotUnderTest(
        shared, clock=clock, prefix=prefix, gc_grace=gc_grace, activity_shards=activity_shards
    )
    durable = _DurableUnderTest(shared, clock=clock, prefix=prefix, gc_grace=gc_grace)
    return hot, durable


async def open_redis_backend(url: str, clock: FakeClock) -> BackendUnderTest:
    """The conformance suite's Redis backend: see :func:`open_redis_stores`."""
    hot, durable = open_redis_stores(url, clock)
    return BackendUnderTest(hot=hot, durable=durable, clock=clock)


async def open_redis_cluster_backend(url: str, clock: FakeClock) -> BackendUnderTest:
    """The conformance suite's Redis Cluster backend: both stores on one
    :class:`~redis.asyncio.cluster.RedisCluster` client (as a deployment shares one),
    built from the settings' path (:func:`client_from_url` with ``cluster=True``)."""
    hot, durable = open_redis_stores(url, clock, cluster=True)
    return BackendUnderTest(hot=hot, durable=durable, clock=clock)
