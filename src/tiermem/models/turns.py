"""Turns: the append-only event log of a session.

A :class:`NewTurn` is what a caller adds; the store gives it its session-scoped ``index``
and returns a :class:`Turn`. Indexes start at 0 and are gap-free. A redacted turn keeps
its slot (its index) with its content replaced.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field

from tiermem.models.base import (
    FrozenModel,
    JsonValue,
    UtcDatetime,
    fields_with,
    trusted_instance,
)
from tiermem.models.content import ContentBlock, Message, Role, TextBlock, text_of

__all__ = ["REDACTED_TEXT", "Entity", "NewTurn", "Turn"]

REDACTED_TEXT = "[redacted]"
TURN_SCHEMA_VERSION = 1
_INDEX = frozenset({"index"})


class Entity(FrozenModel):
    """A named thing mentioned in a turn, e.g. ``Entity(kind="series", value="Berserk")``."""

    kind: str
    value: str


class NewTurn(FrozenModel):
    """A turn before the store has given it an index."""

    schema_version: int = TURN_SCHEMA_VERSION
    role: Role
    content: tuple[ContentBlock, ...]
    timestamp: UtcDatetime
    token_count: int = Field(default=0, ge=0)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    pinned: bool = False
    agent_name: str | None = None
    intent: str | None = None
    latency_ms: float | None = Field(default=None, ge=0.0)
    entities: tuple[Entity, ...] = ()
    redacted: bool = False
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        """The plain text of the turn's content."""
        return text_of(self.content)

    def to_message(self) -> Message:
        return Message(role=self.role, content=self.content)

    def with_index(self, index: int) -> Turn:
        """This turn as the archive's turn ``index`` (a validated turn is copied as it is,
        without validating it again)."""
        if type(index) is not int or index < 0:
            fields = self.model_dump(exclude={"schema_version", "index"}, round_trip=True)
            return Turn(index=index, **fields)  # validated: raises the usual error
        # A copy, then two keys set: the keys and order of ``{**d, "schema_version": ...,
        # "index": ...}``, at half its cost (every appended turn comes through here).
        values = self.__dict__.copy()
        values["schema_version"] = TURN_SCHEMA_VERSION
        values["index"] = index
        return trusted_instance(Turn, values, _indexed_fields(self.__pydantic_fields_set__))


_INDEXED: dict[int, tuple[set[str], set[str]]] = {}
"""id of a turn's fields set → (that set, the set with ``index``): :func:`fields_with` by
the set's identity alone, without building and hashing its key (once per appended turn).
The entry holds the set, so its id cannot be reused while the entry is kept."""
_INDEXED_KEPT = 64
"""Entries of :data:`_INDEXED` kept (a handful of fields sets occur: they are shared)."""


def _indexed_fields(fields: set[str]) -> set[str]:
    entry = _INDEXED.get(id(fields))
    if entry is None or entry[0] is not fields:
        if len(_INDEXED) >= _INDEXED_KEPT:
            _INDEXED.clear()
        entry = _INDEXED[id(fields)] = (fields, fields_with(fields, _INDEX))
    return entry[1]


class Turn(NewTurn):
    """A turn in the archive, addressable by its session-scoped ``index``."""

    index: int = Field(ge=0)

    def redact(self) -> Self:
        """This turn with its content replaced; the slot and its timestamp stay. What was
        derived from its words goes with them: entities, metadata and the intent (a label
        such as "report_fraud" says what the turn was about)."""
        return self.model_copy(
            update={
                "content": (TextBlock(text=REDACTED_TEXT),),
                "redacted": True,
                "entities": (),
                "metadata": {},
                "intent": None,
            }
        )
