"""A cancel request redis-py swallows under the direct lane must still reach the caller.

The flaky ``test_random_reads_timeouts_and_cancels_from_many_tasks_stay_in_step``
(test_redis_lane_timer_review.py) saw, on a loaded machine, a worker task end normally with
``Task.cancelling() == 1``: its outside ``cancel()`` came in the very turn of the loop in
which a redis-py await of the lane completed (the handshake of a new connection in
``_acquire``, or a send through ``send_packed_command``), both wrapped in
``asyncio.wait_for``; Python 3.11's ``wait_for`` then returns the completed result and
drops the ``CancelledError`` (the request stays counted). The lane went on as if the task
had never been cancelled, and ``asyncio.timeout`` / ``TaskGroup`` above it would wait for
a cancellation that never comes.

Why a fake: a real server cannot make a write or a connect complete in the same turn of
the loop as an outside cancel on demand. Each test uses a connection class whose send
(or connect) does its real work and then waits on a future the test completes, cancelling
the task in the same step, and handles that cancellation as 3.11's ``wait_for`` does
(completed: result returned, cancellation dropped), whatever the Python running the test.
Against a real Redis (``TIERMEM_TEST_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from tests.conftest import server_url
from tiermem.store.backends.redis_scripts import DirectLane, RedisIO, client_from_url, pack_commands


class _Gates:
    """The next awaits to hold (one-shot) and the futures holding them."""

    def __init__(self) -> None:
        self.packed: bytes | None = None  # the send to hold (exactly these bytes)
        self.connect = False  # hold the next connect
        self.held: list[asyncio.Future[None]] = []

    async def hold(self) -> None:
        """Wait for the test, dropping a cancellation that comes once the wait is over,
        as Python 3.11's ``asyncio.wait_for`` does (``if fut.done(): return
        fut.result()``)."""
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(gate)
        try:
            await gate
        except asyncio.CancelledError:
            if gate.done():
                return
            raise


GATES = _Gates()


class _HeldConnection(Connection):
    """A stock connection but for a send or connect the test holds (overriding
    ``send_packed_command`` also makes the lane send through redis-py, as it does for a
    connection with instrumentation, health checks, or a write left buffered)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        await super().send_packed_command(command, check_health)
        if GATES.packed is not None and command == GATES.packed:
            GATES.packed = None
            await GATES.hold()

    async def connect(self) -> None:
        await super().connect()
        if GATES.connect:
            GATES.connect = False
            await GATES.hold()


def _client() -> Redis:
    return client_from_url(
        server_url("redis"), socket_timeout=2.0, connection_class=_HeldConnection
    )


def _lane(redis: Redis) -> DirectLane:
    lane = RedisIO(redis)._direct
    assert lane is not None
    return lane


def _echo() -> tuple[bytes, bytes]:
    token = uuid.uuid4().hex.encode()
    return pack_commands([("ECHO", token)]), token


def _in_use(redis: Redis, lane: DirectLane) -> int:
    return len(redis.connection_pool._in_use_connections) - lane.idle


async def _held() -> asyncio.Future[None]:
    for _ in range(400):
        if GATES.held:
            return GATES.held.pop()
        await asyncio.sleep(0.005)
    raise AssertionError("nothing was held")


async def _cancel_as_it_completes(lane: DirectLane, packed: bytes) -> None:
    task = asyncio.create_task(lane.roundtrip(packed, 1, coalesce=False))
    gate = await _held()
    gate.set_result(None)  # the held await completes ...
    task.cancel()  # ... and the cancel comes in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await task  # the old lane returned the echo here, the task never cancelled


async def _in_step(lane: DirectLane) -> None:
    for _ in range(5):
        packed, token = _echo()
        assert await lane.roundtrip(packed, 1, coalesce=False) == [token]
        assert await lane.roundtrip(packed, 1) == [token]


@pytest.mark.redis
async def test_a_cancel_swallowed_by_a_send_is_raised_and_the_connection_dropped() -> None:
    redis = _client()
    lane = _lane(redis)
    try:
        await _in_step(lane)  # the connection is made (its handshake sends go through)
        packed, _ = _echo()
        GATES.packed = packed
        await _cancel_as_it_completes(lane, packed)
        # The command was sent, its reply never read: the connection is not reused.
        assert _in_use(redis, lane) == 0
        await _in_step(lane)
    finally:
        GATES.__init__()
        await redis.aclose()


@pytest.mark.redis
async def test_a_cancel_swallowed_by_a_new_connections_connect_is_raised() -> None:
    redis = _client()
    lane = _lane(redis)
    try:
        GATES.connect = True
        packed, _ = _echo()
        await _cancel_as_it_completes(lane, packed)  # no idle connection: the pool's new one
        assert _in_use(redis, lane) == 0
        await _in_step(lane)
    finally:
        GATES.__init__()
        await redis.aclose()


@pytest.mark.redis
async def test_a_task_that_kept_an_earlier_cancel_request_is_not_cancelled_again() -> None:
    # A request counted before the lane's await began is not one the await swallowed.
    redis = _client()
    lane = _lane(redis)

    async def worker() -> int:
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(asyncio.CancelledError):  # kept counted: cancelling() is 1
            await asyncio.sleep(10)
        await _in_step(lane)  # new connection, sends through redis-py
        return task.cancelling()

    try:
        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        task.cancel()
        assert await task == 1
    finally:
        await redis.aclose()
