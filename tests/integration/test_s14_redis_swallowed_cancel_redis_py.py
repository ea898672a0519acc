"""A cancel request redis-py swallows outside the direct lane must still reach the caller.

Python 3.11's ``asyncio.wait_for``, around every redis-py send (``socket_timeout`` set, as
tiermem's clients have it), returns the completed send when the task is cancelled in the
loop turn the send completes: the request stays counted in ``Task.cancelling()`` but no
``CancelledError`` is raised, redis-py reads the reply and the call returns normally. The
direct lane guards its own awaits (test_s12_redis_lane_swallowed_cancel.py); these tests
cover the awaits into redis-py of :class:`RedisIO` itself: plain commands the lane does
not take (a response callback: SET, ZRANGE...), pipelines, EVALSHA and SCRIPT LOAD on a
client the lane does not serve (redis-py retries on), the WAIT pipeline, and on a Redis
Cluster the commands and scripts (its pipelines and per-node WAIT pipelines, which send
from tasks gathered under the caller, raised the cancellation already).

How: ``Connection._send_packed_command`` (the coroutine redis-py's ``wait_for`` runs as
its own task) is wrapped so that, once a send carrying :data:`MARK` is written, it
cancels the calling task; the send then completes in that same step, and the real
``wait_for`` of the running Python swallows the cancellation (3.11; 3.12 raises it
anyway, and the tests then pass on old code too). Against a real Redis
(``TIERMEM_TEST_REDIS_URL``, ``TIERMEM_TEST_REDIS_CLUSTER_URL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from tests.conftest import server_url
from tiermem.clock import SystemClock
from tiermem.store.backends.redis import RedisHotStore
from tiermem.store.backends.redis_scripts import (
    CancelGuard,
    Command,
    LuaScript,
    RedisClient,
    RedisIO,
    ReplicaWait,
    client_from_url,
)

MARK = b"swallow-me"
"""The bytes a send must carry to be the one after which the caller is cancelled."""

Hook = Callable[[], object]


class _Cancels:
    """What to do (once) when a send carrying :data:`MARK` has been written."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.hook: Hook | None = None
        self.fired = 0


CANCELS = _Cancels()


@pytest.fixture(autouse=True)
def _hooked_sends(monkeypatch: pytest.MonkeyPatch) -> Iterable[None]:
    stock = Connection._send_packed_command

    async def send(self: Connection, command: Iterable[bytes]) -> None:
        parts = list(command)
        await stock(self, parts)
        hook = CANCELS.hook
        if hook is not None and any(MARK in part for part in parts):
            CANCELS.hook = None
            CANCELS.fired += 1
            hook()  # the send completes in this same step

    monkeypatch.setattr(Connection, "_send_packed_command", send)
    yield
    CANCELS.reset()


def _key() -> str:
    return f"s14h1:{{{uuid.uuid4().hex}}}:{MARK.decode()}"


def _standalone(*, lane: bool = True) -> RedisClient:
    # redis-py retries on: no direct lane, every call goes through redis-py.
    retry: dict[str, Any] = {} if lane else {"retry": Retry(NoBackoff(), 1)}
    return client_from_url(server_url("redis"), socket_timeout=2.0, **retry)


