"""``tiermem chat``: talk to a model with tiermem as its memory, in the terminal.

Each message is added as a turn, the context window is assembled from the session and the
user's long-term memory (:meth:`Session.context`), and the reply is added as a turn too, so
``tiermem inspect`` and the inspector show the conversation as the model saw it.

With an LLM configured (``TIERMEM_LLM``, :func:`tiermem.llm.chat_factory.open_chat_model`)
the model writes the replies from the assembled context. With none, chat says so and uses
the :class:`ExtractiveResponder`: it answers with what memory recalled for the message (and
any tool result), which is enough to watch memory work offline.

Seed 004's tools are offered as commands (``/calc``, ``/time``, ``/analyze``, ``/search``,
``/remember key=value``) and arithmetic in a message runs the calculator; every call goes
through the tool dispatcher (breaker, timeout, tracking).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rich.markup import escape

from tiermem.context import ContextWindow
from tiermem.errors import TierMemError, ValidationError
from tiermem.interfaces.cli_common import Ids, console, open_memory
from tiermem.interfaces.cli_tools import ChatTools, calculate
from tiermem.interfaces.display import unscope_text
from tiermem.llm.chat import ChatMessage, ChatModel
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.tools.errors import ToolCallError, ToolUnavailableError

__all__ = ["HELP", "ExtractiveResponder", "ToolCall", "chat", "route_tool"]

HELP = """commands:
  /calc EXPR          calculator (also runs on arithmetic in a message: "what is 15*37?")
  /time [ZONE]        current time, e.g. /time Asia/Tokyo
  /analyze TEXT       text statistics
  /search QUERY       search uploaded documents and memories
  /remember KEY=VALUE remember a preference, e.g. /remember genre=seinen
  /context            the last context window's stats
  /tools              tool health (breakers)
  /help, /quit"""

_ARITHMETIC = re.compile(
    r"(?<![\w.])(\(?\s*-?\d[\d.\s]*(?:\s*(?:\*\*|//|[-+*/%^×÷])\s*\(?\s*-?\d[\d.]*\s*\)?)+)"
)
_STRONG_OPERATOR = re.compile(r"\*|/|\^|%|×|÷")
_CALC_CUE = re.compile(
    r"\b(what's|what is|calculate|compute|how much is|sum of|equals?)\b|=\s*\??\s*$", re.I
)
_SYSTEM = (
    "You are a helpful shop assistant with long-term memory. Use what the context says "
    "about the user; if a tool result is given, use it. Answer briefly."
)


@dataclass(frozen=True)
class ToolCall:
    tool: str
    arguments: dict[str, str]


def route_tool(message: str) -> ToolCall | None:
    """The tool a message asks for: a ``/command``, or arithmetic in plain text."""
    text = message.strip()
    command, _, rest = text.partition(" ")
    rest = rest.strip()
    if command == "/calc":
        return ToolCall("calculator", {"expression": rest})
    if command == "/time":
        return ToolCall("get_current_time", {"timezone": rest or "UTC"})
    if command == "/analyze":
        return ToolCall("analyze_text", {"text": rest})
    if command == "/search":
        return ToolCall("search_knowledge", {"query": rest})
    if command == "/remember":
        key, sep, value = rest.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValidationError("use /remember KEY=VALUE, e.g. /remember genre=seinen")
        return ToolCall("remember_preference", {"key": key.strip(), "value": value.strip()})
    if text.startswith("/"):
        return None
    match = _ARITHMETIC.search(text)
    if match is None:
        return None
    expression = match.group(1).strip()
    # "volumes 41-42" or "1-3 days" are ranges, not sums: a lone + or - needs a cue.
    if not (_STRONG_OPERATOR.search(expression) or _CALC_CUE.search(text)):
        return None
    try:
        calculate(expression)
    except ValidationError:
        return None
    return ToolCall("calculator", {"expression": expression})


class ExtractiveResponder:
    """The offline stand-in for a model: it extracts, it does not generate.

    The reply is the tool result (if a tool ran), then what the context window holds that
    is not the conversation itself -- recalled memories and turns, the user profile, the
    active entities -- each with where it came from.
    """

    name = "offline:extractive"

    def respond(self, message: str, window: ContextWindow, tool_result: str | None) -> str:
        lines: list[str] = []
        if tool_result is not None:
            lines.append(tool_result)
        recalled: list[str] = []
        for item in window.items:
            if item.kind == "recall":
                where: str = item.provenance.tier
                if item.provenance.turn_indexes:
                    where += f", turn {','.join(map(str, item.provenance.turn_indexes))}"
                recalled.append(f"- {item.text.strip()} ({where})")
            elif item.kind == "profile" and "No prior information" not in item.text:
                recalled.append(f"- {' '.join(item.text.split())[:300]} (profile)")
            elif item.kind == "entities":
                recalled.append(f"- now talking about: {' '.join(item.text.split())[:200]}")
        if recalled:
            lines.append("From memory:")
            lines.extend(recalled[:6])
        if not lines:
            lines.append("Noted. Nothing in memory relates to that yet.")
        return "\n".join(lines)


def _messages(window: ContextWindow) -> tuple[str, list[ChatMessage]]:
    """The window as a system text (everything derived) and alternating messages (turns)."""
    system: list[str] = [_SYSTEM]
    messages: list[ChatMessage] = []
    for item in window.items:
        if item.kind in ("turn", "current") and item.role in ("user", "assistant"):
            role: Literal["user", "assistant"] = "user" if item.role == "user" else "assistant"
            if messages and messages[-1].role == role:
                messages[-1] = ChatMessage(role, messages[-1].text + "\n" + item.text)
            elif messages or role == "user":
                messages.append(ChatMessage(role, item.text))
        elif item.kind not in ("system", "tools"):
            system.append(item.text)
    return "\n\n".join(system), messages


async def _reply(
    model: ChatModel | None,
    responder: ExtractiveResponder,
    message: str,
    window: ContextWindow,
    tool_result: str | None,
) -> str:
    if model is None:
        return responder.respond(message, window, tool_result)
    system, messages = _messages(window)
    if tool_result is not None:
        system += f"\n\nTool result: {tool_result}"
    reply = await model.complete(messages, system=system, max_tokens=512, temperature=0.3)
    return reply.text.strip() or "(the model returned no text)"


async def _call_tool(tools: ChatTools, call: ToolCall) -> str:
    if call.tool == "calculator":
        calculate(call.arguments["expression"])  # a typo is the user's error, not the tool's
    try:
        result = await tools.dispatcher.call(call.tool, dict(call.arguments))
    except (ToolCallError, ToolUnavailableError) as exc:
        return f"[{call.tool} failed: {exc}]"
    note = f" ({result.agent_note})" if result.agent_note else ""
    return f"[{result.tool}] {result.text}{note}"


def open_model(settings: TierMemSettings) -> tuple[ChatModel | None, str]:
    """The configured chat model, or None with the reason to show."""
    try:
        from tiermem.llm.chat_factory import open_chat_model
    except ImportError:
        return None, "no LLM support in this build"
    try:
        model = open_chat_model(settings)
    except TierMemError as exc:
        return None, f"the configured LLM cannot be used: {exc}"
    if model is None:
        return None, "no LLM configured (set TIERMEM_LLM and TIERMEM_LLM_MODEL)"
    return model, f"model {model.name}"


async def chat(
    settings: TierMemSettings,
    ids: Ids,
    *,
    user_id: str,
    session_id: str | None,
    budget: int,
    read: Callable[[str], str] | None = None,
    model: ChatModel | None = None,
) -> int:
    """Run the chat loop until /quit or end of input; returns the turns added."""
    reason = f"model {model.name}" if model is not None else ""
    if model is None:
        model, reason = open_model(settings)
    if model is None:
        console.print(
            f"[yellow]{escape(reason)}[/yellow]: using the offline extractive responder, "
            "which answers with what memory recalls"
        )
    read = read or (lambda prompt: console.input(prompt))
    responder = ExtractiveResponder()
    async with open_memory(settings) as memory:
        session = await memory.session(
            ids.session(session_id) if session_id else None, user_id=ids.user(user_id)
        )
        tools = ChatTools.build(memory, ids.user(user_id))
        first = (await session.view()).next_index
        console.print(
            f"session {ids.show(session.id)} for user {user_id} "
            f"({reason if model is not None else 'offline'}); "
            "/help for tools, /quit to leave"
        )
        last: ContextWindow | None = None
        while True:
            try:
                line = read("you> ").strip()
            except EOFError:
                break
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/help":
                console.print(HELP)
                continue
            if line in ("/context", "/tools"):
                await _show(line, last, tools)
                continue
            try:
                last = await _turn(memory, session, tools, model, responder, line, budget, ids)
            except TierMemError as exc:
                console.print(f"[red]error:[/red] {exc}")
        await memory.drain()
        added = (await session.view()).next_index - first
    console.print(f"{added} turns added to session {ids.show(session.id)}")
    return added


async def _turn(
    memory: MemoryService,
    session: Session,
    tools: ChatTools,
    model: ChatModel | None,
    responder: ExtractiveResponder,
    line: str,
    budget: int,
    ids: Ids,
) -> ContextWindow:
    call = route_tool(line)
    if line.startswith("/") and call is None:
        raise ValidationError(f"unknown command {line.split()[0]!r}; /help lists them")
    tool_result = await _call_tool(tools, call) if call is not None else None
    await session.add_turn("user", line)
    await memory.drain()  # let detection store what this message revealed before recall
    window = await session.context(query=line, budget=budget)
    reply = await _reply(model, responder, line, window, tool_result)
    reply = unscope_text(reply, ids.scope)  # recall lines name sessions by store id
    await session.add_turn("assistant", reply)
    console.print(f"[bold]assistant>[/bold] {escape(reply)}", markup=True, highlight=False)
    stats = window.stats
    console.print(
        f"[dim]context {stats.total_tokens}/{stats.budget_tokens} tokens · "
        f"{stats.total_turns} turns · {_by_kind(stats.tokens_by_tier)}[/dim]"
    )
    return window


def _by_kind(tokens: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in tokens.items() if v)


async def _show(command: str, last: ContextWindow | None, tools: ChatTools) -> None:
    if command == "/context":
        if last is None:
            console.print("no context assembled yet")
            return
        for item in last.items:
            console.print(f"  {item.kind:17} {item.tokens:>5} tok  from {item.provenance.tier}")
        return
    for status in await tools.dispatcher.statuses():
        console.print(f"  {status.name:20} {status.breaker.value:9} {status.health.value}")
