"""The encoders every backend stores with write exactly what they wrote before (issue #8,
session 17): ``encode_turn`` and ``encode_memory`` call the models' serializers directly
instead of ``model_dump_json`` (the same bytes, the size taken from them), and
``to_epoch_us`` skips the ``utcoffset()`` call for UTC. Each is compared with a copy of
the code before on generated values, errors included."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError

from tiermem.errors import ValidationError
from tiermem.models import (
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    MemoryRecord,
    NewTurn,
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Turn,
)
from tiermem.models.content import CachePointBlock, UnknownBlock
from tiermem.models.turns import Entity
from tiermem.store.backends.sqlite._mapping import to_epoch_us
from tiermem.store.codec import _first_line, encode_memory, encode_turn
from tiermem.store.contract import MAX_MEMORY_BYTES, MAX_TURN_BYTES, check_size
from tiermem.store.keys import validate_id

# -- the code before ------------------------------------------------------------------------


def ref_encode_turn(turn: Turn) -> str:
    try:
        payload = turn.model_dump_json()
    except PydanticSerializationError as exc:
        raise ValidationError(
            f"turn {turn.index} cannot be serialized ({_first_line(exc)}); check it for "
            "lone surrogates or nesting deeper than tiermem.models.shape.MAX_JSON_DEPTH"
        ) from exc
    check_size(payload, limit=MAX_TURN_BYTES, what=f"turn {turn.index}")
    return payload


def ref_encode_memory(record: MemoryRecord) -> str:
    validate_id(record.user_id, what="user_id")
    validate_id(record.memory_id, what="memory_id")
    validate_id(record.memory_type, what="memory_type")
    payload = record.model_dump_json()
    check_size(payload, limit=MAX_MEMORY_BYTES, what=f"memory {record.memory_id}")
    return payload


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def ref_to_epoch_us(value: datetime, *, what: str = "timestamp") -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(
            f"{what} has no timezone; pass an aware datetime, e.g. datetime.now(UTC)"
        )
    return (value - _EPOCH) // _MICROSECOND


# -- generated values -----------------------------------------------------------------------

_TEXT = st.text(
    st.characters(codec="utf-8") | st.sampled_from('\x00\x1f\x7f\u2028"\\/\n\t漫画😀'),
    max_size=40,
)
_SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _TEXT
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_BYTES = st.binary(max_size=24)
_BLOCK = st.one_of(
    st.builds(TextBlock, text=_TEXT),
    st.builds(ToolUseBlock, tool_use_id=_TEXT, name=_TEXT, input=_JSON),
    st.builds(
        ToolResultBlock,
        tool_use_id=_TEXT,
        content=st.tuples(
            st.builds(TextBlock, text=_TEXT),
            st.builds(lambda v: JsonBlock.model_validate({"json": v}), _JSON),
        ),
        status=st.sampled_from(["success", "error"]),
    ),
    st.builds(ImageBlock, format=st.just("png"), data=_BYTES | st.none(), uri=_TEXT | st.none()),
    st.builds(DocumentBlock, format=st.just("md"), name=_TEXT, data=_BYTES | st.none()),
    st.builds(ReasoningBlock, text=_TEXT, signature=_TEXT | st.none(), redacted=_BYTES | st.none()),
    st.just(CachePointBlock()),
    st.builds(UnknownBlock, kind=_TEXT, data=st.dictionaries(_TEXT, _JSON, max_size=2)),
)
_WHEN = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
_ZONE = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-11))]
)


@st.composite
def _turns(draw: st.DrawFn) -> Turn:
    new = NewTurn(
        role=draw(st.sampled_from(["user", "assistant"])),
        content=tuple(draw(st.lists(_BLOCK, min_size=1, max_size=3))),
        timestamp=draw(_WHEN),
        token_count=draw(st.integers(min_value=0, max_value=2**40)),
        importance=draw(st.floats(min_value=0.0, max_value=1.0)),
        pinned=draw(st.booleans()),
        agent_name=draw(_TEXT | st.none()),
        intent=draw(_TEXT | st.none()),
        latency_ms=draw(st.floats(min_value=0.0, allow_infinity=False) | st.none()),
        entities=tuple(draw(st.lists(st.builds(Entity, kind=_TEXT, value=_TEXT), max_size=3))),
        redacted=draw(st.booleans()),
        metadata=draw(st.dictionaries(_TEXT, _JSON, max_size=4)),
    )
    return new.with_index(draw(st.integers(min_value=0, max_value=2**62)))


@st.composite
def _memories(draw: st.DrawFn) -> MemoryRecord:
    created = draw(_WHEN)
    return MemoryRecord(
        memory_id=draw(st.sampled_from(["m-1", "pref-abc", "chg-0179"])),
        user_id="u-1",
        memory_type=draw(st.sampled_from(["fact", "preference"])),
        content=draw(_TEXT),
        tags=tuple(draw(st.lists(_TEXT, max_size=3))),
        metadata=draw(st.dictionaries(_TEXT, _JSON, max_size=3)),
        importance=draw(st.floats(min_value=0.0, max_value=1.0)),
        created_at=created,
        expires_at=draw(st.none() | st.just(created + timedelta(days=30))),
        version=draw(st.integers(min_value=1, max_value=99)),
        embedding=draw(st.none() | st.tuples(st.floats(-1, 1), st.floats(-1, 1))),
    )


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    """What an encoder gives: its text, or its error's type and message."""
    try:
        return ("ok", encode(value))
    except Exception as exc:  # noqa: BLE001 -- the error is the outcome compared
        return (type(exc).__name__, str(exc))


