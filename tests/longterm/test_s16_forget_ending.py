"""Forgetting the session that stated a favourite forgets its ending too.

An ending ("no longer favorite_genre: horror (…)") is written by a dislike in a later
session or by ``retire_preference``; it names the value it ended. Before, forgetting the
session that stated horror deleted the stated version but kept the ending, current or in
history, so the user's memory still said what the forgotten session said (found by review
R2). Now an ending whose ended value only forgotten versions stated is forgotten with them,
and the slot rolls back to what is left. An ending of a value stated elsewhere too stays.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

USER = "u-forget-ending"


@asynccontextmanager
async def _service(backend: str, tmp_path: Path) -> AsyncIterator[tuple[MemoryService, FakeClock]]:
    clock = FakeClock(datetime(2030, 1, 1, 9, tzinfo=UTC))
    if backend == "memory":
        memory = MemoryService(
            MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock
        )
    else:
        memory = MemoryService.from_settings(
            TierMemSettings(sqlite_path=tmp_path / "t.db"), clock=clock
        )
    async with memory:
        yield memory, clock


async def _say(memory: MemoryService, clock: FakeClock, sid: str, text: str) -> None:
    session = await memory.session(sid, user_id=USER)
    await session.add_turn("user", text)
    await session.close()
    await memory.drain()
    clock.advance(timedelta(hours=1))


async def _everything(memory: MemoryService) -> str:
    """Every text the user's preference slot and its history hold."""
    lt = memory.longterm
    slot = await lt.get_preference(USER, "favorite_genre", include_retired=True)
    history = await lt.preference_history(USER, "favorite_genre")
    return " | ".join([slot.content if slot else "", *(h.content for h in history)])


BACKENDS = ["memory", "sqlite"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_explicit_ending_goes_with_the_session_that_stated_the_value(
    backend: str, tmp_path: Path
) -> None:
    async with _service(backend, tmp_path) as (memory, clock):
        await _say(memory, clock, "s-a", "My favourite genre is horror.")
        await memory.longterm.retire_preference(USER, "favorite_genre", reason="forget it")
        assert "horror" in await _everything(memory)
        await memory.longterm.forget_session(USER, "s-a")
        assert "horror" not in await _everything(memory)
        assert await memory.longterm.get_preference(USER, "favorite_genre") is None


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_dislikes_ending_goes_with_the_session_that_stated_the_value(
    backend: str, tmp_path: Path
) -> None:
    async with _service(backend, tmp_path) as (memory, clock):
        await _say(memory, clock, "s-a", "My favourite genre is horror.")
        await _say(memory, clock, "s-b", "I don't like horror anymore.")
        slot = await memory.longterm.get_preference(USER, "favorite_genre", include_retired=True)
        assert slot is not None
        assert slot.invalid_from is not None  # the dislike ended it
        await memory.longterm.forget_session(USER, "s-a")
        assert "horror" not in await _everything(memory)
        # The dislike is s-b's own and stays.
        dislikes = await memory.longterm.list(USER, types=["preference"])
        assert any("horror" in r.content for r in dislikes)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_slot_rolls_back_to_what_other_sessions_said(
    backend: str, tmp_path: Path
) -> None:
    async with _service(backend, tmp_path) as (memory, clock):
        await _say(memory, clock, "s-0", "My favourite genre is romance.")
        await _say(memory, clock, "s-a", "My favourite genre is horror.")
        await memory.longterm.retire_preference(USER, "favorite_genre", reason="forget it")
        await memory.longterm.forget_session(USER, "s-a")
        current = await memory.longterm.get_preference(USER, "favorite_genre")
        assert current is not None
        assert current.metadata["preference_value"] == "romance"
        assert "horror" not in await _everything(memory)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_ending_in_history_goes_too(backend: str, tmp_path: Path) -> None:
    async with _service(backend, tmp_path) as (memory, clock):
        await _say(memory, clock, "s-a", "My favourite genre is horror.")
        await memory.longterm.retire_preference(USER, "favorite_genre", reason="forget it")
        clock.advance(timedelta(hours=1))
        await memory.longterm.upsert_preference(USER, "favorite_genre", "thriller")
        await memory.longterm.forget_session(USER, "s-a")
        current = await memory.longterm.get_preference(USER, "favorite_genre")
        assert current is not None
        assert current.metadata["preference_value"] == "thriller"
        assert "horror" not in await _everything(memory)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forgetting_another_session_keeps_the_ending(backend: str, tmp_path: Path) -> None:
    async with _service(backend, tmp_path) as (memory, clock):
        await _say(memory, clock, "s-a", "My favourite genre is horror.")
        await _say(memory, clock, "s-c", "I'm looking for volume 3 of Berserk.")
        await memory.longterm.retire_preference(USER, "favorite_genre", reason="forget it")
        await memory.longterm.forget_session(USER, "s-c")
        slot = await memory.longterm.get_preference(USER, "favorite_genre", include_retired=True)
        assert slot is not None
        assert slot.content.startswith("no longer favorite_genre: horror")
        assert await memory.longterm.get_preference(USER, "favorite_genre") is None
