"""The assembled conversation starts with a user's own turn (session 14).

Bedrock Converse refuses a conversation whose first message is not the user's ("A
conversation must start with a user message"), and every provider refuses a tool result
without its call. After the first summary pass the hot turns beside the summaries are the
newest six, which in a user/assistant exchange start with the assistant: every context
call from turn 20 on was a request Bedrock would refuse. Reviewer's probe p19.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiermem.context import render_converse
from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


def _service() -> MemoryService:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    return MemoryService.from_settings(settings, auto_summarize=True)


def _first(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
    role = messages[0]["role"]
    return role, [next(iter(block)) for block in messages[0]["content"]]


async def test_every_context_starts_with_a_user_turn_across_summary_passes() -> None:
    async with _service() as memory:
        session = await memory.session(user_id="u-start")
        starts = []
        for i in range(40):
            # The usual flow: the user's turn, the context to answer it, the answer.
            await session.add_turn("user", f"Question {i}: is vol {i + 1} in stock?")
            await memory.drain()
            window = await session.context(f"Question {i}", budget=4_000)
            starts.append(_first(render_converse(window)["messages"]))
            await session.add_turn("assistant", f"Answer {i}: vol {i + 1} has {i % 4} copies.")
        assert (await session.watermarks()).summarized_through > 0  # the passes ran
        assert all(role == "user" for role, _ in starts), starts
        assert all(kinds == ["text"] for _, kinds in starts)


async def test_a_tool_exchange_never_opens_the_conversation() -> None:
    """The newest turns may start inside a tool exchange (an assistant's call, then the
    user turn carrying its result): the window reaches back to the user's question."""
    async with _service() as memory:
        session = await memory.session(user_id="u-start-tools")
        for i in range(12):
            await session.add_turn("user", f"Look up order ORD-{10000 + i}, please.")
            call = {"type": "tool_use", "tool_use_id": f"t{i}", "name": "order", "input": {}}
            await session.add_turn("assistant", [call])
            result = {
                "type": "tool_result",
                "tool_use_id": f"t{i}",
                "content": [{"type": "text", "text": f"ORD-{10000 + i}: shipped"}],
            }
            await session.add_turn("user", [result])
            await memory.drain()
            for _ in range(2):  # before the answer, and after it
                messages = render_converse(await session.context(budget=4_000))["messages"]
                role, kinds = _first(messages)
                assert role == "user"
                assert "toolResult" not in kinds
                await session.add_turn("assistant", f"Order ORD-{10000 + i} has shipped.")


async def test_a_tight_budget_still_starts_with_the_user() -> None:
    """Eviction drops the oldest groups; if that cuts the window at an assistant turn,
    the turns before the next user turn go too."""
    async with _service() as memory:
        session = await memory.session(user_id="u-start-tight")
        await session.add_turn("user", "Hi")
        for i in range(6):
            await session.add_turn("assistant", "A long answer. " * 40)
            await session.add_turn("user", f"Short follow-up {i}?")
        window = await session.context(budget=700)
        assert render_converse(window)["messages"][0]["role"] == "user"
        assert window.stats.evicted_count > 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": 5}, "query must be a string"),
        ({"model": 5}, "model must be a model id"),
        ({"recall_k": "5"}, "recall_k must be an integer"),
        ({"recall_k": 10**9}, "recall_k must be an integer"),
    ],
)
async def test_bad_context_arguments_are_refused(arguments: dict[str, Any], message: str) -> None:
    async with _service() as memory:
        session = await memory.session(user_id="u-start-bad")
        await session.add_turn("user", "Hi")
        with pytest.raises(ValidationError, match=message):
            await session.context(**arguments)
