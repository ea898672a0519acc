"""The base every persisted tiermem model shares: frozen, versioned, forward-compatible.

* frozen: a model is a value; change it with ``model_copy(update=...)``.
* versioned: ``schema_version`` is written with every record so a later release can migrate.
* forward-compatible: a field this release does not know is ignored on read, never a crash.
* bytes travel as base64 in JSON.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Self, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer
from pydantic import ValidationError as PydanticValidationError

__all__ = [
    "Base64Bytes",
    "FrozenModel",
    "JsonValue",
    "UtcDatetime",
    "problems",
    "to_epoch_ms",
]

JsonValue = Any
"""A JSON-compatible value (dict, list, str, int, float, bool, None)."""


def problems(
    exc: PydanticValidationError, *, within: tuple[str, ...] = (), whole: str = "value"
) -> str:
    """Pydantic's errors as one line for tiermem's own ValidationError: each bad field's
    location (under ``within``; ``whole`` when the value itself is bad) and message, the
    first five."""
    return "; ".join(
        f"{'.'.join(str(part) for part in (*within, *error['loc'])) or whole}: {error['msg']}"
        for error in exc.errors(include_url=False)[:5]
    )


def _require_aware(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            "timestamp has no timezone; pass an aware datetime, e.g. datetime.now(UTC) "
            "or datetime(2026, 1, 1, tzinfo=UTC)"
        )
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_require_aware)]
"""A timezone-aware datetime, normalised to UTC. Naive datetimes are rejected."""


def _decode_base64(value: object) -> object:
    if isinstance(value, str):
        try:
            # Standard alphabet, as Strands and most JSON APIs write it; URL-safe accepted too.
            return base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"bytes must be base64 in JSON: {exc}") from exc
    return value


Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    PlainSerializer(
        lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"
    ),
]
"""Bytes that are standard base64 in JSON and raw bytes in Python."""


def to_epoch_ms(value: datetime) -> int:
    """Milliseconds since the epoch, for sort keys and native TTLs."""
    return int(value.timestamp() * 1000)


class FrozenModel(BaseModel):
    """Base of all tiermem value models."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        populate_by_name=True,
    )

    @classmethod
    def trusted(cls, values: dict[str, Any], fields_set: set[str] | None = None) -> Self:
        """An instance of ``values`` without validation, for data the library built from
        validated models itself (a turn given its index, a snapshot of stored turns): on
        the turn path validation is most of the CPU, and it was done at the edge.

        ``values`` must hold every field, already of its field's type (it becomes the
        instance's ``__dict__``). It sets what pydantic's ``model_construct`` sets, minus
        the per-field default handling that makes that one several times slower.

        ``fields_set`` defaults to ``values``' keys (every field: one set per class), as
        one shared set per distinct set of names (:func:`shared_fields`; a caller passing
        its own may share it too): a frozen model never changes it (pydantic adds to it
        only on assignment, which a frozen model refuses, and ``model_copy`` copies it
        first), and a set per instance is one more object for the garbage collector to
        track for as long as a stored turn lives.
        """
        every = _EVERY_FIELD.get(cls)  # a class attribute lookup costs more than this
        if every is None:
            if cls.__private_attributes__:
                raise TypeError(f"{cls.__name__} has private attributes; use model_construct")
            every = _EVERY_FIELD[cls] = shared_fields(cls.model_fields)
        if not fields_set:
            # ``values`` holds every field: their set, unless it holds other keys too.
            fields_set = every if len(values) == len(every) else shared_fields(values)
        model: Self = _new(cls)
        _set_dict(model, values)
        _set_fields_set(model, fields_set)
        _set_extra(model, None)
        _set_private(model, None)
        return model


def shared_fields(names: Iterable[str]) -> set[str]:
    """The shared set of ``names`` (the same set object for the same names, while it is
    kept): what :meth:`FrozenModel.trusted` gives its instances as their fields set. Never
    change the set it returns."""
    key = frozenset(names)
    shared = _FIELDS_SETS.get(key)
    if shared is None:
        if len(_FIELDS_SETS) >= _FIELDS_SETS_KEPT:
            _FIELDS_SETS.clear()
        shared = _FIELDS_SETS[key] = set(key)
    return shared


def fields_with(fields: set[str], added: frozenset[str]) -> set[str]:
    """``fields | added``, shared (:func:`shared_fields`), looked up by the identity of
    ``fields`` (a shared set itself, usually): a turn given its index, metadata given its
    derived fields."""
    entry = _UNIONS.get((id(fields), added))
    # The entry holds ``fields``, so its id cannot be reused while the entry is kept.
    if entry is None or entry[0] is not fields:
        if len(_UNIONS) >= _UNIONS_KEPT:  # few: an entry pins its ``fields``
            _UNIONS.clear()
        entry = _UNIONS[(id(fields), added)] = (fields, shared_fields(fields | added))
    return entry[1]


_FIELDS_SETS_KEPT = 1_024
"""Distinct fields sets kept for sharing (a few per model class occur)."""
_UNIONS_KEPT = 64
"""Unions :func:`fields_with` keeps (of shared sets, a handful occur)."""
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}
_UNIONS: dict[tuple[int, frozenset[str]], tuple[set[str], set[str]]] = {}

_EVERY_FIELD: dict[type[FrozenModel], set[str]] = {}
"""The shared set of every field name of each model class :meth:`FrozenModel.trusted` has
seen (and found to have no private attributes)."""

M = TypeVar("M", bound=FrozenModel)


def trusted_instance(cls: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """:meth:`FrozenModel.trusted` of a class its caller knows has no private attributes,
    with a shared ``fields_set`` the caller already holds: the four slot writes, without
    the class's field lookup (a turn given its index, on every append)."""
    model: M = _new(cls)
    _set_dict(model, values)
    _set_fields_set(model, fields_set)
    _set_extra(model, None)
    _set_private(model, None)
    return model


_new = object.__new__
# BaseModel's slots, set through their descriptors: what ``object.__setattr__`` does for
# these names, without looking each name up on the class first (a quarter of the cost of
# :meth:`FrozenModel.trusted`, which runs several times per turn). A pydantic without
# these slots fails here, at import, not on a turn.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
