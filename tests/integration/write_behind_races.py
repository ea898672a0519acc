"""Shared pieces of the write-behind race tests (test_s16_keyed_plain_race,
test_s16_loss_rebuild_flush_race, test_s16_resync_half_built): a write-behind service,
the hook that runs a step right after a hot append re-creates a lost session, and what
the archive and the hot view hold after a flush."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Pairing, open_pairing
from tests.integration.test_session_integrity import SAME_BACKEND_PAIRINGS
from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.tiers import SessionTierConfig, WritePolicy

LOSS_PAIRINGS = [*SAME_BACKEND_PAIRINGS, "memory+sqlite"]
"""Every backend as both tiers, and the embedded default."""


@pytest.fixture(params=LOSS_PAIRINGS)
async def every(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    """Each loss pairing, opened (a test module imports this fixture to use it)."""
    async with open_pairing(request.param, tmp_path) as opened:
        yield opened


def write_behind(pairing: Pairing, window: int = 20) -> MemoryService:
    """A service over ``pairing`` flushing every 5 turns, without detection or indexing."""
    config = SessionTierConfig(
        window=window, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5
    )
    return pairing.service(config, auto_detect=False, index_turns=False)


def texts_of(turns: list[Turn] | tuple[Turn, ...]) -> list[str]:
    return [t.text for t in turns]


def on_recreation(pairing: Pairing, monkeypatch: pytest.MonkeyPatch, then: Any) -> list[bool]:
    """Run ``then()`` once, right after a hot append re-creates the lost session (before
    its writer rebuilds it). A real server cannot be made to interleave there."""
    real = pairing.hot.append_turns
    ran: list[bool] = []

    async def append(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        if result.version == 1 and not ran:
            ran.append(True)
            await then()
        return result

    monkeypatch.setattr(pairing.hot, "append_turns", append)
    return ran


async def archived_and_shown(memory: MemoryService, sid: str) -> tuple[list[Turn], list[Turn]]:
    """After a flush: the archive's turns and the hot view's."""
    await memory.tiers.flush(sid)
    archived = await memory.tiers.durable.get_turns(sid)
    view = await memory.tiers.view(sid)
    assert view is not None
    return archived, list(view.turns)
