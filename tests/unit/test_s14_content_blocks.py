"""Content given as block mappings is read like block models (session 14).

``add_turn(role, [{"type": "text", "text": ...}])`` used to analyse the mappings as they
were: ``text_of`` reads no text from a mapping, so the turn counted 0 tokens, named no
entity and was scored as an empty text, while the stored turn (parsed later) held the
text. Budgets, summary triggers and active entities all read those numbers.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

TEXT = "Your order ORD-12345 ships vol 42 tomorrow; it costs $12."

CASES: list[tuple[list[dict[str, Any]], tuple[Any, ...]]] = [
    ([{"type": "text", "text": TEXT}], (TextBlock(text=TEXT),)),
    (
        [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": TEXT}]}],
        (ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=TEXT),)),),
    ),
    (
        [
            {
                "type": "tool_use",
                "tool_use_id": "t2",
                "name": "lookup",
                "input": {"q": "ORD-12345"},
            },
            {"type": "text", "text": TEXT},
        ],
        (
            ToolUseBlock(tool_use_id="t2", name="lookup", input={"q": "ORD-12345"}),
            TextBlock(text=TEXT),
        ),
    ),
]


def _service() -> MemoryService:
    return MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory")
    )


@pytest.mark.parametrize(("mappings", "models"), CASES)
async def test_block_mappings_are_analysed_like_block_models(
    mappings: list[dict[str, Any]], models: tuple[Any, ...]
) -> None:
    async with _service() as memory:
        session = await memory.session(user_id="u-blocks")
        from_mappings = await session.add_turn("user", mappings)
        from_models = await session.add_turn("user", list(models))
    assert from_mappings.content == models
    assert from_mappings.token_count == from_models.token_count > 0
    assert from_mappings.entities == from_models.entities
    assert {e.kind for e in from_mappings.entities} >= {"order_id", "volume"}
    assert from_mappings.importance == from_models.importance
    assert from_mappings.metadata == from_models.metadata


async def test_a_bad_block_mapping_is_named_and_nothing_is_stored() -> None:
    async with _service() as memory:
        session = await memory.session(user_id="u-blocks-bad")
        await session.add_turn("user", "first")
        bad = [{"type": "tool_result", "tool_use_id": "t1", "content": "a bare string"}]
        with pytest.raises(ValidationError, match=r"content\.0\.tool_result\.content") as err:
            await session.add_turn("user", bad)
        assert "list of such blocks" in str(err.value)
        assert [t.text for t in await session.get_turns()] == ["first"]


async def test_add_turns_takes_mappings_and_names_a_bad_item() -> None:
    """``add_turns`` of mappings used to fail with ``AttributeError: 'dict' object has no
    attribute 'role'``; now a mapping is a TurnInput, and anything else is refused with
    the item's position, before anything is stored."""
    async with _service() as memory:
        session = await memory.session(user_id="u-turns")
        stored = await session.add_turns(
            [
                {"role": "user", "content": "Is vol 42 in stock?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Yes, 3 left."}]},
                {"role": "user", "content": "Pin this one.", "pinned": True},
            ]
        )
        assert [(t.index, t.role, t.text) for t in stored] == [
            (0, "user", "Is vol 42 in stock?"),
            (1, "assistant", "Yes, 3 left."),
            (2, "user", "Pin this one."),
        ]
        assert stored[2].pinned
        assert all(t.token_count > 0 for t in stored)
        assert (await session.active_entities())["volume"].value == "42"
        with pytest.raises(ValidationError, match=r"turn 1 must be a TurnInput.*got tuple"):
            await session.add_turns([{"role": "user", "content": "ok"}, ("user", "hi")])
        with pytest.raises(ValidationError, match="role must be 'user' or 'assistant'"):
            await session.add_turns([{"role": "system", "content": "hi"}])
        with pytest.raises(ValidationError, match=r"turns\[0\]\.content"):
            await session.add_turns([{"role": "user"}])
        assert len(await session.get_turns()) == 3
