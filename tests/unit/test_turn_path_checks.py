"""The turn path's cheap checks say exactly what the thorough ones would.

Each check here has a fast path for the common input (measured in bench/turn_cpu.py);
these compare it, on generated inputs, with a plain statement of the rule: the in-memory
store's entity sizes with ``json.dumps``, ``check_shape`` with a recursive walk, the TTL
policies' argument checks with their full checks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import TextBlock, UserTier
from tiermem.models.shape import MAX_JSON_DEPTH, check_shape
from tiermem.policies.ttl import HybridTtl, _check, _check_fully
from tiermem.store.backends.memory import _member_size

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(),
    st.sampled_from(['a"b', "a\\b", "tab\there", "\x7f", "é", "\ud800", "日本"]),
)


def _json_member_size(kind: str, value: Any) -> int | None:
    try:
        member = json.dumps(
            {kind: value}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        return len(member.encode()) - 2
    except (TypeError, ValueError):
        return None


@settings(max_examples=1500)
@given(
    st.one_of(st.text(), st.sampled_from(["order_id", 'a"b', "\ud800"])),
    st.one_of(scalars, st.dictionaries(st.text(), scalars), st.lists(scalars, max_size=3)),
)
def test_an_entity_members_size_is_its_serialized_size(kind: str, value: Any) -> None:
    assert _member_size(kind, value) == _json_member_size(kind, value)


def test_an_entity_as_stored_is_measured_exactly() -> None:
    value = {
        "kind": "series",
        "value": "Berserk « 42 »",
        "turn_index": 7,
        "updated_at": "2030-01-01T00:00:00Z",
    }
    assert _member_size("series", value) == _json_member_size("series", value)


def _reference_shape_error(value: Any, depth: int = 0) -> str | None:
    """The rule as written in tiermem.models.shape: no lone surrogate in any string, no
    container deeper than MAX_JSON_DEPTH."""
    if isinstance(value, str):
        encodable = all(not 0xD800 <= ord(ch) <= 0xDFFF for ch in value)
        return None if encodable else "surrogate"
    if isinstance(value, dict):
        children: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple):
        children = list(value)
    elif isinstance(value, TextBlock):
        children = list(value.__dict__.values())
    else:
        return None
    if depth > MAX_JSON_DEPTH:
        return "depth"
    for child in children:
        error = _reference_shape_error(child, depth + 1)
        if error is not None:
            return error
    return None


trees = st.recursive(
    scalars | st.builds(TextBlock, text=st.text()),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=50,
)


def _nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=1000)
@given(trees)
def test_check_shape_refuses_what_the_rule_refuses(value: Any) -> None:
    expected = _reference_shape_error(value)
    if expected is None:
        check_shape(value, what="turn content")
    else:
        with pytest.raises(ValidationError):
            check_shape(value, what="turn content")


@pytest.mark.parametrize(
    ("depth", "refused"),
    [(MAX_JSON_DEPTH - 1, False), (MAX_JSON_DEPTH, False), (MAX_JSON_DEPTH + 1, True)],
)
def test_check_shape_draws_the_depth_line_where_the_rule_does(depth: int, refused: bool) -> None:
    value = {"input": _nested(depth)}  # its innermost list is ``depth`` levels down
    assert (_reference_shape_error(value) == "depth") is refused
    if refused:
        with pytest.raises(ValidationError, match="nests deeper than"):
            check_shape(value, what="tool input")
    else:
        check_shape(value, what="tool input")


NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
times = st.sampled_from(
    [
        NOW,
        NOW.astimezone(timezone(timedelta(hours=9))),
        datetime(2030, 1, 1, 12),  # naive
        NOW - timedelta(minutes=5),
    ]
)


def _outcome(check: Any, **arguments: Any) -> Any:
    try:
        return check(**arguments)
    except ValidationError as exc:
        return str(exc)


@settings(max_examples=1000)
@given(
    now=times,
    created_at=times,
    current=st.one_of(st.none(), times),
    turn_count=st.integers(-2, 30),
    tier=st.sampled_from([*UserTier, "premium", "gold"]),
    event=st.sampled_from(["read", "write", "delete"]),
)
def test_the_ttl_fast_check_agrees_with_the_full_one(
    now: datetime,
    created_at: datetime,
    current: datetime | None,
    turn_count: int,
    tier: Any,
    event: str,
) -> None:
    arguments = {
        "now": now,
        "created_at": created_at,
        "turn_count": turn_count,
        "user_tier": tier,
        "event": event,
        "current_expires_at": current,
    }
    assert _outcome(_check, **arguments) == _outcome(_check_fully, **arguments)


def test_a_ttl_given_other_zones_decides_the_same_instant() -> None:
    tokyo = timezone(timedelta(hours=9))
    utc = HybridTtl().expires_at(
        now=NOW,
        created_at=NOW,
        turn_count=12,
        user_tier=UserTier.VIP,
        event="read",
        current_expires_at=NOW,
    )
    zoned = HybridTtl().expires_at(
        now=NOW.astimezone(tokyo),
        created_at=NOW.astimezone(tokyo),
        turn_count=12,
        user_tier=UserTier.VIP,
        event="read",
        current_expires_at=NOW.astimezone(tokyo),
    )
    assert utc == zoned == NOW + timedelta(hours=2)
