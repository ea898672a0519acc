"""Review of the direct lane's shared read-deadline timer (commit f928c7c): one timer per
lane and loop instead of an ``asyncio.timeout`` per read, and three fewer coroutine hops.

What must hold as before: a timeout is redis-py's ``TimeoutError`` caused by a builtin
``TimeoutError`` (what ``asyncio.timeout`` raised); a cancellation from elsewhere stays a
cancellation even when the timer fires in the same turn of the loop, and only the timer's
own cancel request is undone; the connection of a timed-out, cancelled or failed read is
given back to the pool disconnected, never reused half-read; the timer does not grow
with reads, nor stay behind a loop. Against a real Redis (``TIERMEM_TEST_REDIS_URL``); a
blocking pop with a server-side timeout is a reply that comes late without holding the
server. Tests look at the lane's private state (its deadlines, the pool's in-use set)
only to check what cannot be seen from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.conftest import server_url
from tiermem.store.backends.redis_scripts import (
    DirectLane,
    RedisIO,
    client_from_url,
    from_us,
    pack_commands,
)

PING = pack_commands([("PING",)])


def lane_of(io: RedisIO) -> DirectLane:
    assert io._direct is not None
    return io._direct


def late(seconds: float) -> bytes:
    """A command whose reply comes after ``seconds`` (BLPOP of an empty list: nil)."""
    key = f"tiermem-test-timer-review:{uuid.uuid4().hex}"
    return pack_commands([("BLPOP", key, str(seconds))])


def in_use(redis: Redis) -> int:
    """Connections the pool has handed out and not had back, but for the lane's idle
    ones (kept out of the pool on purpose)."""
    lane = getattr(redis.connection_pool, "_tiermem_direct_lane", None)
    idle = lane.idle if isinstance(lane, DirectLane) else 0
    return len(redis.connection_pool._in_use_connections) - idle


async def registered(lane: DirectLane) -> Any:
    """The one read of ``lane`` in progress, once it has started."""
    for _ in range(200):
        deadlines = lane._deadlines
        if deadlines is not None and deadlines._reads:
            (read,) = deadlines._reads
            return read
        await asyncio.sleep(0.005)
    raise AssertionError("the read never started")


@pytest.mark.redis
async def test_a_timeout_is_caused_by_a_builtin_timeout_as_before() -> None:
    # Before f928c7c the lane raised redis-py's TimeoutError from asyncio's TimeoutError;
    # the shared timer must not make a CancelledError the cause (a traceback reading
    # "CancelledError ... direct cause of TimeoutError", and code walking the chain for a
    # cancellation, would take a timeout for a cancellation).
    redis = client_from_url(server_url("redis"), socket_timeout=0.3)
    lane = lane_of(RedisIO(redis))
    try:
        with pytest.raises(RedisTimeoutError) as info:
            await lane.roundtrip(late(3), 1, coalesce=False)
        assert type(info.value.__cause__) is TimeoutError
        assert isinstance(info.value.__cause__.__cause__, asyncio.CancelledError)
        assert in_use(redis) == 0
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
    finally:
        await redis.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("first", ["timer", "outside"])
async def test_an_outside_cancel_in_the_timers_turn_stays_a_cancellation(first: str) -> None:
    # The timer and a cancel from elsewhere reach the reading task in one turn of the loop
    # (both due at the read's deadline, in either order): the caller gets CancelledError,
    # its task keeps exactly the outside request, and the connection goes back to the pool
    # disconnected, not kept half-read.
    redis = client_from_url(server_url("redis"), socket_timeout=0.5)
    lane = lane_of(RedisIO(redis))
    loop = asyncio.get_running_loop()
    seen: list[int] = []
    try:
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
        (conn,) = lane._idle

        async def caller() -> None:
            try:
                await lane.roundtrip(late(3), 1, coalesce=False)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                assert task is not None
                seen.append(task.cancelling())
                raise

        task = asyncio.create_task(caller())
        read = await registered(lane)
        deadlines = lane._deadlines
        assert deadlines is not None
        both: list[str] = []

        def fire() -> None:
            # What the shared timer does at the read's deadline, now: its handle taken
            # over (cancelled) so that it fires only here.
            both.append("timer")
            if deadlines._timer is not None:
                deadlines._timer.cancel()
            read.deadline = loop.time()
            deadlines._fire()

        def cancel() -> None:
            both.append("outside")
            task.cancel()

        # Both in one turn, before the task runs again.
        when = read.deadline - 0.1
        if first == "timer":
            loop.call_at(when, lambda: (fire(), cancel()))
        else:
            loop.call_at(when, lambda: (cancel(), fire()))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert both == ([first, "outside"] if first == "timer" else ["outside", "timer"])
        assert read.expired
        assert seen == [1]  # the outside request only: the timer's was undone
        assert in_use(redis) == 0
        assert not conn.is_connected  # disconnected: its late reply is never read
        assert conn not in lane._idle
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_a_timeout_in_a_task_already_cancelled_once_is_a_timeout() -> None:
    # A task that caught a cancellation and goes on (cleanup) carries cancelling() == 1;
    # its read timing out is a timeout, as asyncio.timeout made it before f928c7c (it
    # compares with the count at its start, as in the Python 3.11.7 here), and the count is left
    # as it was.
    redis = client_from_url(server_url("redis"), socket_timeout=0.3)
    lane = lane_of(RedisIO(redis))

    async def cleanup() -> int:
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)  # swallowed: the request stays counted
        assert task.cancelling() == 1
        with pytest.raises(RedisTimeoutError):
            await lane.roundtrip(late(3), 1, coalesce=False)
        return task.cancelling()

    try:
        task = asyncio.create_task(cleanup())
        await asyncio.sleep(0.05)
        task.cancel()
        assert await task == 1
        assert in_use(redis) == 0
    finally:
        await redis.aclose()


@pytest.mark.redis
@pytest.mark.asyncio_internals
async def test_the_timer_is_one_handle_and_forgets_finished_reads() -> None:
    redis = client_from_url(server_url("redis"), socket_timeout=0.5)
    lane = lane_of(RedisIO(redis))
    loop = asyncio.get_running_loop()

    def fires() -> int:
        deadlines = lane._deadlines
        assert deadlines is not None
        scheduled = loop._scheduled  # type: ignore[attr-defined]
        return sum(
            1
            for handle in scheduled
            if not handle.cancelled() and getattr(handle._callback, "__self__", None) is deadlines
        )

    try:
        for _ in range(300):
            assert await lane.roundtrip(PING, 1) == [b"PONG"]
        many = [lane.roundtrip(PING, 1) for _ in range(500)]  # coalesced, many writes
        assert await asyncio.gather(*many) == [[b"PONG"]] * 500
        deadlines = lane._deadlines
        assert deadlines is not None
        assert not deadlines._reads
        assert fires() == 1  # one armed handle, left armed, not one per read
        scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.sleep(0.7)  # past every deadline: it fires once, finds nothing
        assert fires() == 0
        assert len(loop._scheduled) < scheduled  # type: ignore[attr-defined]
        # Reads from different tasks, one timing out among quick ones.
        slow = asyncio.create_task(lane.roundtrip(late(3), 1, coalesce=False))
        quick = [asyncio.create_task(lane.roundtrip(late(0.2), 1)) for _ in range(5)]
        assert await asyncio.gather(*quick) == [[None]] * 5
        with pytest.raises(RedisTimeoutError):
            await slow
        assert not deadlines._reads
        assert in_use(redis) == 0
    finally:
        await redis.aclose()


@pytest.mark.redis
def test_each_loop_gets_its_own_timer_and_a_closed_loop_keeps_none() -> None:
    # asyncio.run again and again (as pytest-asyncio's function-scoped loops): each run's
    # client and lane time their reads on their own loop, timeouts still fire.
    url = server_url("redis")
    lanes: list[DirectLane] = []

    async def one_run() -> None:
        redis = client_from_url(url, socket_timeout=0.3)
        lane = lane_of(RedisIO(redis))
        lanes.append(lane)
        try:
            assert await lane.roundtrip(PING, 1) == [b"PONG"]
            with pytest.raises(RedisTimeoutError):
                await lane.roundtrip(late(3), 1, coalesce=False)
            assert lane._deadlines is not None
            assert lane._deadlines.loop is asyncio.get_running_loop()
            assert not lane._deadlines._reads
        finally:
            await redis.aclose()

    for _ in range(3):
        asyncio.run(one_run())
    assert len({id(lane._deadlines) for lane in lanes}) == 3


@pytest.mark.redis
async def test_a_connection_killed_mid_read_goes_back_to_the_pool() -> None:
    redis = client_from_url(server_url("redis"), socket_timeout=2.0)
    admin = client_from_url(server_url("redis"))
    lane = lane_of(RedisIO(redis))
    try:
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
        waiting = asyncio.create_task(lane.roundtrip(late(3), 1, coalesce=False))
        await registered(lane)
        await admin.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        with pytest.raises(RedisConnectionError):
            await waiting
        deadlines = lane._deadlines
        assert deadlines is not None
        assert not deadlines._reads
        assert in_use(redis) == 0
        assert await lane.roundtrip(PING, 1) == [b"PONG"]
    finally:
        await redis.aclose()
        await admin.aclose()


def test_from_us_matches_the_keyword_constructor() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    rng = random.Random(8)
    low = -62135596800 * 10**6  # 0001-01-01
    high = 253402300799 * 10**6 + 999999  # 9999-12-31 23:59:59.999999
    values = [0, 1, -1, low, high] + [rng.randint(low, high) for _ in range(2000)]
    for value in values:
        expected = epoch + timedelta(microseconds=value)
        assert from_us(value) == expected
        assert from_us(str(value)) == expected
        assert from_us(str(value).encode()) == expected
    for value in (low - 1, high + 1, 10**30):
        with pytest.raises(OverflowError):
            epoch + timedelta(microseconds=value)
        with pytest.raises(OverflowError):
            from_us(value)


@pytest.mark.redis
async def test_random_reads_timeouts_and_cancels_from_many_tasks_stay_in_step() -> None:
    # Many tasks at once, each a random run of quick calls (coalesced), replies late but in
    # time, and replies too late (each alone, as RedisIO sends blocking commands), some
    # tasks cancelled from outside at random moments. Every quick call gets its own
    # echo, every late reply in time comes, every one too late times out, a cancelled
    # task ends cancelled, a task not cancelled carries no cancel request at its end, and
    # no connection is kept from the pool.
    redis = client_from_url(server_url("redis"), socket_timeout=0.25)
    lane = lane_of(RedisIO(redis))
    rng = random.Random(11)
    counts: dict[int, int] = {}

    async def worker(number: int, plan: list[str]) -> None:
        for step, what in enumerate(plan):
            if what == "quick":
                token = f"{number}:{step}".encode()
                assert await lane.roundtrip(pack_commands([("ECHO", token)]), 1) == [token]
            elif what == "in time":
                assert await lane.roundtrip(late(0.05), 1, coalesce=False) == [None]
            else:
                with pytest.raises(RedisTimeoutError):
                    await lane.roundtrip(late(1), 1, coalesce=False)
        task = asyncio.current_task()
        assert task is not None
        counts[number] = task.cancelling()

    try:
        for _ in range(3):
            tasks: list[asyncio.Task[None]] = []
            for number in range(40):
                plan = rng.choices(["quick", "in time", "too late"], [6, 2, 1], k=6)
                tasks.append(asyncio.create_task(worker(number, plan)))
            victims = set(rng.sample(range(len(tasks)), 10))
            for index in sorted(victims):
                await asyncio.sleep(rng.uniform(0, 0.1))
                tasks[index].cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for index, outcome in enumerate(outcomes):
                if isinstance(outcome, asyncio.CancelledError):
                    assert index in victims
                else:
                    assert outcome is None, repr(outcome)
            assert all(count == 0 for count in counts.values())
            counts.clear()
            assert in_use(redis) == 0
            deadlines = lane._deadlines
            assert deadlines is not None
            assert not deadlines._reads
        for _ in range(20):  # every connection the lane keeps answers in step
            token = uuid.uuid4().hex.encode()
            assert await lane.roundtrip(pack_commands([("ECHO", token)]), 1) == [token]
    finally:
        await redis.aclose()
