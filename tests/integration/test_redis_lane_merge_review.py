"""Review of the direct lane's coalesced writes (calls made while another round trip is in
flight share one write on one connection): every reply must reach its own caller, under
error replies, cancellations, timeouts, lost connections, large replies and RESP3.

Against a real Redis (``TIERMEM_TEST_REDIS_URL``); no fakes. Blocking pops hold a round
trip in flight where a test needs the next calls coalesced.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from tests.conftest import server_url
from tiermem.store.backends.redis_scripts import (
    Command,
    DirectLane,
    LuaScript,
    RedisIO,
    client_from_url,
    pack_commands,
)

ECHO = LuaScript("test_merge_review_echo", "return {KEYS[1], ARGV[1]}")
SLOW = LuaScript(
    "test_merge_review_slow",
    """
-- Busy for ARGV[1] microseconds of the server's clock, then answers ARGV[2].
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return ARGV[2]
""",
)


def key() -> str:
    return f"tiermem-test-merge-review:{uuid.uuid4().hex}"


def lane_of(io: RedisIO) -> DirectLane:
    assert io._direct is not None
    return io._direct


def hold(lane: DirectLane, seconds: float) -> asyncio.Task[list[Any]]:
    """A blocking pop that keeps one of the lane's round trips in flight for ``seconds``."""
    return asyncio.create_task(
        lane.roundtrip(pack_commands([("BLPOP", key(), str(seconds))]), 1, coalesce=False)
    )


async def test_unpaired_commands_never_take_the_lane(client: Redis) -> None:
    """SUBSCRIBE answers once per channel: coalesced with other calls, its second answer
    went to the next caller (a GET got a subscribe confirmation, the GET after it the
    error meant for that one). Such commands go redis-py's way; the GETs get their own."""
    io = RedisIO(client)
    lane = lane_of(io)
    k = key()
    await io.execute("APPEND", k, "mine")
    holder = hold(lane, 0.3)
    await asyncio.sleep(0.05)
    calls: list[Any] = [io.execute("GET", k) for _ in range(4)]
    calls.insert(1, io.execute("SUBSCRIBE", k + ":c1", k + ":c2"))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 1] == [b"mine"] * 4, results
    await holder
    # Every connection of the lane still answers its own caller.
    assert await asyncio.gather(*(io.execute("GET", k) for _ in range(20))) == [b"mine"] * 20
    await client.delete(k)
    for name in ("SUBSCRIBE", "psubscribe", "MONITOR", "CLIENT", "HELLO"):
        assert not lane.takes(name), name
    assert lane.takes("GET")


async def test_the_first_caller_of_a_coalesced_write_does_not_wait_for_the_others(
    client: Redis,
) -> None:
    """Replies were handed out only once the whole write was read: a caller whose reply
    had come waited for every later call of the write (up to 64), and a connection lost
    after its reply failed it too (a call that ran reported as failed). Each caller now
    gets its replies as they are read."""
    io = RedisIO(client)
    lane = lane_of(io)
    admin = Redis.from_url(server_url("redis"))
    counter, blocked = key(), key()
    try:
        holder = hold(lane, 0.2)
        await asyncio.sleep(0.05)
        first = asyncio.create_task(io.execute("INCR", counter))
        # Coalesced with the INCR (coalesce=True, by hand: the lane never coalesces a
        # blocking pop itself), it holds the write's later replies on the server.
        later = asyncio.create_task(lane.roundtrip(pack_commands([("BLPOP", blocked, "3")]), 1))
        done, _ = await asyncio.wait({first, later}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {first}
        assert await first == 1
        await holder
        # The connection is lost under the later call: only it fails.
        idle = set(map(id, lane._idle))
        for conn in list(client.connection_pool._in_use_connections):
            if id(conn) in idle:
                continue
            host, port = conn._writer.get_extra_info("sockname")[:2]
            await admin.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}")
        with pytest.raises(RedisConnectionError):
            await later
        assert await io.execute("INCR", counter) == 2
    finally:
        await admin.delete(counter)
        await admin.aclose()


