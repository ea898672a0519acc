"""DynamoDB stores given no aioboto3 session share one per event loop (session 14, H3).

A new session parses botocore's endpoint and service-model JSON again and resolves
credentials again for its first client; each store made its own, so a service with both
tiers on DynamoDB paid it twice, and every further service again. The store tests run
against DynamoDB Local (``TIERMEM_TEST_DYNAMODB_URL``); the per-loop tests need no server.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aioboto3
import pytest

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends import dynamodb_table
from tiermem.store.backends.dynamodb import DynamoDBDurableStore, DynamoDBHotStore
from tiermem.store.backends.dynamodb_table import default_session
from tiermem.testing.backend import fresh_id


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every aioboto3 session made from here on."""
    sessions: list[Any] = []

    class Counted(aioboto3.Session):  # type: ignore[misc]  # aioboto3 has no type hints
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sessions.append(self)

    monkeypatch.setattr(aioboto3, "Session", Counted)
    return sessions


@pytest.mark.dynamodb
async def test_stores_built_without_a_session_share_one(made: list[Any]) -> None:
    endpoint = server_url("dynamodb")
    table = await shared_table(endpoint)
    made.clear()  # the shared table may have just been created (with the tests' session)
    clock = FakeClock()
    hot = DynamoDBHotStore(table, clock=clock, endpoint_url=endpoint, region_name="us-east-1")
    durable = DynamoDBDurableStore(
        table, clock=clock, endpoint_url=endpoint, region_name="us-east-1"
    )
    try:
        assert await hot.get_shared(fresh_id("absent")) is None  # opens its client
        assert await durable.get_session(fresh_id("absent")) is None
    finally:
        await hot.aclose()
        await durable.aclose()
    assert len(made) == 1  # two before: one per store

    # A whole service built from settings, later in the same loop: no new session either.
    settings = TierMemSettings(
        hot_backend="dynamodb",
        durable_backend="dynamodb",
        dynamodb_table=table,
        dynamodb_endpoint_url=endpoint,
        aws_region="us-east-1",
    )
    async with MemoryService.from_settings(settings) as memory:
        await memory.session(fresh_id("started"), user_id="u-default-session")
    assert len(made) == 1


@pytest.mark.dynamodb
async def test_a_store_given_a_session_uses_it(made: list[Any]) -> None:
    endpoint = server_url("dynamodb")
    table = await shared_table(endpoint)
    given = dynamodb_session()
    made.clear()
    store = DynamoDBDurableStore(table, clock=FakeClock(), endpoint_url=endpoint, session=given)
    try:
        assert await store.get_session(fresh_id("absent")) is None
    finally:
        await store.aclose()
    assert made == []  # the default session was not made


def _in_new_loop(loops: list[asyncio.AbstractEventLoop]) -> Any:
    """default_session() in a fresh event loop on a thread of its own; keeps the loop."""
    result: list[Any] = []

    async def take() -> None:
        loops.append(asyncio.get_running_loop())
        result.append(default_session())

    thread = threading.Thread(target=lambda: asyncio.run(take()))
    thread.start()
    thread.join()
    return result[0]


async def test_one_session_per_event_loop(made: list[Any]) -> None:
    mine = default_session()
    assert default_session() is mine
    loops: list[asyncio.AbstractEventLoop] = []
    other = _in_new_loop(loops)
    # Another loop (here in another thread, as a sync facade runs) gets its own:
    # aiobotocore sessions are not safe across loops or threads.
    assert other is not mine
    assert default_session() is mine
    assert len(made) == 2


async def test_sessions_of_closed_loops_are_dropped(made: list[Any]) -> None:
    # The loops are kept alive here, as a session whose credentials' lock bound its loop
    # would keep it: weak keys alone would then keep every session.
    loops: list[asyncio.AbstractEventLoop] = []
    for _ in range(5):
        _in_new_loop(loops)
    assert all(loop.is_closed() for loop in loops)
    mine = default_session()
    assert set(dynamodb_table._DEFAULT_SESSIONS.keys()) == {asyncio.get_running_loop()}
    assert dynamodb_table._DEFAULT_SESSIONS[asyncio.get_running_loop()] is mine
    assert len(made) == 6


def test_outside_an_event_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        default_session()
