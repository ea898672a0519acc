"""The Redis stores' direct lane (:class:`~tiermem.store.backends.redis_scripts.DirectLane`):
the same replies as redis-py's command path, error replies as results, connections that
are never reused dirty, a pool that is never starved, and round trips still counted.

Against a real Redis (``TIERMEM_TEST_REDIS_URL``); no fakes.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from tests.conftest import server_url
from tiermem.errors import BackendError
from tiermem.store.backends.redis_scripts import (
    Command,
    DirectLane,
    LuaScript,
    RedisIO,
    blocks,
    client_from_url,
    cluster_client_from_url,
    pack_commands,
    redis_boundary,
)
from tiermem.testing.round_trips import RoundTrips

ECHO_KEYS = LuaScript("test_echo_keys", "return {KEYS[1], ARGV[1], #ARGV}")


def key() -> str:
    return f"tiermem-test-lane:{uuid.uuid4().hex}"


async def test_clients_built_here_take_the_lane_one_per_pool(client: Redis) -> None:
    lane = DirectLane.for_client(client)
    assert lane is not None
    assert DirectLane.for_client(client) is lane  # shared by every store on the client
    assert RedisIO(client)._direct is lane


async def test_clients_redis_py_would_retry_or_pin_do_not_take_it() -> None:
    url = server_url("redis")
    retrying = Redis.from_url(url, retry=Retry(NoBackoff(), 3))
    single = Redis.from_url(url, single_connection_client=True)
    try:
        assert DirectLane.for_client(retrying) is None
        assert DirectLane.for_client(single) is None
    finally:
        await retrying.aclose()
        await single.aclose()


async def test_cluster_clients_keep_redis_pys_path() -> None:
    cluster = cluster_client_from_url(server_url("redis-cluster"))
    try:
        assert DirectLane.for_client(cluster) is None
    finally:
        await cluster.aclose()


async def test_replies_equal_redis_pys(client: Redis) -> None:
    """Bytes, integers, nil and nested lists come back as execute_command gives them; a
    command with a response callback (ZRANGE ... WITHSCORES) is left to redis-py."""
    io = RedisIO(client)
    k = key()
    try:
        await client.rpush(k, "a", "é", "")
        for args in [("LRANGE", k, 0, -1), ("LLEN", k), ("GET", key()), ("LINDEX", k, 1)]:
            assert await io.execute(*args) == await client.execute_command(*args)
        z = key()
        await client.zadd(z, {"m": 1.5})
        assert io._direct is not None
        assert not io._direct.takes("ZRANGE")
        args = ("ZRANGE", z, 0, -1, "WITHSCORES")
        assert await io.execute(*args) == await client.execute_command(*args)
        await client.delete(z)
        assert await io.call(ECHO_KEYS, [k], ["x", 7]) == [k.encode(), b"x", 2]
    finally:
        await client.delete(k)


async def test_an_error_reply_is_its_commands_result_and_the_connection_goes_on(
    client: Redis,
) -> None:
    io = RedisIO(client)
    k = key()
    try:
        await client.set(k, "v")
        wrong_type, fine = await io.send([Command(("LLEN", k)), Command(("GET", k))])
        assert "WRONGTYPE" in str(wrong_type)
        assert fine == b"v"
        assert await io.execute("GET", k) == b"v"
        # Raised by the one-command doors, mapped at the store's boundary.
        mapped = redis_boundary(io.execute)
        with pytest.raises(BackendError, match="WRONGTYPE"):
            await mapped("LLEN", k)
    finally:
        await client.delete(k)


async def test_noscript_loads_and_resends_in_one_more_round_trip(client: Redis) -> None:
    io = RedisIO(client)
    await io.call(ECHO_KEYS, ["k"], ["x"])
    await client.script_flush()
    trips = RoundTrips()
    with trips.counting():
        assert await io.call(ECHO_KEYS, ["k"], ["y"]) == [b"k", b"y", 1]
    # The EVALSHA answered NOSCRIPT, then SCRIPT LOAD + EVALSHA went together.
    assert trips.counts == {"redis": 1, "redis_pipeline": 1}
    results = await io.batch([ECHO_KEYS.command(["k"], ["z"])])
    assert results == [[b"k", b"z", 1]]
    with pytest.raises(NoScriptError):
        await io.execute("EVALSHA", "0" * 40, 0)


async def test_round_trips_are_counted_on_the_lane(client: Redis) -> None:
    io = RedisIO(client)
    trips = RoundTrips()
    with trips.counting():
        await io.execute("GET", key())
        await io.send([Command(("GET", key())), Command(("GET", key()))])
        await io.call(ECHO_KEYS, ["k"], [])
    assert trips.counts == {"redis": 2, "redis_pipeline": 1}


async def test_a_cancelled_call_never_leaves_its_reply_for_the_next(client: Redis) -> None:
    """Cancelled while Redis holds the reply (BLPOP): the connection is dropped, so the
    reply that arrives later cannot be read as the answer of another command."""
    io = RedisIO(client)
    blocked, other = key(), key()
    try:
        await client.set(other, "mine")
        task = asyncio.create_task(io.execute("BLPOP", blocked, 2))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.rpush(blocked, "late")
        for _ in range(20):
            assert await io.execute("GET", other) == b"mine"
    finally:
        await client.delete(blocked, other)


async def test_a_connection_the_server_closed_reconnects(client: Redis) -> None:
    io = RedisIO(client)
    k = key()
    try:
        await client.set(k, "v")
        assert await io.execute("GET", k) == b"v"
        lane = io._direct
        assert lane is not None
        assert lane.idle == 1
        await client.client_kill_filter(_type="normal", skipme=True)
        # The idle connection is dead. As with a connection in redis-py's pool, the first
        # call on it may fail, retryable (the dead socket is noticed when it is read);
        # the lane reconnects for the next.
        (first,) = await asyncio.gather(
            redis_boundary(io.execute)("GET", k), return_exceptions=True
        )
        if isinstance(first, BaseException):
            assert isinstance(first, BackendError)
            assert first.retryable
        else:
            assert first == b"v"
        assert await io.execute("GET", k) == b"v"
        assert await io.execute("GET", k) == b"v"
    finally:
        await client.delete(k)


async def test_a_burst_larger_than_the_pool_queues_and_completes() -> None:
    """More calls at once than connections: every caller gets one in turn (the lane keeps
    none idle while its own callers wait, and none at all from a pool this small)."""
    client = client_from_url(server_url("redis"), max_connections=2, timeout=5)
    io = RedisIO(client)
    k = key()
    try:
        await client.set(k, "v")
        results = await asyncio.gather(*(io.execute("GET", k) for _ in range(40)))
        assert results == [b"v"] * 40
        pool = client.connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= 2
        # And redis-py's own door on the same client is not starved either.
        assert await client.get(k) == b"v"
    finally:
        await client.delete(k)
        await client.aclose()


async def test_idle_connections_are_bounded_and_others_circulate() -> None:
    client = client_from_url(server_url("redis"), max_connections=32, timeout=5)
    io = RedisIO(client)
    k = key()
    try:
        await client.set(k, "v")
        blocked = key()

        async def hold() -> None:
            await io.execute("BLPOP", blocked, 0.05)

        await asyncio.gather(*(hold() for _ in range(32)))
        lane = io._direct
        assert lane is not None
        assert lane.idle <= 32 // 8
        # A user of the same client still gets the rest of the pool.
        results = await asyncio.gather(*(client.get(k) for _ in range(32 - lane.idle)))
        assert results == [b"v"] * (32 - lane.idle)
    finally:
        await client.delete(k)
        await client.aclose()


async def test_a_command_larger_than_the_socket_buffer_is_sent_whole(client: Redis) -> None:
    """A write the kernel does not take at once is drained (redis-py's timed path) before
    the reply is read; the connection stays in step for the next call."""
    length = LuaScript("test_arg_length", "return string.len(ARGV[1])")
    io = RedisIO(client)
    big = "x" * (16 * 1024 * 1024)
    assert await io.call(length, [], [big]) == len(big)
    assert await io.call(length, [], ["abc"]) == 3


# -- coalescing: calls made while another is in flight share one write ---------------------

FAIL = LuaScript("test_fail", "return redis.error_reply('boom')")


async def test_concurrent_calls_share_one_write_and_each_gets_its_own_reply(
    client: Redis,
) -> None:
    io = RedisIO(client)
    lane = io._direct
    assert lane is not None
    k = key()
    await io.call(ECHO_KEYS, [k], ["warm"])  # the script is loaded: no NOSCRIPT resend
    before = lane.writes
    trips = RoundTrips()
    with trips.counting():
        results = await asyncio.gather(
            *(io.call(ECHO_KEYS, [f"{k}:{i}"], [str(i)]) for i in range(30))
        )
    assert results == [[f"{k}:{i}".encode(), str(i).encode(), 1] for i in range(30)]
    # The first call goes alone (nothing in flight); the 29 made meanwhile go together.
    assert lane.writes - before == 2
    assert trips.counts["redis"] == 30  # round trips are still counted per call


async def test_an_error_reply_fails_only_its_own_call(client: Redis) -> None:
    io = RedisIO(client)
    k = key()
    await io.call(ECHO_KEYS, [k], ["warm"])
    await io.call(ECHO_KEYS, [k], ["warm"])
    with pytest.raises(Exception, match="boom"):
        await io.call(FAIL, [], [])
    calls = [io.call(ECHO_KEYS, [k], [str(i)]) for i in range(5)]
    calls.insert(3, io.call(FAIL, [], []))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[3], Exception)
    assert "boom" in str(results[3])
    assert [r for i, r in enumerate(results) if i != 3] == [
        [k.encode(), str(i).encode(), 1] for i in range(5)
    ]


async def test_a_call_cancelled_before_the_write_is_not_sent(client: Redis) -> None:
    io = RedisIO(client)
    lane = io._direct
    assert lane is not None
    blocked, counter = key(), key()
    try:
        # A blocking pop keeps one of the lane's round trips in flight.
        holder = asyncio.create_task(
            lane.roundtrip(pack_commands([("BLPOP", blocked, "0.3")]), 1, coalesce=False)
        )
        await asyncio.sleep(0.05)
        queued = asyncio.create_task(io.execute("INCR", counter))
        await asyncio.sleep(0)  # it runs up to its queued write ...
        queued.cancel()  # ... and is cancelled before the loop writes it
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert await holder == [None]
        assert await client.get(counter) is None
        # The lane is in step afterwards.
        assert await io.execute("INCR", counter) == 1
    finally:
        await client.delete(counter)


async def test_blocking_commands_are_never_coalesced(client: Redis) -> None:
    """WAIT (the lane takes it; the blocking pops have redis-py callbacks and go its way)
    holds its connection: each goes alone, or the calls written after it would wait too."""
    io = RedisIO(client)
    lane = io._direct
    assert lane is not None
    assert blocks("WAIT")
    assert blocks("blpop")
    assert not blocks("EVALSHA")
    before = lane.writes
    # No replica on the test server: WAIT 0 answers 0 at once.
    results = await asyncio.gather(*(io.execute("WAIT", 0, 0) for _ in range(4)))
    assert results == [0] * 4
    assert lane.writes - before == 4


async def test_a_connection_lost_under_a_coalesced_write_fails_each_of_its_calls(
    client: Redis,
) -> None:
    """Every call of the write raises a connection error (each may or may not have run,
    as for a lone call whose reply is lost), and the lane reconnects for the next call."""
    io = RedisIO(client)
    lane = io._direct
    assert lane is not None
    admin = Redis.from_url(server_url("redis"))
    blocked = key()
    try:
        # One call keeps a round trip in flight, so the next five are coalesced; blocking
        # pops (sent here by hand: the lane never coalesces them itself) hold their write
        # on the server until the connections are killed.
        holder = asyncio.create_task(
            lane.roundtrip(pack_commands([("BLPOP", blocked, "2")]), 1, coalesce=False)
        )
        await asyncio.sleep(0.05)
        before = lane.writes
        calls = [
            asyncio.create_task(lane.roundtrip(pack_commands([("BLPOP", blocked, "2")]), 1))
            for _ in range(5)
        ]
        await asyncio.sleep(0.2)
        assert lane.writes - before == 1
        for conn in list(client.connection_pool._in_use_connections):  # this client's only
            host, port = conn._writer.get_extra_info("sockname")[:2]
            await admin.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}")
        results = await asyncio.gather(holder, *calls, return_exceptions=True)
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert await io.execute("INCR", blocked + ":n") == 1
    finally:
        await admin.delete(blocked + ":n")
        await admin.aclose()
