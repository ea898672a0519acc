"""Golden tests: one window rendered for Bedrock Converse, Anthropic Messages and OpenAI."""

from __future__ import annotations

from tests.context.conftest import T0, turn
from tiermem.context import (
    ContextSection,
    ContextWindow,
    ItemProvenance,
    assemble_context,
    render_anthropic,
    render_converse,
    render_openai,
)
from tiermem.models import ActiveEntity, TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.tokens import TiktokenCounter

SCHEMA = {"type": "object", "properties": {"vol": {"type": "integer"}}}
CALL = ToolUseBlock(tool_use_id="t-1", name="stock", input={"vol": 42})
RESULT = ToolResultBlock(tool_use_id="t-1", content=(TextBlock(text="3 left"),))
ENTITIES = "Currently active entities (use these unless overridden):\nseries: Berserk"


def _window(counter: TiktokenCounter, *, system: str | None = "You sell manga.") -> ContextWindow:
    return assemble_context(
        system=system,
        tools=[{"name": "stock", "description": "Check stock", "input_schema": SCHEMA}],
        user_context=ContextSection(
            kind="profile",
            text="Known about this user:\n- prefers seinen",
            provenance=ItemProvenance(tier="longterm", memory_ids=("m-1",)),
        ),
        entities=[ActiveEntity(kind="series", value="Berserk", turn_index=0, updated_at=T0)],
        turns=[
            turn(0, "user", "Is Berserk vol 42 in stock?"),
            turn(1, "assistant", (CALL,)),
            turn(2, "user", (RESULT,)),
            turn(3, "assistant", "Yes, 3 left."),
        ],
        current="Reserve one.",
        budget=2_000,
        session_id="s-1",
        counter=counter,
    )


def test_converse(counter: TiktokenCounter) -> None:
    assert render_converse(_window(counter)) == {
        "system": [
            {"text": "You sell manga."},
            {"cachePoint": {"type": "default"}},
            {"text": "Known about this user:\n- prefers seinen"},
            {"cachePoint": {"type": "default"}},
            {"text": ENTITIES},
        ],
        "messages": [
            {"role": "user", "content": [{"text": "Is Berserk vol 42 in stock?"}]},
            {
                "role": "assistant",
                "content": [
                    {"toolUse": {"toolUseId": "t-1", "name": "stock", "input": {"vol": 42}}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "t-1",
                            "content": [{"text": "3 left"}],
                            "status": "success",
                        }
                    }
                ],
            },
            {"role": "assistant", "content": [{"text": "Yes, 3 left."}]},
            {"role": "user", "content": [{"text": "Reserve one."}]},
        ],
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "stock",
                        "description": "Check stock",
                        "inputSchema": {"json": SCHEMA},
                    }
                }
            ]
        },
    }


def test_anthropic(counter: TiktokenCounter) -> None:
    assert render_anthropic(_window(counter)) == {
        "system": [
            {"type": "text", "text": "You sell manga.", "cache_control": {"type": "ephemeral"}},
            {
                "type": "text",
                "text": "Known about this user:\n- prefers seinen",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": ENTITIES},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Is Berserk vol 42 in stock?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t-1", "name": "stock", "input": {"vol": 42}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t-1",
                        "content": [{"type": "text", "text": "3 left"}],
                        "is_error": False,
                    }
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Yes, 3 left."}]},
            {"role": "user", "content": [{"type": "text", "text": "Reserve one."}]},
        ],
        "tools": [{"name": "stock", "description": "Check stock", "input_schema": SCHEMA}],
    }


def test_openai(counter: TiktokenCounter) -> None:
    assert render_openai(_window(counter)) == {
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "You sell manga."},
                    {"type": "text", "text": "Known about this user:\n- prefers seinen"},
                    {"type": "text", "text": ENTITIES},
                ],
            },
            {"role": "user", "content": "Is Berserk vol 42 in stock?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t-1",
                        "type": "function",
                        "function": {"name": "stock", "arguments": '{"vol": 42}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t-1", "content": "3 left"},
            {"role": "assistant", "content": "Yes, 3 left."},
            {"role": "user", "content": "Reserve one."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "stock", "description": "Check stock", "parameters": SCHEMA},
            }
        ],
    }


def test_tool_manifest_carries_the_static_cache_point_without_a_system_prompt(
    counter: TiktokenCounter,
) -> None:
    window = _window(counter, system=None)
    converse = render_converse(window)
    assert converse["toolConfig"]["tools"][-1] == {"cachePoint": {"type": "default"}}
    assert converse["system"][:2] == [
        {"text": "Known about this user:\n- prefers seinen"},
        {"cachePoint": {"type": "default"}},
    ]
    anthropic = render_anthropic(window)
    assert anthropic["tools"][-1]["cache_control"] == {"type": "ephemeral"}