async def _cancelled_as_the_send_completes(call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    task = asyncio.create_task(call())
    CANCELS.hook = task.cancel
    with pytest.raises(asyncio.CancelledError):
        await task  # the old RedisIO returned the reply here, the task never cancelled
    assert CANCELS.fired == 1


SCRIPT = LuaScript("s14h1-echo", "return ARGV[1]")

Operation = Callable[[RedisIO, str], Coroutine[Any, Any, Any]]
OPERATIONS: dict[str, tuple[bool, Operation]] = {
    # name: (the client has a direct lane, the call)
    "plain command": (True, lambda io, key: io.execute("SET", key, MARK)),
    "pipeline": (
        True,
        lambda io, key: io.send([Command(("SET", key, MARK)), Command(("EXPIRE", key, 60))]),
    ),
    "batch": (True, lambda io, key: io.batch([Command(("SET", key, MARK))])),
    "evalsha": (False, lambda io, key: io.call(SCRIPT, [key], [MARK])),
    "plain command, no lane": (False, lambda io, key: io.execute("GET", key)),
    "script load": (
        False,
        lambda io, key: io.load(LuaScript("s14h1-load", f"return '{MARK.decode()}{key}'")),
    ),
    "pipeline with WAIT": (
        False,
        lambda io, key: io.send_waited([Command(("SET", key, MARK))], ReplicaWait(1, 1)),
    ),
}


@pytest.mark.redis
@pytest.mark.parametrize("name", list(OPERATIONS))
async def test_a_cancel_swallowed_by_a_redis_py_send_reaches_the_caller(name: str) -> None:
    lane, operation = OPERATIONS[name]
    client = _standalone(lane=lane)
    io = RedisIO(client)
    assert (io._direct is not None) is lane
    try:
        await io.load(SCRIPT)
        key = _key()
        await _cancelled_as_the_send_completes(lambda: operation(io, key))
        # The reply was read: the connection is in step for the next call.
        assert await io.execute("SET", key, b"after") is True
        assert await io.execute("GET", key) == b"after"
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_an_error_reply_after_a_swallowed_cancel_raises_the_cancellation() -> None:
    client = _standalone()
    io = RedisIO(client)
    try:
        task = asyncio.create_task(io.execute("SET", _key(), MARK, "NOT-AN-OPTION"))
        CANCELS.hook = task.cancel
        with pytest.raises(asyncio.CancelledError) as caught:
            await task  # the old RedisIO raised the ResponseError: the cancel was lost
        assert isinstance(caught.value.__cause__, ResponseError)
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_a_users_timeout_around_a_store_call_fires() -> None:
    # What a user sees: asyncio.timeout expiring as the store's send completes. The old
    # store returned the snapshot and the timeout never fired.
    client = _standalone(lane=False)
    store = RedisHotStore(client, clock=SystemClock(), prefix=f"s14h1{uuid.uuid4().hex[:6]}")
    session_id = f"{MARK.decode()}-{uuid.uuid4().hex}"
    loop = asyncio.get_running_loop()

    async def load_within_a_timeout() -> Any:
        async with asyncio.timeout(None) as timeout:
            CANCELS.hook = lambda: timeout.reschedule(loop.time())
            return await store.load(session_id)

    try:
        assert await store.load(session_id) is None
        with pytest.raises(TimeoutError):
            await load_within_a_timeout()
        assert CANCELS.fired == 1
        assert await store.load(session_id) is None
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_a_task_that_kept_an_earlier_cancel_request_is_not_cancelled_again() -> None:
    # A request counted before the call began is not one redis-py swallowed.
    client = _standalone()
    io = RedisIO(client)

    async def worker() -> int:
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(asyncio.CancelledError):  # kept counted: cancelling() is 1
            await asyncio.sleep(10)
        key = _key()
        assert await io.execute("SET", key, b"v") is True
        assert await io.send([Command(("GET", key)), Command(("SET", key, b"w"))]) == [
            b"v",
            True,
        ]
        return task.cancelling()

    try:
        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        task.cancel()
        assert await task == 1
    finally:
        await client.aclose()


async def test_the_guard_passes_results_errors_and_cancellations_through() -> None:
    async def body(outcome: BaseException | None) -> str:
        with CancelGuard():
            await asyncio.sleep(0)
            if outcome is not None:
                raise outcome
            return "done"

    assert await body(None) == "done"
    with pytest.raises(KeyError):
        await body(KeyError("k"))
    with pytest.raises(asyncio.CancelledError):
        await body(asyncio.CancelledError())


async def test_the_guard_raises_a_request_counted_while_it_ran() -> None:
    async def body(outcome: Exception | None) -> str:
        with CancelGuard():
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)  # swallowed, as 3.11's wait_for does
            if outcome is not None:
                raise outcome
            return "done"

    with pytest.raises(asyncio.CancelledError):
        await body(None)
    with pytest.raises(asyncio.CancelledError) as caught:
        await body(KeyError("k"))
    assert isinstance(caught.value.__cause__, KeyError)


# The two pipelines send from child tasks under asyncio.gather, which raises the caller's
# cancel itself: they passed before the guard too, and are kept as regression guards.
CLUSTER_OPERATIONS: dict[str, Operation] = {
    "plain command": lambda io, key: io.execute("SET", key, MARK),
    "evalsha": lambda io, key: io.call(SCRIPT, [key], [MARK]),
    "pipeline": lambda io, key: io.send([Command(("SET", key, MARK))]),
    "per-node pipeline with WAIT": lambda io, key: io.send_waited(
        [Command(("SET", key, MARK))], ReplicaWait(1, 1)
    ),
}


@pytest.mark.redis
@pytest.mark.parametrize("name", list(CLUSTER_OPERATIONS))
async def test_a_cancel_swallowed_on_a_cluster_reaches_the_caller(name: str) -> None:
    client = client_from_url(server_url("redis-cluster"), cluster=True, socket_timeout=2.0)
    io = RedisIO(client)
    try:
        await io.load(SCRIPT)
        key = _key()
        await io.execute("GET", key)  # the slot map learned, the node's connection made
        await _cancelled_as_the_send_completes(lambda: CLUSTER_OPERATIONS[name](io, key))
        assert await io.execute("SET", key, b"after") is True
        assert await io.execute("GET", key) == b"after"
    finally:
        await client.aclose()
