"""Session.context() optimizes the hot turns it offers (seed 002's pipeline, session 15).

The pre-save optimization (``tiermem.context.optimize``) was complete and property-tested
but never called: a context sent every superseded tool output, every failed attempt and
every repeated filler text in full. The view now shrinks them (``optimize=True``, the
default): a seen, superseded output becomes a reference to its archived turn, a failed call
that later succeeded goes with its result, the final result of each call stays verbatim,
and a tool call never loses its result. ``stats.optimization`` says what was done.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import pytest

from tiermem.context import ContextWindow
from tiermem.context.optimize import (
    OptimizePolicy,
    final_successful_results,
    output_reference,
    pair_tool_calls,
)
from tiermem.errors import ValidationError
from tiermem.models import Message, TextBlock, ToolResultBlock, ToolUseBlock, Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings

from .tool_heavy import tool_heavy_conversation


@pytest.fixture
async def memory() -> AsyncIterator[MemoryService]:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings, auto_summarize=False) as service:
        yield service


def _status(order: str, status: str) -> str:
    """A large order-status output (an order's whole event log), over 512 bytes."""
    events = [
        {"at": f"2026-03-0{day}T09:00:00Z", "event": f"scan at depot {day}", "order": order}
        for day in range(1, 9)
    ]
    return json.dumps({"order": order, "status": status, "events": events})


def _use(tool_use_id: str, name: str, **tool_input: Any) -> ToolUseBlock:
    return ToolUseBlock(tool_use_id=tool_use_id, name=name, input=tool_input)


def _result(
    tool_use_id: str, text: str, status: Literal["success", "error"] = "success"
) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=tool_use_id, content=(TextBlock(text=text),), status=status)


async def _add(session: Session, turns: Sequence[tuple[str, Any]]) -> None:
    for role, content in turns:
        await session.add_turn(role, content)


def _blocks(window: ContextWindow) -> list[Any]:
    return [block for message in window.messages for block in message.content]


def _assert_pairs_whole(messages: Sequence[Message]) -> None:
    """Every call's result is in the next message, and every result follows its call."""
    for at, message in enumerate(messages):
        uses = {b.tool_use_id for b in message.content if isinstance(b, ToolUseBlock)}
        after = messages[at + 1].content if at + 1 < len(messages) else ()
        answered = {b.tool_use_id for b in after if isinstance(b, ToolResultBlock)}
        assert uses <= answered, f"message {at}: calls {uses - answered} lost their result"
        results = {b.tool_use_id for b in message.content if isinstance(b, ToolResultBlock)}
        before = messages[at - 1].content if at else ()
        called = {b.tool_use_id for b in before if isinstance(b, ToolUseBlock)}
        assert results <= called, f"message {at}: results {results - called} lost their call"


ORDER_POLLS = [
    ("user", "Where is my order ORD-1?"),
    ("assistant", [TextBlock(text="Let me check."), _use("t1", "order_status", order="ORD-1")]),
    ("user", [_result("t1", _status("ORD-1", "packed"))]),
    ("assistant", "It is packed."),
    ("user", "And now?"),
    ("assistant", [_use("t2", "order_status", order="ORD-1")]),
    ("user", [_result("t2", _status("ORD-1", "shipped"))]),
    ("assistant", "It has shipped."),
    ("user", "Thanks! When will it arrive?"),
]


