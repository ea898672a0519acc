"""The Session API refuses bad arguments with tiermem's ValidationError, saying what was
wrong, and changes nothing (session 14's audit of the SDK edge). Before, some of these
raised TypeError or pydantic's own error, and some were silently dropped: an unknown
metadata field or ``add_turn`` option (a typo) vanished, ``get_turn(True)`` looked for
turn 1, ``set_entities(remove="series")`` removed the kinds "s", "e", "r" and "i"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings

Call = Callable[[Session], Awaitable[Any]]

REFUSED: list[tuple[str, Call, str]] = [
    ("get_turn(True)", lambda s: s.get_turn(True), "turn index"),
    ("get_turns(0, 'x')", lambda s: s.get_turns(0, "x"), "range's end"),
    (
        "update_metadata(bogus=1)",
        lambda s: s.update_metadata(bogus=1),
        "unknown metadata field 'bogus'",
    ),
    (
        "update_metadata(attributes=5)",
        lambda s: s.update_metadata(attributes=5),
        "attributes must be a mapping",
    ),
    (
        "update_metadata(cart_item_count=-1)",
        lambda s: s.update_metadata(cart_item_count=-1),
        "metadata is not valid: cart_item_count",
    ),
    (
        "update_metadata(schema_version=9)",
        lambda s: s.update_metadata(schema_version=9),
        "cannot change schema_version",
    ),
    ("set_entities({'a': 1})", lambda s: s.set_entities({"a": 1}), "entity is not valid: value"),
    ("set_entities(['a'])", lambda s: s.set_entities(["a"]), "mapping of kind to value"),
    (
        "set_entities({}, remove='series')",
        lambda s: s.set_entities({}, remove="series"),
        "collection of entity kinds",
    ),
    ("get_state(5)", lambda s: s.get_state(5), "state name must be a string"),
    ("get_state('')", lambda s: s.get_state(""), "state name must not be empty"),
    ("put_state('x', object())", lambda s: s.put_state("x", object()), "state data is a mapping"),
    (
        "put_state('x', {}, expected_version='1')",
        lambda s: s.put_state("x", {}, expected_version="1"),
        "expected_version",
    ),
    ("summaries(wait_through='x')", lambda s: s.summaries(wait_through="x"), "wait_through"),
    ("structured(wait_through=-5)", lambda s: s.structured(wait_through=-5), "wait_through"),
    (
        "add_turn(..., bogus=1)",
        lambda s: s.add_turn("user", "x", bogus=1),
        "unknown add_turn option 'bogus'",
    ),
    (
        "add_turns([{..., 'pined': True}])",
        lambda s: s.add_turns([{"role": "user", "content": "x", "pined": True}]),
        "unknown field of turns[0] 'pined'",
    ),
]


@pytest.mark.parametrize(("label", "call", "message"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_bad_argument_is_refused_and_changes_nothing(
    label: str, call: Call, message: str
) -> None:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(user_id="u-edges")
        await session.add_turn("user", "Is vol 42 in stock?")
        await session.put_state("cart", {"items": 1})
        before = (
            await session.get_turns(),
            await session.metadata(),
            await session.active_entities(),
            await session.get_state("cart"),
        )
        with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
            await call(session)
        after = (
            await session.get_turns(),
            await session.metadata(),
            await session.active_entities(),
            await session.get_state("cart"),
        )
        assert after == before


LONGTERM_REFUSED: list[tuple[str, Callable[[Any], Awaitable[Any]], str]] = [
    ("recall(u, 5)", lambda lt: lt.recall("u-edges", 5), "query must be a string"),
    (
        "recall(since='yesterday')",
        lambda lt: lt.recall("u-edges", "manga", since="yesterday"),
        "since must be an aware datetime, got str",
    ),
    (
        "changes(since='x')",
        lambda lt: lt.changes("u-edges", since="x"),
        "since must be an aware datetime",
    ),
    (
        "list(types='preference')",
        lambda lt: lt.list("u-edges", types="preference"),
        "types must be a collection of type names",
    ),
]


@pytest.mark.parametrize(
    ("label", "call", "message"), LONGTERM_REFUSED, ids=[r[0] for r in LONGTERM_REFUSED]
)
async def test_long_term_memory_refuses_bad_arguments(
    label: str, call: Callable[[Any], Awaitable[Any]], message: str
) -> None:
    """Before: AttributeError from deep inside (``'int' object has no attribute
    'isascii'``, ``'str' object has no attribute 'tzinfo'``) or, for a type list given as
    one string, "unknown memory type 'p'"."""
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as memory:
        await memory.longterm.remember("u-edges", "I like seinen manga", memory_type="preference")
        before = await memory.longterm.list("u-edges")
        with pytest.raises(ValidationError, match=message):
            await call(memory.longterm)
        assert await memory.longterm.list("u-edges") == before
