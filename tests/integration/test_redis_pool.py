"""The Redis client's connection pool: a burst larger than the pool waits, never fails.

redis-py's default asyncio pool raises ``MaxConnectionsError`` once ``max_connections``
commands are in flight; 500 sessions writing at once hit it (issue #8). Against a real
Redis (``TIERMEM_TEST_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import uuid

from tests.conftest import server_url
from tiermem.store.backends.redis_scripts import DEFAULT_MAX_CONNECTIONS, client_from_url


async def test_more_commands_in_flight_than_connections_wait_for_one() -> None:
    client = client_from_url(server_url("redis"), max_connections=2)
    key = f"tiermem-test-pool:{uuid.uuid4().hex}"
    try:
        # Each BLPOP holds its connection for 20 ms on the server: ten at once need ten.
        results = await asyncio.gather(*(client.blpop([key], timeout=0.02) for _ in range(10)))
        assert results == [None] * 10
        pool = client.connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= 2
    finally:
        await client.aclose()


async def test_the_default_pool_keeps_redis_pys_size() -> None:
    client = client_from_url(server_url("redis"))
    try:
        assert client.connection_pool.max_connections == DEFAULT_MAX_CONNECTIONS
        assert await client.ping()
    finally:
        await client.aclose()