async def test_a_seen_superseded_output_is_a_reference_and_the_final_result_verbatim(
    memory: MemoryService,
) -> None:
    session = await memory.session("s-polls", user_id="u-1")
    await _add(session, ORDER_POLLS)
    window = await session.context(budget=8_000)

    old, final = await session.get_turn(2), await session.get_turn(6)
    old_result = old.content[0]
    assert isinstance(old_result, ToolResultBlock)
    size = sum(len(block.model_dump_json().encode()) for block in old_result.content)
    reference = output_reference(2, "order_status", size)
    assert reference == (
        f"[tool output of turn 2 (order_status, {size} B): retrievable with session.get_turn(2)]"
    )
    results = {b.tool_use_id: b for b in _blocks(window) if isinstance(b, ToolResultBlock)}
    assert results["t1"].content == (TextBlock(text=reference),)
    assert results["t1"].status == "success"
    assert results["t2"] == final.content[0]  # the final result, verbatim
    _assert_pairs_whole(window.messages)
    # The archive keeps the full output: the reference leads to it.
    assert old_result.content == (TextBlock(text=_status("ORD-1", "packed")),)

    done = window.stats.optimization
    assert done is not None
    assert done.actions == {"output_reference": 1}
    assert done.referenced_turn_indexes == (2,)
    assert done.changed_turn_indexes == (2,)
    assert done.dropped_turn_indexes == ()
    plain = await session.context(budget=8_000, optimize=False)
    assert (
        done.tokens_saved
        == plain.stats.tokens_by_tier["turn"] - window.stats.tokens_by_tier["turn"]
    )
    assert done.tokens_saved > 100


async def test_optimize_false_sends_the_turns_as_stored(memory: MemoryService) -> None:
    session = await memory.session("s-plain", user_id="u-1")
    await _add(session, ORDER_POLLS)
    window = await session.context(budget=8_000, optimize=False)
    stored = await session.get_turns()
    results = [b for b in _blocks(window) if isinstance(b, ToolResultBlock)]
    assert results == [stored[2].content[0], stored[6].content[0]]
    assert window.stats.optimization is None


async def test_an_output_the_model_has_not_answered_yet_stays_verbatim(
    memory: MemoryService,
) -> None:
    """Mid-loop, the newest result is what the model is about to read: never a reference,
    even when an older reading of the same call exists."""
    session = await memory.session("s-mid", user_id="u-1")
    await _add(session, ORDER_POLLS[:3])
    await _add(session, [("assistant", [_use("t2", "order_status", order="ORD-1")])])
    await _add(session, [("user", [_result("t2", _status("ORD-1", "shipped"))])])
    window = await session.context(budget=8_000)
    results = {b.tool_use_id: b for b in _blocks(window) if isinstance(b, ToolResultBlock)}
    # t1 is seen (the assistant called t2 after it) and superseded by t2: a reference.
    assert results["t1"].content[0].text.startswith("[tool output of turn 2")  # type: ignore[union-attr]
    assert results["t2"] == (await session.get_turn(4)).content[0]


async def test_a_failed_call_that_later_succeeded_leaves_the_window_not_the_archive(
    memory: MemoryService,
) -> None:
    session = await memory.session("s-retry", user_id="u-1")
    await _add(
        session,
        [
            ("user", "Find Berserk volume 42."),
            ("assistant", [_use("f1", "search", q="Berserk 42")]),
            ("user", [_result("f1", "timeout after 30 s", status="error")]),
            ("assistant", [_use("f2", "search", q="Berserk 42")]),
            ("user", [_result("f2", "Berserk 42: 3 in stock")]),
            ("assistant", "Berserk 42 is in stock (3 copies)."),
            ("user", "Great."),
        ],
    )
    window = await session.context(budget=8_000)
    ids = [b.tool_use_id for b in _blocks(window) if isinstance(b, ToolUseBlock | ToolResultBlock)]
    assert ids == ["f2", "f2"]
    turns = [item.provenance.turn_indexes for item in window.items if item.kind == "turn"]
    assert turns == [(0,), (3,), (4,), (5,), (6,)]
    assert window.messages[0].role == "user"
    _assert_pairs_whole(window.messages)
    done = window.stats.optimization
    assert done is not None
    assert done.actions == {"superseded_failure": 1}
    assert done.dropped_turn_indexes == (1, 2)
    failed = (await session.get_turn(2)).content[0]
    assert isinstance(failed, ToolResultBlock)
    assert failed.status == "error"