# -- the tests ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(_turns())
def test_encode_turn_writes_what_model_dump_json_wrote(turn: Turn) -> None:
    assert _outcome(encode_turn, turn) == _outcome(ref_encode_turn, turn)


def test_a_plain_text_turn_is_the_same_json() -> None:
    turn = NewTurn(
        role="user", content=(TextBlock(text="tea ü 漫画"),), timestamp=datetime.now(UTC)
    ).with_index(3)
    assert encode_turn(turn) == turn.model_dump_json() == ref_encode_turn(turn)


@pytest.mark.parametrize(
    "text",
    [
        "a\ud800b",  # a lone surrogate: pydantic refuses it
        "x" * (MAX_TURN_BYTES + 1),  # over the limit
        "é" * (MAX_TURN_BYTES // 2),  # over in bytes, not in characters
        "x" * (MAX_TURN_BYTES - 300),  # just under (the rest of the JSON included)
    ],
)
def test_encode_turn_fails_as_before(text: str) -> None:
    turn = NewTurn(
        role="assistant", content=(TextBlock(text=text),), timestamp=datetime.now(UTC)
    ).with_index(7)
    assert _outcome(encode_turn, turn) == _outcome(ref_encode_turn, turn)


def test_bytes_stay_base64_in_a_turn() -> None:
    raw = bytes(range(40))
    turn = NewTurn(
        role="user", content=(ImageBlock(format="png", data=raw),), timestamp=datetime.now(UTC)
    ).with_index(0)
    assert base64.b64encode(raw).decode() in encode_turn(turn)
    assert encode_turn(turn) == ref_encode_turn(turn)


@settings(max_examples=150, deadline=None)
@given(_memories())
def test_encode_memory_writes_what_model_dump_json_wrote(record: MemoryRecord) -> None:
    assert _outcome(encode_memory, record) == _outcome(ref_encode_memory, record)


@pytest.mark.parametrize(
    "content", ["a\ud800b", "x" * (MAX_MEMORY_BYTES + 1), "é" * (MAX_MEMORY_BYTES // 2)]
)
def test_encode_memory_fails_as_before(content: str) -> None:
    record = MemoryRecord.model_construct(
        **{
            **MemoryRecord(
                memory_id="m",
                user_id="u",
                memory_type="fact",
                content="x",
                created_at=datetime.now(UTC),
            ).__dict__,
            "content": content,
        }
    )
    expected = _outcome(ref_encode_memory, record)
    assert expected[0] != "ok"
    assert _outcome(encode_memory, record) == expected


@settings(max_examples=500, deadline=None)
@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.sampled_from(["utc", "offset", "naive"]),
    _ZONE,
)
def test_to_epoch_us_is_the_old_one(value: datetime, kind: str, zone: timezone) -> None:
    if kind == "utc":
        value = value.replace(tzinfo=UTC)
    elif kind == "offset":
        value = value.replace(tzinfo=zone)
    assert _outcome(lambda v: to_epoch_us(v, what="t"), value) == _outcome(
        lambda v: ref_to_epoch_us(v, what="t"), value
    )


def test_to_epoch_us_of_instants_around_the_epoch() -> None:
    for value in (
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2026, 11, 24, 7, 0, 0, 1, tzinfo=UTC),
    ):
        assert to_epoch_us(value) == ref_to_epoch_us(value)
    with pytest.raises(ValidationError, match="created_at has no timezone"):
        to_epoch_us(datetime(2026, 1, 1), what="created_at")
