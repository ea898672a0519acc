"""Background work of many sessions' turns merged into few index writes (issue #8).

The background queue merges the index jobs queued next to each other, any sessions', into
one ``upsert``; these tests check what a user would notice: every turn is recallable
after ``drain``, each session's preferences end at what it said last, and a failed index
write is counted per append without losing the turns. On the in-memory and SQLite
pairings (the index is a real one, wrapped to count or to fail its writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tiermem.errors import BackendError
from tiermem.longterm.index import IndexedDoc
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

SESSIONS = 20


@pytest.fixture(params=["memory", "sqlite"])
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryService]:
    settings = TierMemSettings(
        hot_backend="memory", durable_backend=request.param, sqlite_path=tmp_path / "t.db"
    )
    async with MemoryService.from_settings(settings, auto_summarize=False) as service:
        yield service


def count_upserts(memory: MemoryService) -> list[int]:
    """Wrap the index's upsert (the real one still runs); returns the number of turn
    documents of each call that had any (detected memories are indexed too)."""
    index: Any = memory.longterm.index
    real = index.upsert
    sizes: list[int] = []

    async def upsert(docs: Sequence[IndexedDoc]) -> None:
        turns = sum(doc.kind == "turn" for doc in docs)
        if turns:
            sizes.append(turns)
        await real(docs)

    index.upsert = upsert
    return sizes


async def test_many_sessions_turns_are_all_indexed_in_fewer_writes(memory: MemoryService) -> None:
    sizes = count_upserts(memory)

    async def talk(n: int) -> None:
        session = await memory.session(user_id=f"u-{n}")
        await session.add_turn("user", f"I prefer seinen manga. Token zebra{n} here.")
        await session.add_turn("assistant", "Noted.")
        await session.add_turn("user", f"Actually I prefer shonen manga, ask about zebra{n}.")

    await asyncio.gather(*(talk(n) for n in range(SESSIONS)))
    await memory.drain()

    assert sum(sizes) == 3 * SESSIONS  # every turn indexed once
    assert len(sizes) < 3 * SESSIONS  # in merged writes, not one per append
    for n in range(SESSIONS):
        user = f"u-{n}"
        hits = await memory.longterm.recall(user, f"zebra{n}", scope=("turn",), k=5)
        assert sorted(h.turn.index for h in hits if h.turn is not None) == [0, 2]
        # Detection ran in each session's order: the later preference wins.
        prefs = await memory.longterm.preferences(user)
        assert [p.metadata["preference_value"] for p in prefs] == ["shonen manga"]


async def test_a_failed_index_write_is_counted_per_append_and_loses_no_turn(
    memory: MemoryService,
) -> None:
    # The real indexes do not fail on demand: a wrapper raising BackendError stands in for
    # a SQLite or Redis error during the merged write.
    index: Any = memory.longterm.index

    async def upsert(docs: Sequence[IndexedDoc]) -> None:
        raise BackendError("index down (test)", backend="test")

    index.upsert = upsert
    sessions = [await memory.session(user_id=f"u-{n}") for n in range(4)]
    for session in sessions:
        await session.add_turn("user", "I prefer seinen manga.")
    await memory.drain()  # failures are logged and counted, never raised

    assert memory.index_failures == 4
    for session in sessions:
        assert [t.index for t in await session.history()] == [0]
        prefs = await memory.longterm.preferences(session.user_id)
        assert [p.metadata["preference_value"] for p in prefs] == ["seinen manga"]