async def test_a_coalesced_write_of_slow_calls_is_timed_per_reply() -> None:
    """One ``socket_timeout`` covered all the replies of a write: six calls of 0.3 s each,
    coalesced, timed out together (1.8 s > 1 s) though the server answered each 0.3 s
    after the one before. As redis-py does, the timeout bounds the wait for each reply."""
    redis = client_from_url(server_url("redis"), socket_timeout=1.0)
    io = RedisIO(redis)
    lane = lane_of(io)
    try:
        await io.call(SLOW, [], [0, "warm"])  # loaded: no NOSCRIPT resend in the write
        holder = hold(lane, 0.2)
        await asyncio.sleep(0.05)
        before = lane.writes
        # 20 KiB of padding each: the server reads a write 16 KiB at a time, so it runs
        # the calls and sends their replies one by one (a write it reads whole, it
        # answers whole, after the last call: no client timer helps that).
        pad = "p" * 20_000
        results = await asyncio.gather(
            *(io.call(SLOW, [], [300_000, str(i), pad]) for i in range(6)),
            return_exceptions=True,
        )
        assert results == [str(i).encode() for i in range(6)]
        assert lane.writes - before == 1  # they did share one write
        await holder
    finally:
        await redis.aclose()


async def test_a_call_cancelled_while_its_write_waits_for_a_connection_is_not_sent() -> None:
    """A coalesced write that must wait for a pooled connection was packed before the
    wait: a caller cancelled meanwhile (a request given up after a long queue) still had
    its command run on the server once a connection came free."""
    redis = client_from_url(server_url("redis"), max_connections=2)  # the lane keeps none
    io = RedisIO(redis)
    lane = lane_of(io)
    counter, other = key(), key()
    try:
        holders = [hold(lane, 0.4), hold(lane, 0.4)]  # the whole pool
        await asyncio.sleep(0.05)
        cancelled = asyncio.create_task(io.execute("INCR", counter))
        kept = asyncio.create_task(io.execute("INCR", other))
        await asyncio.sleep(0.05)  # queued, flushed, its write waiting for the pool
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.gather(*holders)
        assert await kept == 1
        assert await io.execute("GET", counter) is None
        assert await io.execute("GET", other) == b"1"
    finally:
        await redis.delete(counter, other)
        await redis.aclose()


async def test_error_replies_inside_a_coalesced_write_reach_only_their_callers(
    client: Redis,
) -> None:
    """WRONGTYPE, a script error and NOSCRIPT (after SCRIPT FLUSH: the EVALSHA falls back
    to SCRIPT LOAD and a resend, itself coalesced) amid plain calls and pipelines."""
    io = RedisIO(client)
    lane = lane_of(io)
    k = key()
    await io.execute("RPUSH", k + ":list", "x")
    await io.execute("SCRIPT", "FLUSH")
    holder = hold(lane, 0.3)
    await asyncio.sleep(0.05)
    before = lane.writes
    calls: list[Any] = []
    for i in range(12):
        calls.append(io.call(ECHO, [f"{k}:{i}"], [str(i)]))
        calls.append(io.execute("GET", k + ":list"))  # WRONGTYPE
        calls.append(io.execute("EVAL", "return redis.error_reply('boom')", 0))
        calls.append(io.send([Command(("SET", f"{k}:{i}", str(i))), Command(("GET", f"{k}:{i}"))]))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert lane.writes - before < len(calls)  # coalesced
    for i in range(12):
        echo, wrongtype, boom, pipeline = results[4 * i : 4 * i + 4]
        assert echo == [f"{k}:{i}".encode(), str(i).encode()]
        assert isinstance(wrongtype, ResponseError)
        assert "WRONGTYPE" in str(wrongtype)
        assert isinstance(boom, ResponseError)
        assert "boom" in str(boom)
        assert not isinstance(boom, NoScriptError)
        assert pipeline[1] == str(i).encode()
    await holder


async def test_large_replies_and_empty_calls_in_a_coalesced_write(client: Redis) -> None:
    """Replies of several MiB (read in many chunks) between small ones, and a call of no
    command at all, each reach their own caller."""
    io = RedisIO(client)
    lane = lane_of(io)
    k = key()
    big = {i: bytes([65 + i]) * (3 * 1024 * 1024 + i) for i in range(3)}
    for i, value in big.items():
        await io.execute("APPEND", f"{k}:{i}", value)
    holder = hold(lane, 0.3)
    await asyncio.sleep(0.05)
    calls: list[Any] = []
    for i in range(3):
        calls.append(io.execute("GET", f"{k}:{i}"))
        calls.append(io.send([]))
        calls.append(io.call(ECHO, [k], [str(i)]))
    results = await asyncio.gather(*calls)
    for i in range(3):
        assert results[3 * i] == big[i]
        assert results[3 * i + 1] == []
        assert results[3 * i + 2] == [k.encode(), str(i).encode()]
    await holder
    await client.delete(*(f"{k}:{i}" for i in range(3)))


