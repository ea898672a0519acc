"""Poison input is refused at the edge with a clear error and nothing stored (issue #13,
item 3, library part)."""

from __future__ import annotations

from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.models import ToolUseBlock
from tiermem.models.shape import MAX_JSON_DEPTH
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": [value]}
    return value


@pytest.fixture
async def memory() -> Any:
    clock = FakeClock()
    service = MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock
    )
    yield service
    await service.aclose()


async def test_deeply_nested_tool_input_is_refused_and_nothing_is_stored(
    memory: MemoryService,
) -> None:
    session = await memory.session("s-deep", user_id="u")
    deep = ToolUseBlock(tool_use_id="t1", name="search", input=_nested(200))
    with pytest.raises(ValidationError, match="nests deeper"):
        await session.add_turn("assistant", [deep])
    assert await session.get_turns() == []
    # Reasonable nesting is fine and reads back.
    ok = ToolUseBlock(tool_use_id="t2", name="search", input=_nested(MAX_JSON_DEPTH // 2 - 1))
    turn = await session.add_turn("assistant", [ok])
    assert (await session.get_turns())[0] == turn


async def test_a_lone_surrogate_is_a_validation_error(memory: MemoryService) -> None:
    session = await memory.session("s-sur", user_id="u")
    with pytest.raises(ValidationError, match="surrogate"):
        await session.add_turn("user", "broken \ud800 text")
    with pytest.raises(ValidationError, match="surrogate"):
        await session.add_turn("user", "fine", metadata={"note": "\udfff"})
    assert await session.get_turns() == []


async def test_an_empty_session_id_is_an_error_not_a_new_session(memory: MemoryService) -> None:
    with pytest.raises(ValidationError, match="session_id"):
        await memory.session("", user_id="u")
    fresh = await memory.session(None, user_id="u")
    assert fresh.id
