"""Strands messages to tiermem :class:`~tiermem.models.Message` values and back.

Strands messages are Bedrock Converse messages plus a ``tracking_id`` and ``metadata``
(usage, metrics, custom flags such as ``pinned``): the content goes through
:mod:`tiermem.models.convert`'s Converse converters, the rest travels as "extras" (stored in
a turn's ``metadata["strands"]``). A message with no content, which tiermem cannot store as
a turn, is stored as a placeholder text and marked ``empty``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from strands.types.content import Message as StrandsMessage

from tiermem.models import JsonValue, Message
from tiermem.models.convert import from_converse, to_converse

EMPTY_PLACEHOLDER = "[empty message]"
SYNTHETIC = "tiermem_synthetic"
"""The ``metadata.custom`` flag on messages a manager made (summaries, notes)."""


def json_safe(value: Any) -> JsonValue:
    # Strands metadata is JSON in practice; anything else is stored as its string.
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def extras_of(raw: StrandsMessage) -> dict[str, JsonValue]:
    """What a Strands message carries beyond role and content."""
    extras: dict[str, JsonValue] = {}
    if raw.get("tracking_id"):
        extras["tracking_id"] = str(raw["tracking_id"])
    if raw.get("metadata"):
        extras["metadata"] = json_safe(raw["metadata"])
    if not raw.get("content"):
        extras["empty"] = True
    return extras


def to_tiermem(raw: StrandsMessage) -> Message:
    if not raw.get("content"):
        return Message.text(raw["role"], EMPTY_PLACEHOLDER)
    return from_converse([cast(dict[str, Any], raw)])[0]


def to_strands(message: Message, extras: Mapping[str, Any]) -> StrandsMessage:
    raw = cast(StrandsMessage, to_converse([message])[0])
    if extras.get("empty"):
        raw["content"] = []
    if extras.get("tracking_id"):
        raw["tracking_id"] = extras["tracking_id"]
    if extras.get("metadata"):
        raw["metadata"] = json.loads(json.dumps(extras["metadata"]))
    return raw


def _custom(raw: StrandsMessage) -> Mapping[str, Any]:
    metadata: Mapping[str, Any] = raw.get("metadata") or {}
    custom = metadata.get("custom")
    return custom if isinstance(custom, Mapping) else {}


def is_pinned(raw: StrandsMessage) -> bool:
    return _custom(raw).get("pinned") is True


def is_synthetic(raw: StrandsMessage) -> bool:
    return SYNTHETIC in _custom(raw)