CART = [
    ("user", "Two copies of Berserk 1 in my cart, and is Monster 1 in stock?"),
    ("assistant", [_use("a1", "add_to_cart", item="berserk-1")]),
    ("user", [_result("a1", "added")]),
    ("assistant", [_use("a2", "add_to_cart", item="berserk-1")]),
    ("user", [_result("a2", "added")]),
    ("assistant", [_use("s1", "stock", item="monster-1")]),
    ("user", [_result("s1", "monster-1: 2 left")]),
    ("assistant", [_use("s2", "stock", item="monster-1")]),
    ("user", [_result("s2", "monster-1: 2 left")]),
    ("assistant", "Two copies added; Monster 1 has 2 left."),
    ("user", "Thanks."),
]


def _calls(window: ContextWindow) -> list[str]:
    return [b.tool_use_id for b in _blocks(window) if isinstance(b, ToolUseBlock)]


async def test_the_default_keeps_every_successful_call_a_policy_may_collapse_repeats(
    memory: MemoryService,
) -> None:
    """The view cannot know that ``add_to_cart`` acts: by default no successful call is
    collapsed (two adds are two items). A policy naming the tools with side effects
    collapses repeated calls of the others."""
    session = await memory.session("s-cart", user_id="u-1")
    await _add(session, CART)
    assert _calls(await session.context(budget=8_000)) == ["a1", "a2", "s1", "s2"]

    named = OptimizePolicy(side_effect_tools=frozenset({"add_to_cart"}))
    window = await session.context(budget=8_000, optimize=named)
    assert _calls(window) == ["a1", "a2", "s2"]
    assert window.stats.optimization is not None
    assert window.stats.optimization.actions == {"duplicate_call": 1}
    _assert_pairs_whole(window.messages)

    unnamed = await session.context(budget=8_000, optimize=OptimizePolicy())
    assert _calls(unnamed) == ["a2", "s2"]  # what the default protects against


async def test_a_bad_optimize_value_is_refused(memory: MemoryService) -> None:
    session = await memory.session("s-bad", user_id="u-1")
    await session.add_turn("user", "hello")
    with pytest.raises(ValidationError, match="optimize must be True, False or an Optimize"):
        await session.context(optimize="yes")  # type: ignore[arg-type]


def _final_results(turns: Sequence[Turn]) -> dict[str, ToolResultBlock]:
    return {
        call.use.tool_use_id: call.result
        for call in final_successful_results(pair_tool_calls(turns)).values()
    }


@pytest.mark.parametrize("seed", [0, 3])
async def test_a_tool_heavy_replay_keeps_pairs_whole_and_finals_verbatim(
    memory: MemoryService, seed: int
) -> None:
    """Seed 002's shop agent replayed turn by turn, the context assembled before every
    reply: every window keeps each call with its result and the final result of every
    call verbatim, and sends fewer tokens of turns than the stored turns."""
    session = await memory.session(f"s-heavy-{seed}", user_id="u-1")
    saved = 0
    for turn in tool_heavy_conversation(seed)[:80]:
        await session.add_turn(turn.role, list(turn.content), timestamp=turn.timestamp)
        if turn.role != "user":
            continue
        window = await session.context(budget=200_000)
        plain = await session.context(budget=200_000, optimize=False)
        _assert_pairs_whole(window.messages)
        assert window.messages[0].role == plain.messages[0].role
        hot = [await session.get_turn(i.provenance.turn_indexes[0]) for i in plain.items
               if i.kind == "turn"]  # fmt: skip
        sent = {b.tool_use_id: b for b in _blocks(window) if isinstance(b, ToolResultBlock)}
        for tool_use_id, result in _final_results(hot).items():
            assert sent[tool_use_id] == result
        done = window.stats.optimization
        assert done is not None
        assert done.tokens_saved == (
            plain.stats.tokens_by_tier["turn"] - window.stats.tokens_by_tier["turn"]
        )
        saved += done.tokens_saved
    assert saved > 0
