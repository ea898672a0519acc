"""The hot tier's redis-server really stops mid-conversation: the durable tier carries on.

Runs on the pairings with Redis (redis+dynamodb, redis+sqlite), against a redis-server
process of the test's own that it stops and restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import RedisProcess, open_role
from tiermem.errors import BackendError
from tiermem.service import MemoryService
from tiermem.store.backends.redis import RedisHotStore
from tiermem.testing import FakeClock
from tiermem.tiers import HotFailurePolicy, SessionTierConfig


@pytest.fixture(params=["dynamodb", "sqlite"])
def durable_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_redis_stops_and_restarts_mid_conversation(
    redis_process: RedisProcess, durable_name: str, tmp_path: Path
) -> None:
    clock = FakeClock()
    hot = RedisHotStore.from_url(redis_process.url, clock=clock, prefix="fail")
    durable = await open_role(durable_name, "durable", clock, tmp_path)
    memory = MemoryService(hot, durable, clock=clock, config=SessionTierConfig(window=10))
    try:
        session = await memory.session(user_id="u-outage")
        acknowledged = [await session.add_turn("user", f"before {i}") for i in range(5)]

        redis_process.stop()
        acknowledged.append(await session.add_turn("user", "during the outage"))
        view = await session.view()
        assert view.source == "durable"
        assert [t.text for t in view.turns][-1] == "during the outage"
        assert memory.metrics.bypasses >= 2

        redis_process.start()  # a fresh, empty redis: everything it had is gone
        view = await session.view()
        assert view.source == "reload"
        assert [t.index for t in view.turns] == [t.index for t in acknowledged]
        acknowledged.append(await session.add_turn("user", "after the restart"))
        archived = await session.get_turns()
        assert [t.text for t in archived] == [t.text for t in acknowledged]
        assert [t.index for t in archived] == list(range(7))
        assert (await session.view()).source == "hot"
    finally:
        await memory.aclose()


async def test_raise_policy_surfaces_the_outage(
    redis_process: RedisProcess, tmp_path: Path
) -> None:
    clock = FakeClock()
    hot = RedisHotStore.from_url(redis_process.url, clock=clock, prefix="raise")
    durable = await open_role("sqlite", "durable", clock, tmp_path)
    config = SessionTierConfig(on_hot_failure=HotFailurePolicy.RAISE)
    memory = MemoryService(hot, durable, clock=clock, config=config)
    try:
        session = await memory.session(user_id="u-raise")
        await session.add_turn("user", "hi")
        redis_process.stop()
        with pytest.raises(BackendError) as info:
            await session.history()
        assert info.value.retryable is True
    finally:
        await memory.aclose()
