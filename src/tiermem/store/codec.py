"""Argument checks and JSON encoding shared by every backend.

Each check lives here once so that all backends reject the same inputs with the same
messages, before any I/O.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import pairwise

from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticSerializationError

from tiermem.errors import ConflictError, CorruptDataError, ValidationError
from tiermem.models import JsonValue, MemoryRecord, NewTurn, Turn
from tiermem.store.contract import (
    MAX_MEMORY_BYTES,
    MAX_MEMORY_IDS_PER_GET,
    MAX_RECORD_BYTES,
    MAX_SHARED_BYTES,
    MAX_TURN_BYTES,
    MAX_TURNS_PER_APPEND,
    check_size,
)
from tiermem.store.keys import validate_id

logger = logging.getLogger(__name__)

__all__ = [
    "check_append",
    "check_aware",
    "check_idempotency_key",
    "check_index",
    "check_kind",
    "check_limit",
    "check_memory_ids",
    "check_memory_version",
    "check_range",
    "check_restore",
    "decode_memory",
    "decode_turn",
    "decode_turns",
    "encode_data",
    "encode_memory",
    "encode_shared",
    "encode_turn",
    "held_expired",
    "is_live",
    "later_of",
]


def check_append(
    session_id: str,
    turns: Sequence[NewTurn],
    *,
    window: int | None = None,
    first_index: int | None = None,
) -> None:
    """Validate the arguments of an append (both tiers)."""
    validate_id(session_id, what="session_id")
    if not turns:
        raise ValidationError("append_turns needs at least one turn; got none")
    if len(turns) > MAX_TURNS_PER_APPEND:
        raise ValidationError(
            f"append_turns got {len(turns)} turns; at most {MAX_TURNS_PER_APPEND} per call. "
            "Split the batch."
        )
    for turn in turns:
        if not isinstance(turn, NewTurn):
            raise ValidationError(f"append_turns takes NewTurn objects, got {type(turn).__name__}")
    if window is not None and window < 1:
        raise ValidationError(f"window must be at least 1, got {window}")
    if first_index is not None and first_index < 0:
        raise ValidationError(f"first_index must be >= 0, got {first_index}")


def check_index(index: int) -> None:
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValidationError(f"a turn index is an integer >= 0, got {index!r}")


def check_range(start: int, end: int | None) -> None:
    check_index(start)
    if end is not None and (not isinstance(end, int) or isinstance(end, bool)):
        raise ValidationError(f"a turn range's end is an integer or None, got {end!r}")
    if end is not None and end < start:
        raise ValidationError(f"turn range end ({end}) is before start ({start})")


def check_limit(limit: int) -> None:
    if not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit must be an integer >= 1, got {limit!r}")


def check_memory_ids(user_id: str, memory_ids: Collection[str]) -> list[str]:
    """Validate the arguments of ``get_memories``; return the distinct ids, in input order."""
    validate_id(user_id, what="user_id")
    if isinstance(memory_ids, str | bytes):
        raise ValidationError(f"memory_ids is a collection of ids; wrap {memory_ids!r} in a list")
    ids = list(memory_ids)
    if len(ids) > MAX_MEMORY_IDS_PER_GET:
        raise ValidationError(
            f"get_memories got {len(ids)} ids; at most {MAX_MEMORY_IDS_PER_GET} per call. "
            "Split the list."
        )
    for memory_id in ids:
        validate_id(memory_id, what="memory_id")
    return list(dict.fromkeys(ids))


def check_aware(value: datetime | None, *, what: str) -> None:
    """Reject naive datetimes (and what is no datetime) before they reach a comparison
    deep in a backend."""
    if value is not None and not isinstance(value, datetime):
        raise ValidationError(f"{what} must be an aware datetime, got {type(value).__name__}")
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValidationError(f"{what} has no timezone; pass an aware datetime (UTC)")


def check_kind(kind: str, *, what: str = "record kind") -> str:
    """Record kinds and state names follow the same rules as ids."""
    return validate_id(kind, what=what)


_TURN_TO_JSON = Turn.__pydantic_serializer__.to_json
"""What ``Turn.model_dump_json()`` calls, with its defaults (the same bytes): called
directly, it spares the wrapper's keyword arguments, and its UTF-8 bytes give the size
without encoding the text again (a quarter of the cost of encoding a turn). Only for an
exact :class:`Turn`: a subclass (its own fields, field serializers, computed fields) is
written by its own class's serializer, as ``model_dump_json`` writes it."""
_MEMORY_TO_JSON = MemoryRecord.__pydantic_serializer__.to_json
"""``MemoryRecord.model_dump_json()``'s serializer, called directly (as :data:`_TURN_TO_JSON`;
a subclass: its own)."""


def encode_turn(turn: Turn) -> str:
    """The turn's JSON (``turn.model_dump_json()``), within the size limit.

    Raises:
        ValidationError: it cannot be serialized (a lone surrogate, nesting too deep), or
            its JSON is over :data:`~tiermem.store.contract.MAX_TURN_BYTES`.
    """
    try:
        data = (
            _TURN_TO_JSON(turn)
            if type(turn) is Turn
            else type(turn).__pydantic_serializer__.to_json(turn)
        )
    except PydanticSerializationError as exc:
        raise ValidationError(
            f"turn {turn.index} cannot be serialized ({_first_line(exc)}); check it for "
            "lone surrogates or nesting deeper than tiermem.models.shape.MAX_JSON_DEPTH"
        ) from exc
    if len(data) > MAX_TURN_BYTES:
        check_size(data, limit=MAX_TURN_BYTES, what=f"turn {turn.index}")
    return data.decode()


