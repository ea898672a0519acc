"""Property tests over random conversations: the budget is never exceeded, tool pairs are
never split, and the first user turn, the latest turn and pinned turns are always kept."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.context.conftest import turn
from tiermem.context import ContextWindow, assemble_context, plan_eviction, tool_pair_groups
from tiermem.context.eviction import PlannedMessage
from tiermem.context.truncate import message_tokens
from tiermem.errors import BudgetExceededError
from tiermem.models import (
    ContentBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Turn,
)
from tiermem.tokens import MESSAGE_OVERHEAD_TOKENS, TiktokenCounter

COUNTER = TiktokenCounter()
WORDS = [
    "manga",
    "Berserk",
    "vol",
    "42",
    "stock",
    "order",
    "ORD-12345",
    "seinen",
    "ok",
    "ベルセルク",
    "shipping",
    "{json}",
    "\n",
]


def _text(draw: st.DrawFn, max_words: int) -> str:
    # One draw of n bytes, each picking a word (shrinks toward WORDS[0], as sampled_from
    # does): a list of n sampled_from draws cost most of each example's time.
    n = draw(st.integers(0, max_words))
    picks = draw(st.binary(min_size=n, max_size=n))
    return " ".join([WORDS[b % len(WORDS)] for b in picks])


@dataclass
class Conversation:
    turns: list[Turn]
    current: str | None
    system: str
    budget: int


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    turns: list[Turn] = []
    steps = draw(st.integers(1, 14))
    tool_n = 0
    for _ in range(steps):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools_split"]))
        importance = draw(st.floats(0, 1))
        pinned = draw(st.booleans()) and draw(st.booleans())
        if kind in ("user", "assistant"):
            big = draw(st.integers(0, 10)) == 0
            turns.append(
                turn(
                    len(turns),
                    kind,
                    _text(draw, 300 if big else 40),  # type: ignore[arg-type]
                    importance=importance,
                    pinned=pinned,
                )
            )
            continue
        calls = draw(st.integers(1, 2))
        ids = [f"t-{tool_n + k}" for k in range(calls)]
        tool_n += calls
        uses: tuple[ContentBlock, ...] = tuple(
            ToolUseBlock(tool_use_id=i, name="search", input={"q": _text(draw, 3)}) for i in ids
        )
        lead = _text(draw, 10)
        if lead:
            uses = (TextBlock(text=lead), *uses)
        results: list[ContentBlock] = []
        for i in ids:
            inner: list[TextBlock | ImageBlock] = [TextBlock(text=_text(draw, 150))]
            if draw(st.integers(0, 8)) == 0:
                inner.append(ImageBlock(format="png", uri="s3://b/i.png"))
            results.append(ToolResultBlock(tool_use_id=i, content=tuple(inner)))
        turns.append(turn(len(turns), "assistant", uses, importance=importance, pinned=pinned))
        if kind == "tools_split" and len(results) > 1:
            # Results in two user turns: three messages linked into one group.
            turns.append(turn(len(turns), "user", (results[0],), importance=importance))
            turns.append(turn(len(turns), "user", tuple(results[1:])))
        else:
            turns.append(turn(len(turns), "user", tuple(results), importance=importance))
    # The hot window may start anywhere: its first message can be an orphan result.
    start = draw(st.integers(0, max(0, len(turns) - 1)))
    window = [t for t in turns[start:]]
    current = _text(draw, 200) if draw(st.booleans()) else None
    return Conversation(
        turns=window,
        current=current,
        system=_text(draw, 30),
        budget=draw(st.integers(40, 4_000)),
    )


def _assemble(conv: Conversation) -> ContextWindow:
    return assemble_context(
        system=conv.system or None,
        tools=[{"name": "search", "description": "Search the shop"}],
        turns=conv.turns,
        current=conv.current,
        budget=conv.budget,
        session_id="s-1",
        counter=COUNTER,
    )


def _rendered_tokens(window: ContextWindow) -> int:
    # Independent of the assembler's own bookkeeping: count what would be sent.
    system = sum(
        COUNTER.count(b.text) + MESSAGE_OVERHEAD_TOKENS
        for b in window.system
        if isinstance(b, TextBlock)
    )
    tools = 0
    if window.tools:
        manifest = json.dumps(
            [t.canonical() for t in window.tools], sort_keys=True, ensure_ascii=False
        )
        tools = COUNTER.count(manifest) + MESSAGE_OVERHEAD_TOKENS
    messages = sum(COUNTER.count_message(m) for m in window.messages)
    return system + tools + messages


def _kept_indexes(window: ContextWindow) -> set[int]:
    return {i for item in window.items if item.kind == "turn" for i in item.provenance.turn_indexes}


def _linked(turns: list[Turn]) -> list[set[int]]:
    # Independent of tool_pair_groups: turn indexes sharing a tool_use_id.
    by_id: dict[str, set[int]] = {}
    for t in turns:
        for block in t.content:
            if isinstance(block, ToolUseBlock | ToolResultBlock):
                by_id.setdefault(block.tool_use_id, set()).add(t.index)
    return list(by_id.values())


def _required_indexes(turns: list[Turn]) -> set[int]:
    required = {t.index for t in turns if t.pinned}
    if turns:
        required.add(turns[-1].index)
        first_user = next((t.index for t in turns if t.role == "user"), None)
        if first_user is not None:
            required.add(first_user)
    return required


PROPERTY = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@PROPERTY
@given(conversations())
def test_budget_never_exceeded(conv: Conversation) -> None:
    try:
        window = _assemble(conv)
    except BudgetExceededError:
        assume(False)
        return
    assert window.total_tokens == sum(i.tokens for i in window.items)
    assert window.total_tokens <= conv.budget
    assert _rendered_tokens(window) <= conv.budget


@PROPERTY
@given(conversations())
def test_tool_pairs_never_split(conv: Conversation) -> None:
    try:
        window = _assemble(conv)
    except BudgetExceededError:
        assume(False)
        return
    kept = _kept_indexes(window)
    hot = {t.index for t in conv.turns}
    for group in _linked(conv.turns):
        present = group & hot
        if present == group:  # a pair the input did not already split
            assert present <= kept or not (present & kept), (group, kept)
    # What is sent pairs every call with a result in the next message, and vice versa.
    messages = window.messages
    for position, message in enumerate(messages):
        calls = {b.tool_use_id for b in message.content if isinstance(b, ToolUseBlock)}
        results = {b.tool_use_id for b in message.content if isinstance(b, ToolResultBlock)}
        if calls and (position + 1 < len(messages) or conv.current is not None):
            following = messages[position + 1].content
            answered = {b.tool_use_id for b in following if isinstance(b, ToolResultBlock)}
            assert calls <= answered
        if results:
            previous = messages[position - 1].content if position else ()
            asked = {b.tool_use_id for b in previous if isinstance(b, ToolUseBlock)}
            assert results <= asked


@PROPERTY
@given(conversations())
def test_first_latest_and_pinned_turns_kept(conv: Conversation) -> None:
    try:
        window = _assemble(conv)
    except BudgetExceededError:
        assume(False)
        return
    assert _required_indexes(conv.turns) <= _kept_indexes(window)
    if conv.current is not None:
        assert window.items[-1].kind == "current"
    for item in window.items:
        if item.truncated:
            assert "truncated to fit the context budget" in item.text


@PROPERTY
@given(conversations())
def test_it_raises_only_when_required_content_cannot_fit_whole(conv: Conversation) -> None:
    # With room for every required message untruncated, assembly never raises and never
    # truncates.
    required = _required_indexes(conv.turns)
    closure = set(required)
    grown = True
    while grown:  # groups chain through shared turns: close until nothing changes
        grown = False
        for group in _linked(conv.turns):
            if group & closure and not group <= closure:
                closure |= group
                grown = True
    base = assemble_context(
        system=conv.system or None,
        tools=[{"name": "search", "description": "Search the shop"}],
        budget=100_000,
        counter=COUNTER,
    ).total_tokens
    full = _assemble(Conversation(conv.turns, conv.current, conv.system, budget=100_000))
    needed = base + sum(
        i.tokens
        for i in full.items
        if i.kind == "current" or set(i.provenance.turn_indexes) & closure
    )
    window = _assemble(Conversation(conv.turns, conv.current, conv.system, budget=needed))
    assert not any(i.truncated for i in window.items)
    assert _required_indexes(conv.turns) <= _kept_indexes(window)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3), max_size=12))
def test_tool_pair_groups_partition_and_link(ids_per_message: list[list[str]]) -> None:
    messages = [
        tuple(ToolUseBlock(tool_use_id=i, name="x") for i in ids) for ids in ids_per_message
    ]
    groups = tool_pair_groups(messages)
    flat = [p for g in groups for p in g]
    assert sorted(flat) == list(range(len(messages)))
    where = {p: n for n, g in enumerate(groups) for p in g}
    for a, ids_a in enumerate(ids_per_message):
        for b, ids_b in enumerate(ids_per_message):
            if set(ids_a) & set(ids_b):
                assert where[a] == where[b]


def test_eviction_order_is_lowest_importance_then_oldest() -> None:
    def m(index: int, importance: float) -> PlannedMessage:
        content = (TextBlock(text=f"turn {index} " + "x " * 20),)
        return PlannedMessage(
            role="user" if index % 2 == 0 else "assistant",
            content=content,
            turn_index=index,
            tokens=message_tokens(content, COUNTER),
            importance=importance,
        )

    messages = [m(0, 0.1), m(1, 0.9), m(2, 0.2), m(3, 0.2), m(4, 0.1), m(5, 0.5)]
    cost = messages[0].tokens
    plan = plan_eviction(messages, optional_room=cost * 4, required_room=cost * 6, counter=COUNTER)
    # 0 (first user turn) and 5 (latest) stay; 4 (lowest), then 2 (older of the 0.2s) go.
    assert plan.evicted == (2, 4)
    assert plan.kept == (0, 1, 3, 5)


def test_a_huge_latest_message_is_truncated_not_dropped() -> None:
    huge = "Berserk volume forty two " * 3_000
    window = assemble_context(
        turns=[turn(0, "user", "hi"), turn(1, "assistant", huge)], budget=300, counter=COUNTER
    )
    last = window.items[-1]
    assert last.truncated
    assert last.provenance.turn_indexes == (1,)
    assert last.text.startswith("Berserk volume forty two")
    assert "the original had" in last.text
    assert window.total_tokens <= 300
    assert window.stats.truncated_turn_indexes == (1,)


def test_a_huge_tool_result_is_truncated_and_keeps_its_pair() -> None:
    call = ToolUseBlock(tool_use_id="t-1", name="search", input={"q": "x"})
    result = ToolResultBlock(tool_use_id="t-1", content=(TextBlock(text="row " * 5_000),))
    window = assemble_context(
        turns=[turn(0, "user", "find"), turn(1, "assistant", (call,)), turn(2, "user", (result,))],
        budget=200,
        counter=COUNTER,
    )
    assert window.total_tokens <= 200
    sent = window.messages[-1].content[0]
    assert isinstance(sent, ToolResultBlock)
    assert sent.tool_use_id == "t-1"
    assert "truncated to fit" in sent.content[-1].text  # type: ignore[union-attr]


def test_required_content_that_cannot_fit_raises() -> None:
    with pytest.raises(BudgetExceededError, match="raise the budget"):
        assemble_context(
            turns=[turn(0, "user", "hi"), turn(1, "assistant", "there")],
            system="word " * 20,
            budget=30,
            counter=COUNTER,
        )
