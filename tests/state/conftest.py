"""Deployments for the coordinator tests: the pairings users run, on real stores.

``memory+sqlite`` is the embedded default, ``sqlite+sqlite`` the shared-file deployment of
the recovery test, ``redis+dynamodb`` production (real servers, see tests/conftest.py:
skipped without them unless ``TIERMEM_REQUIRE_BACKENDS=1``). Time moves only through the
fake clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.conftest import Pairing, open_role
from tiermem.service import MemoryService
from tiermem.testing import FakeClock

STATE_PAIRINGS = ["memory+sqlite", "sqlite+sqlite", "memory+memory", "redis+dynamodb"]


@pytest.fixture(params=STATE_PAIRINGS)
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    hot_name, durable_name = request.param.split("+")
    clock = FakeClock()
    (tmp_path / "hot").mkdir()
    (tmp_path / "durable").mkdir()
    hot = await open_role(hot_name, "hot", clock, tmp_path / "hot")
    durable = await open_role(durable_name, "durable", clock, tmp_path / "durable")
    try:
        yield Pairing(request.param, hot, durable, clock)  # type: ignore[arg-type]
    finally:
        await hot.aclose()
        await durable.aclose()


def service_of(pairing: Pairing) -> MemoryService:
    return pairing.service(auto_detect=False, index_turns=False)