def decode_turn(payload: str | bytes) -> Turn:
    """One stored turn.

    Raises:
        CorruptDataError: the payload is not a turn this version can read.
    """
    try:
        return Turn.model_validate_json(payload)
    except (PydanticValidationError, ValueError, RecursionError) as exc:
        raise CorruptDataError(
            f"a stored turn cannot be decoded ({len(payload)} bytes): {_first_line(exc)}"
        ) from exc


def decode_turns(payloads: Iterable[str | bytes], *, session_id: str) -> list[Turn]:
    """Stored turns, in order, skipping (and logging) any that cannot be decoded: one bad
    turn must not make a whole session unreadable."""
    turns: list[Turn] = []
    for payload in payloads:
        try:
            turns.append(decode_turn(payload))
        except CorruptDataError as exc:
            logger.warning("session %s: skipped an archived turn: %s", session_id, exc)
    return turns


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


_RECORD_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
"""What ``json.dumps`` with these arguments builds on every call (built once: it holds no
state between calls, so threads may share it)."""


def encode_data(data: Mapping[str, JsonValue], *, what: str) -> str:
    """Serialize a JSON object (state blob, session record data) with a size check."""
    if not isinstance(data, Mapping):
        raise ValidationError(f"{what} must be a JSON object (a dict), got {type(data).__name__}")
    try:
        payload = _RECORD_ENCODER.encode(data)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{what} is not JSON-serializable: {exc}") from exc
    check_size(payload, limit=MAX_RECORD_BYTES, what=what)
    return payload


def encode_shared(name: str, data: Mapping[str, JsonValue]) -> str:
    """Serialize a shared blob's data, held to :data:`MAX_SHARED_BYTES`."""
    payload = encode_data(data, what=f"shared blob {name!r}")
    check_size(payload, limit=MAX_SHARED_BYTES, what=f"shared blob {name!r}")
    return payload


def encode_memory(record: MemoryRecord) -> str:
    validate_id(record.user_id, what="user_id")
    validate_id(record.memory_id, what="memory_id")
    validate_id(record.memory_type, what="memory_type")
    data = (
        _MEMORY_TO_JSON(record)
        if type(record) is MemoryRecord
        else type(record).__pydantic_serializer__.to_json(record)
    )
    if len(data) > MAX_MEMORY_BYTES:
        check_size(data, limit=MAX_MEMORY_BYTES, what=f"memory {record.memory_id}")
    return data.decode()


def decode_memory(payload: str | bytes) -> MemoryRecord:
    return MemoryRecord.model_validate_json(payload)


def held_expired(session_id: str, version: int) -> ConflictError:
    """The error of an append with ``keep_expired`` to a session that expired and is still
    held (:meth:`~tiermem.store.contract.HotStore.append_turns`): nothing was written."""
    return ConflictError(
        f"hot session {session_id!r} has expired but is still held (version {version}); "
        "save what it holds (load it with include_expired), then append again",
        expected=None,
        actual=version,
    )


def is_live(expires_at: datetime | None, now: datetime) -> bool:
    """Logical expiry: a record is visible while ``now < expires_at``."""
    return expires_at is None or now < expires_at


def check_memory_version(record: MemoryRecord, expected_version: int | None) -> None:
    """``put_memory`` with a condition must write version ``expected_version + 1``."""
    if expected_version is not None and record.version != expected_version + 1:
        raise ValidationError(
            f"memory {record.memory_id}: writing with expected_version={expected_version} "
            f"needs record.version={expected_version + 1}, got {record.version}. "
            "Copy the record you read with version=read.version + 1."
        )


def check_restore(session_id: str, turns: Sequence[Turn], *, next_index: int, window: int) -> None:
    """Validate the arguments of ``HotStore.restore``: indexed turns, consecutive, below
    ``next_index``."""
    validate_id(session_id, what="session_id")
    if window < 1:
        raise ValidationError(f"window must be at least 1, got {window}")
    if next_index < 0:
        raise ValidationError(f"next_index must be >= 0, got {next_index}")
    for before, after in pairwise(turns):
        if after.index != before.index + 1:
            raise ValidationError(
                f"restore needs consecutive turns; turn {after.index} follows {before.index}"
            )
    if turns and turns[-1].index >= next_index:
        raise ValidationError(
            f"restore got turn {turns[-1].index} but next_index {next_index}; "
            "next_index must be after the last turn"
        )


def check_idempotency_key(key: str | None) -> str | None:
    """Idempotency keys follow the rules of ids (they become part of keys)."""
    return None if key is None else validate_id(key, what="idempotency_key")


def later_of(a: datetime | None, b: datetime | None) -> datetime | None:
    """The later of two lifetimes, where None means forever."""
    if a is None or b is None:
        return None
    return max(a, b)
