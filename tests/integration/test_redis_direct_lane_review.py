"""Review of the Redis direct lane and the durable store's decoded-turn cache: what a user
of a long-lived process would hit (a pool kept alive by its lane, a cache holding
gigabytes of turns), and the lane's behaviour under timeouts and cancellation.

Against a real Redis (``TIERMEM_TEST_REDIS_URL``, or a private redis-server of the test's
own where the test stops it with SIGSTOP); no fakes.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import tracemalloc
import uuid
import weakref

import pytest
from redis.asyncio import Redis

from tests.backends.redis import fresh_prefix
from tests.conftest import server_url
from tests.integration.conftest import RedisProcess
from tiermem.errors import BackendTimeoutError
from tiermem.store.backends.redis_durable import DECODED_TURNS_MAX_BYTES, RedisDurableStore
from tiermem.store.backends.redis_scripts import (
    Command,
    LuaScript,
    RedisIO,
    client_from_url,
    redis_boundary,
)
from tiermem.testing.backend import text_turn

ECHO = LuaScript("test_lane_review_echo", "return ARGV[1]")


def key() -> str:
    return f"tiermem-test-lane-review:{uuid.uuid4().hex}"


async def test_a_dropped_client_frees_its_pool_and_lane() -> None:
    """A process that builds clients over its life (per tenant, per test, per reload) must
    not keep every pool it ever built: the lanes' registry maps pools weakly, and a lane
    holding its pool strongly kept each one (and its idle connections) forever."""
    redis = client_from_url(server_url("redis"))
    io = RedisIO(redis)
    assert io._direct is not None
    await io.execute("GET", key())
    pool = weakref.ref(redis.connection_pool)
    await redis.aclose()
    del redis, io
    gc.collect()
    assert pool() is None


async def test_the_decoded_turn_cache_is_bounded_in_bytes() -> None:
    """Reading a session of large turns (up to 1 MiB each) must not leave the store
    holding them all: 2048 cached turns could be 2 GiB. Memory retained by the store after
    the reads stays within the cache's byte bound (payloads and decoded copies)."""
    store = RedisDurableStore(client_from_url(server_url("redis")), prefix=fresh_prefix())
    sid = f"s-{uuid.uuid4().hex[:8]}"
    text = "x" * (200 * 1024)
    try:
        for start in range(0, 120, 40):
            await store.append_turns(
                sid, [text_turn(f"{i}:{text}") for i in range(start, start + 40)]
            )
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(2):
                turns = await store.get_turns(sid)
                assert [t.index for t in turns] == list(range(120))
                assert turns[-1].text == f"119:{text}"
                del turns
            gc.collect()
            retained = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # 120 turns of 200 KiB: ~48 MiB retained when every one was kept.
        assert retained < 3 * DECODED_TURNS_MAX_BYTES
        assert store._decoded.held_bytes <= DECODED_TURNS_MAX_BYTES
    finally:
        await store._io.client.delete(*store._keys.durable_session(sid))
        await store._io.client.aclose()


async def test_a_server_that_stops_answering_times_out_and_no_reply_is_read_late(
    redis_process: RedisProcess,
) -> None:
    """A stopped server (SIGSTOP): a command, a pipeline and a write larger than the
    socket buffers each fail with a retryable BackendTimeoutError after ``socket_timeout``;
    once it answers again, the late replies are never read as another call's answer."""
    redis = client_from_url(redis_process.url, socket_timeout=0.5)
    io = RedisIO(redis)
    assert io._direct is not None
    length = LuaScript("test_lane_review_length", "return string.len(ARGV[1])")
    assert redis_process.proc is not None
    pid = redis_process.proc.pid
    try:
        await io.execute("SET", "a", "1")
        await io.call(length, [], ["warm"])
        os.kill(pid, signal.SIGSTOP)
        try:
            calls = [
                lambda: io.execute("GET", "a"),
                lambda: io.send([Command(("GET", "a")), Command(("INCR", "n"))]),
                lambda: io.call(length, [], ["x" * (32 * 1024 * 1024)]),
            ]
            for call in calls:
                with pytest.raises(BackendTimeoutError) as caught:
                    await redis_boundary(call)()
                assert caught.value.retryable
        finally:
            os.kill(pid, signal.SIGCONT)
        await io.execute("SET", "b", "2")
        for _ in range(5):
            assert await io.execute("GET", "a") == b"1"
            assert await io.execute("GET", "b") == b"2"
            assert await io.call(length, [], ["abc"]) == 3
    finally:
        await redis.aclose()


async def test_calls_cancelled_at_any_point_leave_the_pool_whole_and_in_step() -> None:
    """Tasks cancelled wherever they are (waiting for the pool, writing, between the
    replies of a pipeline): no connection stays checked out, and every later call reads
    its own replies."""
    redis = client_from_url(server_url("redis"), max_connections=16, timeout=5)
    io = RedisIO(redis)
    lane = io._direct
    assert lane is not None
    rnd = random.Random(8)

    async def one(tag: str) -> None:
        assert await io.call(ECHO, [], [tag]) == tag.encode()
        replies = await io.send([Command(("ECHO", tag)), Command(("ECHO", f"{tag}b"))])
        assert replies == [tag.encode(), f"{tag}b".encode()]

    try:
        for round_ in range(20):
            tasks = [asyncio.create_task(one(f"{round_}-{i}")) for i in range(48)]
            for _ in range(rnd.randrange(4)):
                await asyncio.sleep(0)
            for task in tasks:
                if rnd.random() < 0.5:
                    task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            failed = [
                o
                for o in outcomes
                if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)
            ]
            assert failed == []
        pool = redis.connection_pool
        assert len(pool._in_use_connections) == lane.idle
        await asyncio.gather(*(one(f"after-{i}") for i in range(64)))
    finally:
        await redis.aclose()


async def test_a_command_name_of_two_words_is_sent_as_redis_py_sends_it(client: Redis) -> None:
    """``RedisIO.execute`` takes what ``execute_command`` takes: redis-py splits a name
    such as "OBJECT ENCODING" into two arguments (hiredis would send one, an unknown
    command)."""
    io = RedisIO(client)
    k = key()
    try:
        await client.set(k, "12")
        for args in [("OBJECT ENCODING", k), ("OBJECT", "ENCODING", k)]:
            assert await io.execute(*args) == await client.execute_command(*args) == b"int"
        assert await io.send([Command(("OBJECT ENCODING", k)), Command(("GET", k))]) == [
            b"int",
            b"12",
        ]
    finally:
        await client.delete(k)
