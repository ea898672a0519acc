"""A window inside an agent loop longer than the hot window opens with the user's turn.

One user request, then 40 tool-call pairs: from turn 21 on, the hot window (20 turns) lies
inside the loop and holds no user turn of the user's own, only tool results. Before
session 15 every such window started with the assistant's tool call (Bedrock Converse: "A
conversation must start with a user message"; Anthropic refuses it too). Now the task's
opening user turn is read from the archive (one bounded range read, in this case only),
placed first with a marker of the turns left out, and tool pairs stay whole; beyond the
bound, a line says the task continues. Summaries on and off; memory+memory and the
embedded pairing (memory+sqlite) here, redis+redis with the services
(``TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.context.test_context_round_trips import EXPECTED
from tests.integration.conftest import Pairing, open_composed_pairing
from tiermem.context import render_anthropic, render_converse
from tiermem.context.models import ContextWindow
from tiermem.models import Message, TextBlock, ToolResultBlock, ToolUseBlock, Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.summaries import SummaryPolicy
from tiermem.testing.round_trips import RoundTrips

REQUEST = "Migrate the billing tables of shop 7 to the new schema, one table at a time."
PAIRS = 40

# redis+redis needs the servers scripts/test.sh starts (as tests/context/
# test_context_round_trips.py does).
PAIRINGS = ["memory+memory", "memory+sqlite", "redis+redis"]


def _service(pairing: Pairing, *, summaries: bool) -> MemoryService:
    return pairing.service(
        summary_policy=SummaryPolicy(min_preservation=0.0, recover_preservation=0.0),
        auto_summarize=summaries,
        auto_detect=False,
    )


async def _add_pair(session: Session, i: int, *, pinned: bool = False) -> None:
    call = ToolUseBlock(tool_use_id=f"call-{i}", name="migrate_table", input={"table": i})
    await session.add_turn("assistant", [TextBlock(text=f"Migrating table {i}."), call])
    result = ToolResultBlock(
        tool_use_id=f"call-{i}", content=(TextBlock(text=f"table {i}: 1{i:03d} rows moved"),)
    )
    await session.add_turn("user", [result], pinned=pinned)


def _check_anthropic(window: ContextWindow) -> None:
    messages = render_anthropic(window)["messages"]
    first = messages[0]
    assert first["role"] == "user", [m["role"] for m in messages[:3]]
    assert first["content"][0]["type"] == "text", first["content"]
    assert REQUEST in first["content"][0]["text"] or "task continues" in str(first["content"])
    # Tool pairs whole: every call answered in the next message, every result's call in
    # the message before.
    for at, message in enumerate(messages):
        calls = {b["id"] for b in message["content"] if b["type"] == "tool_use"}
        if calls:
            assert at + 1 < len(messages), "a call without its result ends the window"
            answered = {
                b["tool_use_id"] for b in messages[at + 1]["content"] if b["type"] == "tool_result"
            }
            assert calls <= answered, (at, calls, answered)
        results = {b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"}
        if results:
            assert at > 0
            before = {b["id"] for b in messages[at - 1]["content"] if b["type"] == "tool_use"}
            assert results <= before, (at, results, before)


def _check_converse(window: ContextWindow) -> None:
    messages = render_converse(window)["messages"]
    first = messages[0]
    assert first["role"] == "user", [m["role"] for m in messages[:3]]
    assert "text" in first["content"][0], first["content"]
    for at, message in enumerate(messages):
        calls = {b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b}
        if calls:
            answered = {
                b["toolResult"]["toolUseId"]
                for b in messages[at + 1]["content"]
                if "toolResult" in b
            }
            assert calls <= answered, (at, calls, answered)
        results = {b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b}
        if results:
            before = {
                b["toolUse"]["toolUseId"] for b in messages[at - 1]["content"] if "toolUse" in b
            }
            assert results <= before, (at, results, before)


@pytest.mark.parametrize("summaries", [False, True], ids=["plain", "summaries"])
@pytest.mark.parametrize("pairing_name", PAIRINGS)
async def test_every_window_of_a_long_loop_opens_with_the_users_request(
    pairing_name: str, summaries: bool, tmp_path: Path
) -> None:
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing, summaries=summaries)
        session = await memory.session(user_id="u-loop")
        await session.add_turn("user", REQUEST)
        windows = []
        for i in range(PAIRS):
            await _add_pair(session, i)
            await memory.drain()
            windows.append(await session.context(budget=8_000))
        summarized = (await session.watermarks()).summarized_through
        await memory.aclose()
    if summaries:
        assert summarized > 0, "the summary passes did not run"
    for window in windows:
        _check_anthropic(window)
        _check_converse(window)
    # Late in the loop the request is read from the archive and the gap is named.
    last = windows[-1]
    opening = next(i for i in last.items if i.kind == "turn")
    assert opening.provenance.tier == "archive"
    assert opening.provenance.turn_indexes == (0,)
    first_hot = next(i for i in last.items if i.kind == "turn" and i.provenance.tier == "hot")
    gap = f"[turns 1-{first_hot.provenance.turn_indexes[0] - 1} of this task are not shown"
    assert isinstance(opening.content[-1], TextBlock)
    assert opening.content[-1].text.startswith(gap), opening.content[-1].text


async def test_an_opening_beyond_the_reach_gives_a_continuation_line(tmp_path: Path) -> None:
    pairs = 84  # the request is 2 * 84 - 20 = 148 turns before the hot window
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing, summaries=False)
        session = await memory.session(user_id="u-loop-far")
        await session.add_turn("user", REQUEST)
        for i in range(pairs):
            await _add_pair(session, i)
        window = await session.context(budget=8_000)
        await memory.aclose()
    _check_anthropic(window)
    _check_converse(window)
    first = window.items[next(n for n, i in enumerate(window.items) if i.kind == "turn")]
    assert first.provenance.tier == "session"
    assert first.provenance.turn_indexes == ()
    text = first.content[0]
    assert isinstance(text, TextBlock)
    assert text.text.startswith("[This task continues from turns before turn ")
    assert REQUEST not in str(window.messages)
    from tiermem.session_context import OPENING_REACH

    assert 2 * pairs - 20 > OPENING_REACH


async def _trips(session: Session) -> int:
    await session.context()  # warm
    trips = RoundTrips()
    with trips.counting():
        await session.context()
    return trips.total


@pytest.mark.parametrize("pairing_name", [p for p in PAIRINGS if p in EXPECTED])
async def test_a_window_inside_a_loop_costs_what_a_plain_window_costs(
    pairing_name: str, tmp_path: Path
) -> None:
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing, summaries=False)
        chat = await memory.session(user_id="u-loop-trips-chat")
        for i in range(25):  # plain chat: the hot window starts with an answer, dropped
            await chat.add_turn("user" if i % 2 == 0 else "assistant", f"Turn {i}.")
        plain = await _trips(chat)
        session = await memory.session(user_id="u-loop-trips")
        await session.add_turn("user", REQUEST)
        await _add_pair(session, 0)
        common = await _trips(session)  # the request is in the hot window
        for i in range(1, 15):
            await _add_pair(session, i)
        # It is not any more: since e06a1c0 the request the earlier calls saw is kept
        # (ContextCache.openings), so a warmed window reads nothing more (before: one range
        # read more on every call; tests/context/test_s16_loop_opening_memo.py counts reads).
        loop = await _trips(session)
        await session.add_turn("user", "Now do shop 8 too.")
        # The window starts inside the first loop (a tool result must stay with its call):
        # its request opens the window, from the memo.
        after = await _trips(session)
        window = await session.context()
        await memory.aclose()
    assert plain <= EXPECTED[pairing_name]
    assert common == plain
    assert loop == common
    assert after == common
    _check_anthropic(window)
    assert REQUEST in str(window.messages[0].content)
    assert "Now do shop 8 too." in str(window.messages[-1].content)


@pytest.mark.parametrize("optimize", [None, False], ids=["view", "as-stored"])
async def test_a_tight_budget_keeps_the_request_first(
    optimize: bool | None, tmp_path: Path
) -> None:
    """Eviction drops the oldest tool pairs of the loop, never the request before them."""
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing, summaries=False)
        session = await memory.session(user_id="u-loop-tight")
        await session.add_turn("user", REQUEST)
        windows = []
        for i in range(30):
            await _add_pair(session, i)
            if optimize is None:  # the default (b54ac72 had no optimize argument)
                windows.append(await session.context(budget=300))
            else:
                windows.append(await session.context(budget=300, optimize=optimize))
        await memory.aclose()
    for window in windows:
        _check_anthropic(window)
        _check_converse(window)
    assert windows[-1].stats.evicted_count > 0  # the budget did cut the loop
    assert REQUEST in str(windows[-1].messages[0].content)


async def test_a_pinned_tool_result_does_not_open_the_window(tmp_path: Path) -> None:
    """The hot turns hold the user's next request, but a pinned turn before it must stay:
    the window cannot start at the request, so the earlier one is read."""
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing, summaries=False)
        session = await memory.session(user_id="u-loop-pinned")
        await session.add_turn("user", REQUEST)
        for i in range(12):
            # Turn 8, the result of call 3, is pinned: eviction may not drop it, nor the
            # window start after it; the hot window (turns 7-26) starts with its call.
            await _add_pair(session, i, pinned=i == 3)
        await session.add_turn("assistant", "Tables 0-11 are done; next, shop 8?")
        await session.add_turn("user", "Yes, shop 8 too.")
        window = await session.context(budget=8_000)
        await memory.aclose()
    _check_anthropic(window)
    _check_converse(window)
    assert REQUEST in str(window.messages[0].content)


def _turn(index: int, role: str, *blocks: Any, pinned: bool = False) -> Turn:
    return Turn(
        index=index,
        role=role,
        content=blocks,
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        pinned=pinned,
    )


def test_the_opening_marker_names_the_gap() -> None:
    from tiermem.session_context import needs_opening, opening_message

    request = _turn(4, "user", TextBlock(text=REQUEST))
    call = _turn(5, "assistant", ToolUseBlock(tool_use_id="c", name="t", input={}))
    result = _turn(6, "user", ToolResultBlock(tool_use_id="c", content=(TextBlock(text="x"),)))
    assert not needs_opening([request, call, result])
    assert needs_opening([call, result])
    assert needs_opening([result])
    assert not needs_opening([])
    # An answer before the user's turn is left out; a tool result must stay with its call.
    answer = _turn(3, "assistant", TextBlock(text="Done."))
    assert not needs_opening([answer, request, call, result])
    later = _turn(7, "user", TextBlock(text="And shop 8?"))
    assert needs_opening([call, result, later])
    # A pinned turn before the first request: the window cannot start at the request.
    pinned = _turn(5, "assistant", TextBlock(text="noted"), pinned=True)
    assert needs_opening([pinned, _turn(6, "user", TextBlock(text="next"))])

    assert opening_message(request, 5) is request  # adjacent: nothing left out
    one = opening_message(request, 6)
    assert isinstance(one, Turn)
    assert one.content[-1] == TextBlock(
        text="[turn 5 of this task is not shown; session.get_turn(i) returns turn i.]"
    )
    many = opening_message(request, 40)
    assert many.content[0] == TextBlock(text=REQUEST)
    assert many.content[-1] == TextBlock(
        text="[turns 5-39 of this task are not shown; session.get_turn(i) returns turn i.]"
    )
    line = opening_message(None, 40)
    assert isinstance(line, Message)
    assert line.role == "user"


def test_assemble_refuses_an_opening_that_is_not_the_users() -> None:
    from tiermem.context import assemble_context
    from tiermem.errors import ValidationError

    turns = [_turn(5, "assistant", TextBlock(text="Working on it."))]
    for bad in (
        Message.text("assistant", "hi"),
        _turn(4, "user", ToolResultBlock(tool_use_id="c", content=(TextBlock(text="x"),))),
        "a request",
    ):
        with pytest.raises(ValidationError, match="opening"):
            assemble_context(turns=turns, opening=bad, budget=2_000)  # type: ignore[arg-type]
    window = assemble_context(turns=turns, opening=Message.text("user", "Go on."), budget=2_000)
    assert [m.role for m in window.messages] == ["user", "assistant"]
