"""The state coordinator's block reaches the context (session 14).

Seed 000 injects the state's ``to_agent_context()`` text into the system prompt, and the
architecture lists state as an input of assembly, but ``Session.context`` took no state:
an active intent with a missing required slot never reached the model. Review probe p13.
"""

from __future__ import annotations

import pytest

from tiermem.context import render_converse
from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.state import StateCoordinator


def _service() -> MemoryService:
    return MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory")
    )


async def test_the_state_block_goes_after_the_entities_and_before_the_turns() -> None:
    async with _service() as memory:
        session = await memory.session(user_id="u-state")
        await session.add_turn("user", "I want to order vol 42 of Berserk.")
        state = await StateCoordinator.load(session)
        await state.set_intent(
            "place_order",
            slots=[{"name": "volume", "required": True}, {"name": "address", "required": True}],
        )
        await state.infer_slot("volume", "42", turn_index=0)
        window = await session.context(state=state)
        kinds = [item.kind for item in window.items]
        assert "state" in kinds
        assert kinds.index("entities") < kinds.index("state") < kinds.index("turn")
        block = next(item for item in window.items if item.kind == "state")
        expected = state.to_agent_context(budget_tokens=10_000, tokens=memory.tokens).text
        assert block.text == expected
        assert "place_order" in block.text
        assert "address" in block.text  # the slot still missing
        system = " ".join(b["text"] for b in render_converse(window)["system"] if "text" in b)
        assert "place_order" in system
        assert "state" not in [i.kind for i in (await session.context()).items]  # opt-in


async def test_another_sessions_state_is_refused() -> None:
    async with _service() as memory:
        first = await memory.session(user_id="u-state")
        other = await memory.session(user_id="u-state")
        await other.add_turn("user", "hi")
        state = await StateCoordinator.load(other)
        with pytest.raises(ValidationError, match="coordinator"):
            await first.context(state=state)
        with pytest.raises(ValidationError, match="StateCoordinator"):
            await first.context(state="intent: order")  # type: ignore[arg-type]
