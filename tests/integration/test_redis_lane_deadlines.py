"""The direct lane's read deadlines: one timer per lane and loop instead of an
``asyncio.timeout`` per read (issue #8), with the same behaviour.

A read waits at most ``socket_timeout`` for each reply, counted from when it started
waiting, whatever reads came and went before it (the timer armed for an earlier read must
neither cut a later one short nor let it run on); a timeout disconnects and raises
redis-py's ``TimeoutError``; a cancellation from elsewhere stays a cancellation. Against a
real Redis (``TIERMEM_TEST_REDIS_URL``); a blocking pop with a server-side timeout is a
reply that comes late without holding the server.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.conftest import server_url
from tiermem.store.backends.redis_scripts import DirectLane, RedisIO, client_from_url, pack_commands

PING = pack_commands([("PING",)])


def lane_of(io: RedisIO) -> DirectLane:
    assert io._direct is not None
    return io._direct


async def late_reply(lane: DirectLane, seconds: float) -> list[Any]:
    """A reply that comes after ``seconds`` (BLPOP of an empty list: nil)."""
    command = ("BLPOP", f"tiermem-test-deadlines:{uuid.uuid4().hex}", str(seconds))
    return await lane.roundtrip(pack_commands([command]), 1, coalesce=False)


@pytest.mark.redis
async def test_a_read_is_timed_from_its_own_start_not_from_an_earlier_reads() -> None:
    redis = client_from_url(server_url("redis"), socket_timeout=1.0)
    lane = lane_of(RedisIO(redis))
    loop = asyncio.get_running_loop()
    try:
        start = loop.time()
        while loop.time() - start < 0.7:  # reads that end at once, the first at `start`
            assert await lane.roundtrip(PING, 1) == [b"PONG"]
        # Waits past `start` + 1 s (the first read's deadline), not past its own.
        assert await late_reply(lane, 0.6) == [None]
        with pytest.raises(RedisTimeoutError):
            await late_reply(lane, 3)  # past its own deadline: cut at 1 s
        for _ in range(3):  # the timed-out connection is gone; the lane goes on
            assert await lane.roundtrip(PING, 1) == [b"PONG"]
        assert await late_reply(lane, 0.4) == [None]
        with pytest.raises(RedisTimeoutError):
            await late_reply(lane, 3)  # the timer was armed again for this one
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_reads_in_flight_together_each_keep_their_own_deadline() -> None:
    redis = client_from_url(server_url("redis"), socket_timeout=1.0)
    lane = lane_of(RedisIO(redis))
    try:
        slow = asyncio.create_task(late_reply(lane, 3))
        await asyncio.sleep(0.5)
        quick = asyncio.create_task(late_reply(lane, 0.8))  # ends 1.3 s after `slow` began
        with pytest.raises(RedisTimeoutError):
            await slow
        assert await quick == [None]
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_a_cancelled_read_stays_cancelled_and_its_task_carries_no_request() -> None:
    redis = client_from_url(server_url("redis"), socket_timeout=1.0)
    lane = lane_of(RedisIO(redis))
    try:
        waiting = asyncio.create_task(late_reply(lane, 3))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        async def timed_out() -> int:
            with pytest.raises(RedisTimeoutError):
                await late_reply(lane, 3)
            task = asyncio.current_task()
            assert task is not None
            return task.cancelling()  # the timeout's own cancel request was undone

        assert await asyncio.create_task(timed_out()) == 0
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
    finally:
        await redis.aclose()