@pytest.mark.parametrize(("protocol", "health_checks"), [(2, 0), (3, 0), (2, 30)])
async def test_random_cancellations_leave_every_connection_in_step(
    protocol: int, health_checks: int
) -> None:
    """50 tasks x 30 rounds of SET+GET, script calls and pipelines on unique keys, with
    tasks cancelled at random awaits (queued, written, mid-read) and a small pool; then
    every call on every pooled connection must get its own value back. With health
    checks, the lane reads through redis-py's ``read_response`` instead."""
    redis = client_from_url(
        server_url("redis"),
        max_connections=16,
        protocol=protocol,
        health_check_interval=health_checks,
    )
    io = RedisIO(redis)
    lane = lane_of(io)
    rng = random.Random(protocol + health_checks)
    base = key()
    wrong: list[Any] = []

    async def worker(t: int) -> None:
        for r in range(30):
            k, v = f"{base}:{t}:{r}", f"{t}:{r}:{rng.random()}"
            kind = rng.randrange(3)
            if kind == 0:
                await io.execute("SET", k, v)
                got: Any = await io.execute("GET", k)
                if got != v.encode():
                    wrong.append((k, v, got))
            elif kind == 1:
                got = await io.call(ECHO, [k], [v])
                if got != [k.encode(), v.encode()]:
                    wrong.append((k, v, got))
            else:
                got = await io.send([Command(("SET", k, v)), Command(("GET", k))])
                if got[1] != v.encode():
                    wrong.append((k, v, got))

    async def cancel_some(tasks: list[asyncio.Task[None]]) -> None:
        while any(not t.done() for t in tasks):
            await asyncio.sleep(rng.random() * 0.002)
            alive = [t for t in tasks if not t.done()]
            if alive and rng.random() < 0.5:
                rng.choice(alive).cancel()

    try:
        tasks = [asyncio.create_task(worker(t)) for t in range(50)]
        await asyncio.gather(cancel_some(tasks), *tasks, return_exceptions=True)
        assert lane.writes > 0
        cancelled = sum(t.cancelled() for t in tasks)
        assert 0 < cancelled < 50  # some cancelled, some ran to the end

        async def check(t: int) -> None:
            for r in range(30):
                k = f"{base}:check:{t}:{r}"
                await io.execute("SET", k, str(t * 100 + r))
                got = await io.execute("GET", k)
                if got != str(t * 100 + r).encode():
                    wrong.append((k, got))

        await asyncio.gather(*(check(t) for t in range(50)))
        assert wrong == []
    finally:
        await redis.aclose()


async def test_resp3_push_messages_amid_replies_are_not_replies() -> None:
    """RESP3: an invalidation push (client-side caching) arriving before and between the
    replies of a write is handed to redis-py's handler, never to a caller as a reply."""
    redis = client_from_url(server_url("redis"), protocol=3)
    io = RedisIO(redis)
    lane = lane_of(io)
    admin = Redis.from_url(server_url("redis"))
    k = key()
    try:
        await admin.set(k, "v0")
        pool = redis.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        await conn.send_command("CLIENT", "TRACKING", "ON")
        assert await conn.read_response() == b"OK"
        await conn.send_command("GET", k)
        assert await conn.read_response() == b"v0"  # k is tracked on this connection
        await admin.set(k, "v1")  # the server pushes an invalidation to the connection
        await asyncio.sleep(0.05)
        packed = pack_commands([("GET", k), ("SET", k, "v2"), ("GET", k)])
        assert await lane._exchange(packed, 3, conn) == [b"v1", b"OK", b"v2"]
        await admin.set(k, "v3")  # tracked again by the GET: another push
        await asyncio.sleep(0.05)
        assert await lane._exchange(pack_commands([("GET", k)]), 1, conn) == [b"v3"]
    finally:
        await admin.delete(k)
        await admin.aclose()
        await redis.aclose()


async def test_the_replies_of_a_caller_cancelled_after_the_write_are_dropped(
    client: Redis,
) -> None:
    """A caller cancelled once its command is written: its reply is read and dropped, and
    the caller after it in the write gets its own (not the cancelled one's)."""
    io = RedisIO(client)
    lane = lane_of(io)
    blocked, counter = key(), key()
    try:
        holder = hold(lane, 0.3)
        await asyncio.sleep(0.05)
        # Coalesced by hand (the lane never coalesces a blocking pop itself): its reply
        # comes first in the write, 0.3 s after it.
        gone = asyncio.create_task(lane.roundtrip(pack_commands([("BLPOP", blocked, "0.3")]), 1))
        after = asyncio.create_task(io.execute("INCR", counter))
        await asyncio.sleep(0.1)  # both written, the pop blocking on the server
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await after == 1
        await holder
        results = await asyncio.gather(*(io.execute("INCR", counter) for _ in range(10)))
        assert sorted(results) == list(range(2, 12))
    finally:
        await client.delete(counter)
