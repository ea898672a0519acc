"""Session.context: hot view + long-term recall + the pure assembler, read-only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiermem.context import render_converse
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.service import MemoryService
from tiermem.session import DEFAULT_CONTEXT_BUDGET, Session
from tiermem.settings import TierMemSettings


@pytest.fixture
async def service() -> AsyncIterator[MemoryService]:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as svc:
        yield svc


async def _conversation(service: MemoryService) -> Session:
    old = await service.session("s-0", user_id="u-1")
    await old.add_turn("user", "My budget for the Vagabond box set is 120 EUR.")
    await old.add_turn("assistant", "Noted.")
    session = await service.session("s-1", user_id="u-1")
    await session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
    call = ToolUseBlock(tool_use_id="t-1", name="stock", input={"vol": 42})
    await session.add_turn("assistant", [call])
    result = ToolResultBlock(tool_use_id="t-1", content=(TextBlock(text="3 left"),))
    await session.add_turn("user", [result])
    await session.add_turn("assistant", "Yes, 3 left.")
    await session.add_turn("user", "What was my budget for the Vagabond box set?")
    await service.drain()
    return session


async def test_context_without_query_is_the_hot_window(service: MemoryService) -> None:
    session = await _conversation(service)
    window = await session.context(system="You sell manga.")
    assert window.budget_tokens == DEFAULT_CONTEXT_BUDGET
    turns = [i.provenance.turn_indexes[0] for i in window.items if i.kind == "turn"]
    assert turns == [0, 1, 2, 3, 4]
    assert not any(i.kind in ("recall", "profile") for i in window.items)
    assert window.stats.total_turns == 5
    assert render_converse(window)["messages"][-1]["role"] == "user"


async def test_context_with_query_recalls_other_sessions_and_never_writes(
    service: MemoryService,
) -> None:
    session = await _conversation(service)
    before = await session.get_turns()
    window = await session.context(query="budget Vagabond box set", model="claude-3-5-sonnet")
    recall = [i for i in window.items if i.kind == "recall"]
    assert any(
        i.provenance.session_id == "s-0" and i.provenance.turn_indexes == (0,) for i in recall
    )
    # Hits of turns already in the hot window are not repeated.
    assert not any(
        i.provenance.session_id == "s-1" and i.provenance.tier == "archive" for i in recall
    )
    assert any(i.kind == "profile" for i in window.items)
    assert window.stats.context_window_percent < 1
    assert await session.get_turns() == before
    assert (await session.view()).turns == tuple(before)


async def test_context_budget_evicts_but_keeps_pairs_first_and_latest(
    service: MemoryService,
) -> None:
    session = await _conversation(service)
    window = await session.context(budget=70)
    kept = [i.provenance.turn_indexes[0] for i in window.items if i.kind == "turn"]
    assert 0 in kept
    assert 4 in kept
    assert (1 in kept) == (2 in kept)
    assert window.total_tokens <= 70
    assert window.stats.evicted_count == 5 - len(kept)
