"""The base every persisted tiermem model shares: frozen, versioned, forward-compatible.

* frozen: a model is a value; change it with ``model_copy(update=...)``.
* versioned: ``schema_version`` is written with every record so a later release can migrate.
* forward-compatible: a field this release does not know is ignored on read, never a crash.
* bytes travel as base64 in JSON.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["FrozenModel", "JsonValue", "UtcDatetime", "to_epoch_ms"]

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


def to_epoch_ms(value: datetime) -> int:
    """Milliseconds since the epoch, for sort keys and native TTLs."""
    return int(value.timestamp() * 1000)


class FrozenModel(BaseModel):
    """Base of all tiermem value models."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        ser_json_bytes="base64",
        val_json_bytes="base64",
        populate_by_name=True,
    )
