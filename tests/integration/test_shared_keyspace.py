"""The shared keyspace across store instances, and what each backend promises beyond the
conformance suite (tiermem.testing.conformance_shared): round trips, key layout, native
TTLs, Redis Cluster slots, the SQLite migration.

Circuit breakers keep their state in shared blobs so that every worker sees one breaker;
here two instances of a store on one backend (one SQLite file, one Redis server, one
DynamoDB table; each with its own connection, as two processes would have) must see each
other's writes and never lose an update between them.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing, suppress
from datetime import timedelta
from pathlib import Path

import pytest
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.backends.redis import fresh_prefix, open_redis_stores
from tests.conftest import server_url
from tests.integration.test_redis_specific import (  # noqa: F401 -- cluster_url is a fixture
    RoundTrips,
    _strict_slots,
    cluster_url,
)
from tiermem.errors import ConflictError
from tiermem.store.backends.dynamodb import DynamoDBHotStore
from tiermem.store.backends.redis import RedisHotStore
from tiermem.store.backends.sqlite import MIGRATIONS, SQLiteHotStore
from tiermem.store.contract import HotStore
from tiermem.store.keys import escape_segment
from tiermem.testing import FakeClock
from tiermem.testing.backend import fresh_id

GRACE = timedelta(minutes=10)
HOUR = timedelta(hours=1)
HOUR_MS = 3_600_000


async def _open_pair(
    backend: str, clock: FakeClock, tmp_path: Path
) -> tuple[HotStore, HotStore, Callable[[], Awaitable[None]]]:
    """Two hot stores on the same data, each with its own connection."""
    if backend == "sqlite":
        path = tmp_path / "tiermem.db"
        a: HotStore = SQLiteHotStore(path, clock=clock)
        b: HotStore = SQLiteHotStore(path, clock=clock)
        closers = [a.aclose, b.aclose]
    elif backend == "redis":
        url, prefix = server_url("redis"), fresh_prefix()
        a, durable_a = open_redis_stores(url, clock, prefix=prefix)
        b, durable_b = open_redis_stores(url, clock, prefix=prefix)
        closers = [a.aclose, durable_a.aclose, b.aclose, durable_b.aclose]
    else:
        url = server_url("dynamodb")
        table = await shared_table(url)
        a, b = (
            DynamoDBHotStore(table, clock=clock, endpoint_url=url, session=dynamodb_session())
            for _ in range(2)
        )
        closers = [a.aclose, b.aclose]

    async def close() -> None:
        for closer in closers:
            await closer()

    return a, b, close


@pytest.fixture(params=["sqlite", "redis", "dynamodb"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[HotStore, HotStore, FakeClock]]:
    clock = FakeClock()
    a, b, close = await _open_pair(request.param, clock, tmp_path)
    try:
        yield a, b, clock
    finally:
        await close()


# -- two instances ------------------------------------------------------------------------


async def test_shared_blob_written_by_one_instance_is_seen_by_the_other(
    pair: tuple[HotStore, HotStore, FakeClock],
) -> None:
    a, b, clock = pair
    name = fresh_id("breaker")
    opened = await a.put_shared(
        name, {"state": "open"}, expires_at=clock.now() + HOUR, expected_version=0
    )
    assert await b.get_shared(name) == opened
    # The other instance's compare-and-set sees the first one's version.
    with pytest.raises(ConflictError) as info:
        await b.put_shared(name, {"state": "x"}, expires_at=None, expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    half_open = await b.put_shared(
        name, {"state": "half_open", "probe": "b"}, expires_at=None, expected_version=1
    )
    assert await a.get_shared(name) == half_open
    # Exactly one instance wins the probe.
    with pytest.raises(ConflictError):
        await a.put_shared(
            name, {"state": "half_open", "probe": "a"}, expires_at=None, expected_version=1
        )
    assert await b.delete_shared(name) is True
    assert await a.get_shared(name) is None
    assert await a.delete_shared(name) is False


async def test_concurrent_increments_from_two_instances_lose_nothing(
    pair: tuple[HotStore, HotStore, FakeClock],
) -> None:
    a, b, clock = pair
    name = fresh_id("counter")

    async def increment(store: HotStore) -> None:
        while True:
            current = await store.get_shared(name)
            count = current.data["count"] if current is not None else 0
            assert isinstance(count, int)
            await asyncio.sleep(0)
            try:
                await store.put_shared(
                    name,
                    {"count": count + 1},
                    expires_at=clock.now() + HOUR,
                    expected_version=current.version if current is not None else 0,
                )
            except ConflictError:
                continue
            return

    await asyncio.gather(*(increment(a if i % 2 else b) for i in range(16)))
    got = await b.get_shared(name)
    assert got is not None
    assert (got.data, got.version) == ({"count": 16}, 16)


async def test_unconditional_writes_from_two_instances_each_get_a_version(
    pair: tuple[HotStore, HotStore, FakeClock],
) -> None:
    a, b, clock = pair
    name = fresh_id("breaker")
    written = await asyncio.gather(
        *(
            (a if i % 2 else b).put_shared(name, {"i": i}, expires_at=clock.now() + HOUR)
            for i in range(10)
        )
    )
    assert sorted(blob.version for blob in written) == list(range(1, 11))
    got = await a.get_shared(name)
    assert got is not None
    assert got.version == 10
    assert got == next(blob for blob in written if blob.version == 10)


# -- Redis --------------------------------------------------------------------------------


@pytest.fixture
async def redis_env() -> AsyncIterator[tuple[RedisHotStore, aredis.Redis, RoundTrips, FakeClock]]:
    url = server_url("redis")
    clock = FakeClock()
    trips = RoundTrips()
    hot, durable = open_redis_stores(
        url, clock, gc_grace=GRACE, connection_class=trips.connection_class()
    )
    admin = aredis.Redis.from_url(url)
    try:
        yield hot, admin, trips, clock
    finally:
        await hot.aclose()
        await durable.aclose()
        await admin.aclose()


async def test_redis_each_shared_operation_is_one_round_trip(
    redis_env: tuple[RedisHotStore, aredis.Redis, RoundTrips, FakeClock],
) -> None:
    hot, _, trips, clock = redis_env
    name = fresh_id("breaker")
    versions = iter(range(100))
    operations: list[Callable[[], Awaitable[object]]] = [
        lambda: hot.get_shared(name),
        lambda: hot.put_shared(name, {"s": "open"}, expires_at=clock.now() + HOUR),
        lambda: hot.put_shared(
            name, {"s": "open"}, expires_at=None, expected_version=next(versions)
        ),
        lambda: hot.delete_shared(name),
    ]
    for operation in operations:
        await _attempt(operation)  # loads the script into the server's cache if needed
        before = trips.count
        await _attempt(operation)
        assert trips.count - before == 1


async def _attempt(operation: Callable[[], Awaitable[object]]) -> None:
    with suppress(ConflictError):  # a refused compare-and-set costs the same round trip
        await operation()


async def test_redis_shared_blob_is_one_key_with_a_native_ttl(
    redis_env: tuple[RedisHotStore, aredis.Redis, RoundTrips, FakeClock],
) -> None:
    hot, admin, _, clock = redis_env
    name = f"tool:{{search}}#1/{fresh_id()}"
    key = f"{hot.keys.prefix}:shared:{escape_segment(name)}"
    assert "{" not in key  # no hash tag: the slot is the whole key's, one slot either way
    await hot.put_shared(name, {"state": "open"}, expires_at=clock.now() + HOUR)
    keys = [k async for k in admin.scan_iter(match=f"{hot.keys.prefix}:*", count=500)]
    assert keys == [key.encode()]
    grace_ms = GRACE // timedelta(milliseconds=1)
    assert HOUR_MS < await admin.pttl(key) <= HOUR_MS + grace_ms
    # The native TTL follows the remaining logical time, relative to the store's clock.
    clock.advance(HOUR / 2)
    await hot.put_shared(name, {"state": "open"}, expires_at=clock.now() + 2 * HOUR)
    assert 2 * HOUR_MS < await admin.pttl(key) <= 2 * HOUR_MS + grace_ms
    await hot.put_shared(name, {"state": "closed"}, expires_at=None)
    assert await admin.pttl(key) == -1
    # A refused write leaves the key as it was.
    with pytest.raises(ConflictError):
        await hot.put_shared(name, {"x": 1}, expires_at=clock.now() + HOUR, expected_version=0)
    assert await admin.pttl(key) == -1


async def test_redis_shared_operations_run_on_a_cluster_within_their_slots(
    cluster_url: str,  # noqa: F811 -- the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _strict_slots(monkeypatch)
    clock = FakeClock()
    client = RedisCluster.from_url(cluster_url)
    hot = RedisHotStore(client, clock=clock, gc_grace=GRACE)
    names = [f"b{{x}}:{fresh_id()}", f"b{{y}}:{fresh_id()}", fresh_id("plain")]
    try:
        for name in names:
            await hot.put_shared(name, {"n": 1}, expires_at=None, expected_version=0)
            await hot.put_shared(name, {"n": 2}, expires_at=clock.now() + HOUR)
            blob = await hot.get_shared(name)
            assert blob is not None
            assert (blob.data, blob.version) == ({"n": 2}, 2)
            assert await hot.delete_shared(name) is True
    finally:
        await client.aclose()


# -- DynamoDB -----------------------------------------------------------------------------


async def test_dynamodb_shared_blob_is_one_item_in_its_own_partition_with_a_ttl() -> None:
    url = server_url("dynamodb")
    table = await shared_table(url)
    clock = FakeClock()
    hot = DynamoDBHotStore(
        table, clock=clock, endpoint_url=url, session=dynamodb_session(), gc_grace=GRACE
    )
    name = f"tool#{fresh_id()}"
    pk = f"SHARED#{escape_segment(name)}"
    try:
        await hot.put_shared(name, {"state": "open"}, expires_at=clock.now() + HOUR)
        async with dynamodb_session().client("dynamodb", endpoint_url=url) as raw:
            response = await raw.query(
                TableName=table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": pk}},
                ConsistentRead=True,
            )
            (item,) = response["Items"]
            expected_ttl = time.time() + (HOUR + GRACE).total_seconds()
            assert abs(int(item["ttl"]["N"]) - expected_ttl) < 60
            assert "act_pk" not in item  # never in the activity index
            await hot.put_shared(name, {"state": "closed"}, expires_at=None)
            response = await raw.get_item(
                TableName=table, Key={"pk": {"S": pk}, "sk": item["sk"]}, ConsistentRead=True
            )
            assert "ttl" not in response["Item"]
            assert "exp_us" not in response["Item"]
    finally:
        await hot.aclose()


# -- SQLite -------------------------------------------------------------------------------


async def test_sqlite_file_at_migration_3_gets_the_shared_table(tmp_path: Path) -> None:
    path = tmp_path / "tiermem.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        for migration in MIGRATIONS[:3]:
            for statement in migration:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 3")
        conn.execute("COMMIT")
    clock = FakeClock()
    hot = SQLiteHotStore(path, clock=clock)
    try:
        blob = await hot.put_shared("breaker", {"state": "open"}, expires_at=None)
        assert await hot.get_shared("breaker") == blob
    finally:
        await hot.aclose()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 4


async def test_sqlite_long_expired_shared_blobs_are_collected(tmp_path: Path) -> None:
    path = tmp_path / "tiermem.db"
    clock = FakeClock()
    hot = SQLiteHotStore(path, clock=clock, gc_grace=GRACE)
    try:
        for i in range(50):
            await hot.put_shared(f"old-{i}", {"i": i}, expires_at=clock.now() + HOUR)
        await hot.put_shared("forever", {"keep": True}, expires_at=None)
        clock.advance(HOUR + GRACE)
        # Collection runs with the first write and every 64th after it.
        for i in range(65):
            await hot.put_shared("new", {"i": i}, expires_at=clock.now() + HOUR)
    finally:
        await hot.aclose()
    with closing(sqlite3.connect(path)) as conn:
        names = {name for (name,) in conn.execute("SELECT name FROM hot_shared")}
    assert names == {"forever", "new"}
