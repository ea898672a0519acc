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

from tests.integration.conftest import Pairing, open_pairing
from tiermem.service import MemoryService

STATE_PAIRINGS = ["memory+sqlite", "sqlite+sqlite", "memory+memory", "redis+dynamodb"]


@pytest.fixture(params=STATE_PAIRINGS)
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    async with open_pairing(request.param, tmp_path) as opened:
        yield opened


def service_of(pairing: Pairing) -> MemoryService:
    return pairing.service(auto_detect=False, index_turns=False)
