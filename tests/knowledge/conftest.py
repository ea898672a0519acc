"""The durable stores the knowledge tests run on: the in-memory reference, SQLite, Redis,
Redis Cluster (3 masters) and DynamoDB Local."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import open_backend
from tests.knowledge.support import USER
from tiermem.store.contract import DurableStore
from tiermem.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster", "dynamodb"])
async def durable(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[DurableStore]:
    """A durable store on the test's clock, so the store and the KnowledgeBase agree on now."""
    under_test = await open_backend(request.param, clock, tmp_path)
    # Redis and DynamoDB servers are shared by the whole run and these tests use fixed user
    # and document ids: start each test from an empty user.
    await under_test.durable.purge_user(USER)
    try:
        yield under_test.durable
    finally:
        await under_test.hot.aclose()
        await under_test.durable.aclose()
