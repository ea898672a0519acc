"""Session.context: hot view + long-term recall + the pure assembler, read-only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiermem.context import ContextItem, ContextWindow, message_tokens, render_converse
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.service import MemoryService
from tiermem.session import DEFAULT_CONTEXT_BUDGET, Session, TurnInput
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import SummaryPolicy


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


def _summary_service() -> MemoryService:
    # A pass every 20 turns (the newest 6 stay raw), offline engines, in-memory backends.
    return MemoryService(
        MemoryHotStore(),
        MemoryDurableStore(),
        auto_detect=False,
        index_turns=False,
        summary_policy=SummaryPolicy(min_preservation=0.0, recover_preservation=0.0),
    )


async def _talk(session: Session, start: int, count: int, budget: str = "120 EUR") -> None:
    await session.add_turns(
        [
            TurnInput(
                role="user" if i % 2 == 0 else "assistant",
                content=f"Turn {i}: my budget for the Vagabond box set is {budget}."
                if i % 2 == 0
                else f"Noted ({i}).",
            )
            for i in range(start, start + count)
        ]
    )


def _summaries(window: ContextWindow) -> list[ContextItem]:
    return [i for i in window.items if i.kind in ("summary", "structured_memory")]


async def test_context_follows_each_summary_pass_and_reuses_sections_between() -> None:
    async with _summary_service() as memory:
        session = await memory.session("s-pass", user_id="u-1")
        await _talk(session, 0, 20)
        await memory.drain()
        await session.summaries(wait_through=19)
        first = await session.context()
        again = await session.context()
        assert _summaries(first)
        assert _summaries(first) == _summaries(again)
        assert again == first
        ids = {i.provenance.summary_id for i in _summaries(first) if i.kind == "summary"}
        # A new pass (another budget said since): the next window shows it, never the old.
        await _talk(session, 20, 20, budget="300 EUR")
        await memory.drain()
        await session.summaries(wait_through=39)
        later = await session.context()
        later_ids = {i.provenance.summary_id for i in _summaries(later) if i.kind == "summary"}
        assert later_ids
        assert later_ids.isdisjoint(ids)
        structured = [i for i in _summaries(later) if i.kind == "structured_memory"]
        assert "300 EUR" in structured[0].text
        assert "120 EUR" not in structured[0].text
        for item in later.items:  # counts are of the text sent, memo or not
            assert item.tokens == message_tokens(item.content, memory.tokens)
        assert later.total_tokens == sum(i.tokens for i in later.items)


async def test_a_cleared_and_reopened_session_gets_no_summary_of_the_old_one() -> None:
    async with _summary_service() as memory:
        session = await memory.session("s-reused", user_id="u-1")
        await _talk(session, 0, 20)
        await memory.drain()
        await session.summaries(wait_through=19)
        assert _summaries(await session.context())
        await session.clear()
        reopened = await memory.session("s-reused", user_id="u-1")
        await reopened.add_turn("user", "Hello again.")
        window = await reopened.context()
        assert not _summaries(window)
        assert [i.text for i in window.items if i.kind == "turn"] == ["Hello again."]


async def test_context_cache_shrinks_to_nothing_and_refills() -> None:
    async with _summary_service() as memory:
        session = await memory.session("s-shrink", user_id="u-1")
        await _talk(session, 0, 20)
        await memory.drain()
        await session.summaries(wait_through=19)
        before = await session.context()
        cache = memory.context_cache
        assert len(cache) == 1
        assert cache.tokens.size > 0
        assert cache.shrink() > 0
        assert len(cache) == 0
        assert cache.tokens.size == 0
        assert await session.context() == before


async def test_active_entities_changed_after_a_pass_show_in_the_next_window() -> None:
    async with _summary_service() as memory:
        session = await memory.session("s-entities", user_id="u-1")
        await _talk(session, 0, 20)
        await memory.drain()
        await session.summaries(wait_through=19)
        await session.set_entities({"series": "Berserk"})
        first = [i.text for i in (await session.context()).items if i.kind == "entities"]
        assert "series: Berserk" in first[0]
        await session.set_entities({"series": "Vagabond"})
        later = [i.text for i in (await session.context()).items if i.kind == "entities"]
        assert "series: Vagabond" in later[0]
        assert "Berserk" not in later[0]
