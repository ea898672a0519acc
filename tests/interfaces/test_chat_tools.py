"""The chat's tools: the calculator's own parser (exact, bounded, and unable to evaluate a
name, attribute or call), the tool router, and the tools run through the dispatcher."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.interfaces.cli_chat import ExtractiveResponder, route_tool
from tiermem.interfaces.cli_tools import ChatTools, analyze_text, calculate, format_number
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("15*37", "555"),
        ("(1200*3)*1.1", "3960"),
        ("2^10", "1024"),
        ("2**-2", "0.25"),
        ("-3--3", "0"),
        ("10/3", "3.33333333333"),
        ("7//2", "3"),
        ("-7 % 3", "2"),
        ("1e3 * 2", "2000"),
        ("0.1 + 0.2", "0.3"),  # exact: no binary float error
        ("2 ^ 3 ^ 2", "512"),  # right-associative
        ("-2^2", "-4"),
        ("12 × 3 ÷ 4", "9"),
    ],
)
def test_calculator_values(expression: str, value: str) -> None:
    assert format_number(calculate(expression)) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('id')", "does not understand"),
        ("(1).__class__", "does not understand"),
        ("abs(-1)", "does not understand"),
        ("x + 1", "does not understand"),
        ("1/0", "division by zero"),
        ("9^9^9", "exponents are limited"),
        ("1000^999", "too large"),
        ("(" * 50 + "1" + ")" * 50, "nests deeper"),
        ("-" * 60 + "1", "nests deeper"),
        ("1" * 201, "the limit is 200"),
        ("(1+2", "never closed|ends too early"),
        ("2 3", "unexpected '3'"),
        ("", "empty"),
        ("(-8)^0.5", "no real fractional power"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        calculate(expression)


_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_NUMBER = st.integers(min_value=0, max_value=10**6).map(str)


@st.composite
def _hostile(draw: st.DrawFn) -> str:
    """Arithmetic with a name, attribute access, call or subscript spliced in somewhere."""
    parts = draw(st.lists(_NUMBER, min_size=1, max_size=4))
    ops = draw(
        st.lists(
            st.sampled_from(["+", "-", "*", "/"]), min_size=len(parts) - 1, max_size=len(parts) - 1
        )
    )
    name = draw(_IDENT)
    form = draw(st.sampled_from(["{n}", "{n}.real", "{n}()", "{n}[0]", "(1).{n}", "{n}.{n}(1)"]))
    hostile = form.format(n=name)
    tokens = [parts[0]]
    for op, part in zip(ops, parts[1:], strict=True):
        tokens += [op, part]
    position = draw(st.integers(min_value=0, max_value=len(tokens)))
    if position % 2:  # keep the operator/operand rhythm: insert an operand with an operator
        tokens[position:position] = [hostile, "+"]
    else:
        tokens[position:position] = [hostile, "*"] if position < len(tokens) else ["+", hostile]
    return " ".join(tokens)


@given(_hostile())
def test_names_attributes_and_calls_are_never_evaluated(expression: str) -> None:
    """No expression holding an identifier is ever computed: it cannot even be tokenised
    (there is no eval, and the tokenizer only knows numbers, operators and brackets)."""
    with pytest.raises(ValidationError):
        calculate(expression)


@st.composite
def _arithmetic(draw: st.DrawFn, depth: int = 0) -> tuple[str, Fraction]:
    """An expression tree rendered as text, with its value computed on the tree."""
    if depth >= 3 or draw(st.booleans()):
        n = draw(st.integers(min_value=0, max_value=999))
        return str(n), Fraction(n)
    left, lv = draw(_arithmetic(depth + 1))
    right, rv = draw(_arithmetic(depth + 1))
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    if op == "/" and rv == 0:
        op = "+"
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else lv}[op]
    return f"({left} {op} {right})", value


@given(_arithmetic())
def test_arithmetic_is_exact(case: tuple[str, Fraction]) -> None:
    expression, value = case
    assert calculate(expression) == value


def test_text_analyzer_counts() -> None:
    stats = analyze_text("Berserk is dark. Vinland Saga is calm! Berserk again?", tokens=12)
    assert stats["words"] == 9
    assert stats["sentences"] == 3
    assert stats["top_words"][0] == "berserk"  # type: ignore[index]
    assert stats["tokens"] == 12


@pytest.mark.parametrize(
    ("message", "tool", "arguments"),
    [
        ("what is 15*37?", "calculator", {"expression": "15*37"}),
        ("what is 1200 + 800?", "calculator", {"expression": "1200 + 800"}),
        ("3 * 1200", "calculator", {"expression": "3 * 1200"}),
        ("/calc (2+3)*4", "calculator", {"expression": "(2+3)*4"}),
        ("/time Asia/Tokyo", "get_current_time", {"timezone": "Asia/Tokyo"}),
        ("/time", "get_current_time", {"timezone": "UTC"}),
        ("/analyze some text", "analyze_text", {"text": "some text"}),
        ("/search berserk", "search_knowledge", {"query": "berserk"}),
        ("/remember genre = seinen", "remember_preference", {"key": "genre", "value": "seinen"}),
    ],
)
def test_router_picks_the_tool(message: str, tool: str, arguments: dict[str, str]) -> None:
    call = route_tool(message)
    assert call is not None
    assert (call.tool, call.arguments) == (tool, arguments)


@pytest.mark.parametrize(
    "message",
    [
        "Do you have Berserk vol 42?",
        "hello",
        "/unknown x",
        "Do you have volumes 41-42?",
        "delivery takes 1-3 days",
        "order #A-1001 please",
    ],
)
def test_router_leaves_plain_messages_alone(message: str) -> None:
    assert route_tool(message) is None


def test_remember_needs_key_and_value() -> None:
    with pytest.raises(ValidationError, match="KEY=VALUE"):
        route_tool("/remember seinen")


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[MemoryService]:
    clock = FakeClock(datetime(2026, 5, 1, 3, 0, tzinfo=UTC))
    service = MemoryService.from_settings(
        TierMemSettings(sqlite_path=tmp_path / "t.db"), clock=clock
    )
    try:
        yield service
    finally:
        await service.aclose()


async def test_tools_run_through_the_dispatcher(memory: MemoryService) -> None:
    tools = ChatTools.build(memory, "u-1")
    result = await tools.dispatcher.call("calculator", {"expression": "15*37"})
    assert result.text == "15*37 = 555"
    now = await tools.dispatcher.call("get_current_time", {"timezone": "Asia/Tokyo"})
    assert now.text.startswith("2026-05-01 12:00:00 Asia/Tokyo")  # the service's clock
    await tools.dispatcher.call("remember_preference", {"key": "genre", "value": "seinen"})
    assert (await memory.longterm.get_preference("u-1", "genre")) is not None
    found = await tools.dispatcher.call("search_knowledge", {"query": "genre seinen"})
    assert "seinen" in found.text
    assert tools.dispatcher.stats("calculator").calls == 1


async def test_offline_responder_answers_from_memory(memory: MemoryService) -> None:
    session = await memory.session("s-1", user_id="u-1")
    await session.add_turn("user", "I prefer seinen. Do you have Berserk vol 42?")
    await memory.drain()
    window = await session.context(query="what genre do I like?")
    reply = ExtractiveResponder().respond("what genre do I like?", window, "[calculator] 1 = 1")
    assert reply.startswith("[calculator] 1 = 1")
    assert "seinen" in reply


async def test_chat_with_a_model_sends_it_the_assembled_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The LLM path of ``tiermem chat`` with the scripted model (the adapters are tested in
    tests/llm): the model gets the derived context as system text and the turns as
    alternating messages, and its reply is stored as the assistant turn."""
    from tiermem.interfaces.cli_chat import chat
    from tiermem.interfaces.cli_common import Ids
    from tiermem.llm.chat import ModelFailedError
    from tiermem.llm.chat_scripted import ScriptedChatModel

    model = ScriptedChatModel(
        ["Berserk 42 is in stock.", "That is 555.", ModelFailedError("model down")]
    )
    lines = iter(["I prefer seinen. Do you have Berserk vol 42?", "what is 15*37?", "hello"])

    def read(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    settings = TierMemSettings(sqlite_path=tmp_path / "t.db")
    added = await chat(
        settings,
        Ids.of("local", False),
        user_id="u-1",
        session_id="s-1",
        budget=4000,
        read=read,
        model=model,
    )
    assert added == 5  # the failed reply leaves its user turn, and the chat goes on
    second = model.calls[1]
    assert second.system is not None
    assert "Tool result: [calculator] 15*37 = 555" in second.system
    assert "seinen" in second.system  # the preference detected from the first message
    assert [m.role for m in second.messages] == ["user", "assistant", "user"]
    assert second.messages[-1].text == "what is 15*37?"
    out = capsys.readouterr().out
    assert "model down" in out
    memory = MemoryService.from_settings(settings)
    try:
        turns = await memory.tiers.get_turns("local:s-1")
        assert [(t.role, t.content[0].text) for t in turns][:4] == [  # type: ignore[union-attr]
            ("user", "I prefer seinen. Do you have Berserk vol 42?"),
            ("assistant", "Berserk 42 is in stock."),
            ("user", "what is 15*37?"),
            ("assistant", "That is 555."),
        ]
    finally:
        await memory.aclose()
