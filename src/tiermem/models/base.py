"""The base every persisted tiermem model shares: frozen, versioned, forward-compatible.

* frozen: a model is a value; change it with ``model_copy(update=...)``.
* versioned: ``schema_version`` is written with every record so a later release can migrate.
* forward-compatible: a field this release does not know is ignored on read, never a crash.
* bytes travel as base64 in JSON.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer

__all__ = ["Base64Bytes", "FrozenModel", "JsonValue", "UtcDatetime", "to_epoch_ms"]

JsonValue = Any
"""A JSON-compatible value (dict, list, str, int, float, bool, None)."""


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
        """
        if cls not in _PLAIN_MODELS:  # a class attribute lookup costs more than this set's
            if cls.__private_attributes__:
                raise TypeError(f"{cls.__name__} has private attributes; use model_construct")
            _PLAIN_MODELS.add(cls)
        model: Self = _new(cls)
        _set(model, "__dict__", values)
        _set(model, "__pydantic_fields_set__", fields_set or set(values))
        _set(model, "__pydantic_extra__", None)
        _set(model, "__pydantic_private__", None)
        return model


_PLAIN_MODELS: set[type[FrozenModel]] = set()
"""Model classes :meth:`FrozenModel.trusted` has seen to have no private attributes."""

_new = object.__new__
_set = object.__setattr__
