"""The five tools ``tiermem chat`` offers (seed 004): calculator, current time, text analyzer,
knowledge search and remember preference, registered in a
:class:`~tiermem.tools.ToolRegistry` and called through the service's dispatcher, so each
call goes through its circuit breaker, timeout and tracking like any production tool.

The calculator parses arithmetic with its own recursive-descent parser over a fixed set of
tokens (numbers, ``+ - * / // % ^ **``, parentheses): there is no ``eval`` and no name,
attribute or call can ever be evaluated, because none can even be tokenised.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tiermem.errors import ValidationError
from tiermem.models import JsonValue
from tiermem.service import MemoryService
from tiermem.tools import FunctionInvoker, ToolDispatcher, ToolRegistry, ToolSpec
from tiermem.tools.invoker import PartialSink, ToolFunction

__all__ = [
    "MAX_EXPRESSION_CHARS",
    "ChatTools",
    "analyze_text",
    "calculate",
    "format_number",
]

MAX_EXPRESSION_CHARS = 200
_MAX_DEPTH = 40
_MAX_EXPONENT = 1000
_MAX_RESULT_BITS = 4096

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?)|(?P<op>\*\*|//|[-+*/%^()×÷]))"
)


def _tokens(expression: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = expression.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValidationError(
                f"the calculator does not understand {text[pos:].strip()[:20]!r}: use numbers, "
                "+ - * / // % ^ and parentheses"
            )
        out.append(match.group("num") or match.group("op"))
        pos = match.end()
    if not out:
        raise ValidationError("the expression is empty")
    return out


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/'|'//'|'%') unary)*;
    unary := ('+'|'-') unary | power; power := atom (('^'|'**') unary)?;
    atom := number | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValidationError("the expression ends too early")
        self.pos += 1
        return token

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise ValidationError(f"unexpected {self.peek()!r} in the expression")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
            _check_size(value)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%", "×", "÷"):
            op = self.take()
            right = self.unary()
            if op in ("*", "×"):
                value = value * right
            elif right == 0:
                raise ValidationError("division by zero")
            elif op in ("/", "÷"):
                value = value / right
            elif op == "//":
                value = Fraction(value // right)
            else:
                value = value % right
            _check_size(value)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            self._enter()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() in ("^", "**"):
            self.take()
            self._enter()
            exponent = self.unary()
            self.depth -= 1
            return _power(base, exponent)
        return base

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":  # noqa: S105 -- a parser token, not a password
            self._enter()
            value = self.expr()
            self.depth -= 1
            if self.take() != ")":
                raise ValidationError("a '(' is never closed")
            return value
        if token[0].isdigit() or token[0] == ".":
            value = Fraction(token)
            _check_size(value)
            return value
        raise ValidationError(f"expected a number or '(', got {token!r}")

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise ValidationError(f"the expression nests deeper than {_MAX_DEPTH} levels")


def _check_size(value: Fraction) -> None:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > _MAX_RESULT_BITS:
        raise ValidationError("the result is too large to compute")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        if base < 0:
            raise ValidationError("a negative number has no real fractional power")
        try:
            return Fraction(float(base) ** float(exponent))
        except (OverflowError, ValueError):
            raise ValidationError("the result is too large to compute") from None
    n = exponent.numerator
    if abs(n) > _MAX_EXPONENT:
        raise ValidationError(f"exponents are limited to ±{_MAX_EXPONENT}")
    if base == 0 and n < 0:
        raise ValidationError("division by zero")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits * abs(n) > _MAX_RESULT_BITS:
        raise ValidationError("the result is too large to compute")
    return base**n


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression.

    Raises:
        ValidationError: anything but numbers, ``+ - * / // % ^ **`` and parentheses; a
            division by zero; an expression over 200 characters, nested over 40 levels, or
            whose result would exceed 4,096 bits.
    """
    if not isinstance(expression, str):
        raise ValidationError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValidationError(
            f"the expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        )
    return _Parser(_tokens(expression)).parse()


def format_number(value: Fraction) -> str:
    """An integer as is, anything else with up to 12 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    try:
        return f"{float(value):.12g}"
    except OverflowError:  # beyond a float's range: the integer part is exact enough
        return f"{value.numerator // value.denominator}"


_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?。！？]+")


def analyze_text(text: str, tokens: int) -> dict[str, JsonValue]:
    """Counts of a text: characters, words, sentences, tokens, average word length, the
    five most frequent words (seed 004's text analyzer)."""
    words = _WORD.findall(text)
    sentences = [s for s in _SENTENCE_END.split(text) if s.strip()]
    common = Counter(w.lower() for w in words if len(w) > 2).most_common(5)
    return {
        "characters": len(text),
        "words": len(words),
        "sentences": len(sentences),
        "tokens": tokens,
        "average_word_length": round(sum(map(len, words)) / len(words), 2) if words else 0.0,
        "top_words": [w for w, _ in common],
    }


def _string(arguments: Mapping[str, JsonValue], name: str, default: str | None = None) -> str:
    value = arguments.get(name, default)
    if not isinstance(value, str):
        raise ValidationError(f"argument {name!r} must be a string")
    return value


@dataclass
class ChatTools:
    """The chat's tools for one user, with the dispatcher that runs them."""

    registry: ToolRegistry
    dispatcher: ToolDispatcher

    @classmethod
    def build(cls, memory: MemoryService, user_id: str) -> ChatTools:
        """Register the five tools (as Python functions) and open a dispatcher whose
        breakers live in the service's hot tier."""

        async def calculator(args: Mapping[str, JsonValue], emit: PartialSink) -> str:
            expression = _string(args, "expression")
            return f"{expression.strip()} = {format_number(calculate(expression))}"

        async def current_time(args: Mapping[str, JsonValue], emit: PartialSink) -> str:
            name = _string(args, "timezone", "UTC")
            try:
                zone = ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValidationError(f"unknown time zone {name!r}; use e.g. Asia/Tokyo") from None
            now = memory.clock.now().astimezone(zone)
            return f"{now:%Y-%m-%d %H:%M:%S} {name} ({now:%A})"

        async def text_analyzer(
            args: Mapping[str, JsonValue], emit: PartialSink
        ) -> dict[str, JsonValue]:
            text = _string(args, "text")
            return analyze_text(text, memory.tokens.count(text))

        async def knowledge_search(
            args: Mapping[str, JsonValue], emit: PartialSink
        ) -> dict[str, JsonValue]:
            query = _string(args, "query")
            hits = await memory.longterm.recall(user_id, query, k=3, scope=("chunk", "memory"))
            return {"query": query, "hits": [{"kind": h.kind, "text": h.text} for h in hits]}

        async def remember_preference(args: Mapping[str, JsonValue], emit: PartialSink) -> str:
            record = await memory.longterm.upsert_preference(
                user_id, _string(args, "key"), _string(args, "value")
            )
            return f"remembered {record.content} ({record.memory_id})"

        def schema(**props: str) -> dict[str, JsonValue]:
            return {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
                "required": list(props),
            }

        specs: list[tuple[ToolSpec, ToolFunction]] = [
            (
                ToolSpec(
                    "calculator",
                    "Exact arithmetic: + - * / // % ^ and parentheses.",
                    schema(expression="e.g. 15*37 or (1200*3)*1.1"),
                ),
                calculator,
            ),
            (
                ToolSpec(
                    "get_current_time",
                    "The current date and time in a time zone.",
                    {"type": "object", "properties": {"timezone": {"type": "string"}}},
                ),
                current_time,
            ),
            (
                ToolSpec(
                    "analyze_text",
                    "Counts of a text: words, sentences, tokens, frequent words.",
                    schema(text="the text to analyse"),
                ),
                text_analyzer,
            ),
            (
                ToolSpec(
                    "search_knowledge",
                    "Search the user's uploaded documents and memories.",
                    schema(query="what to look for"),
                    timeout=timedelta(seconds=10),
                ),
                knowledge_search,
            ),
            (
                ToolSpec(
                    "remember_preference",
                    "Store a preference of the user (key and value).",
                    schema(key="e.g. genre", value="e.g. seinen"),
                ),
                remember_preference,
            ),
        ]
        registry = ToolRegistry()
        invoker = FunctionInvoker({spec.name: fn for spec, fn in specs})
        for spec, _ in specs:
            registry.register(spec, invoker)
        return cls(registry, memory.tools(registry))
