"""What summarization produces and the two engine protocols.

A session's summaries are made from raw turns (never from a summary of a summary): the
engine gets the raw turns of a span plus the prior summary text as context. Structured
memory is the part of a summary a program can check: the latest value of each entity kind,
facts keyed by slot, decisions, goals and unresolved intentions, each with the index of the
turn that said it. Closed-loop validation compares a new summary's text against these slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import Field

from tiermem.models.base import FrozenModel, UtcDatetime
from tiermem.models.turns import Turn

__all__ = [
    "Fact",
    "Item",
    "SessionSummarizer",
    "StructuredExtractor",
    "StructuredMemory",
    "SummaryText",
    "SummaryTier",
]


class SummaryTier(StrEnum):
    RECENT = "recent"
    MIDDLE = "middle"
    ANCIENT = "ancient"


class SummaryText(FrozenModel):
    """One tier's summary of the raw turns ``first_index..through_index`` (inclusive)."""

    tier: SummaryTier
    text: str
    tokens: int = Field(ge=0)
    first_index: int = Field(ge=0)
    through_index: int = Field(ge=-1)
    created_at: UtcDatetime
    engine: str


class Fact(FrozenModel):
    """The latest value of one slot ("budget" → "¥5,000"); ``previous`` holds the values it
    superseded, oldest first, so a stale value is never presented as current."""

    slot: str
    value: str
    turn_index: int = Field(ge=0)
    previous: tuple[str, ...] = ()


class Item(FrozenModel):
    """A decision, goal or unresolved intention, as said, with the turn that said it."""

    text: str
    turn_index: int = Field(ge=0)


class StructuredMemory(FrozenModel):
    """Structured memory of a session through turn ``through_index`` (inclusive)."""

    entities: dict[str, Fact] = Field(default_factory=dict)
    """Latest value of each entity kind (series, volume, order_id, asin, price...)."""
    facts: dict[str, Fact] = Field(default_factory=dict)
    """Latest value of other slots (budget, name, address, preference:<topic>...)."""
    decisions: tuple[Item, ...] = ()
    goals: tuple[Item, ...] = ()
    unresolved: tuple[Item, ...] = ()
    through_index: int = Field(default=-1, ge=-1)


@runtime_checkable
class SessionSummarizer(Protocol):
    """Summarizes raw turns into at most about ``target_tokens`` tokens."""

    name: str

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        """A summary of ``turns`` (oldest first). ``prior`` is the previous summary of the
        turns before them, given as context; ``must_keep`` lists items a previous attempt
        lost, which this one must state (closed-loop validation's retry).

        Raises:
            ModelFailedError: an LLM engine failed after its retries.
        """
        ...


@runtime_checkable
class StructuredExtractor(Protocol):
    """Updates structured memory from raw turns."""

    name: str

    async def extract(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        """``prior`` updated with ``turns`` (oldest first): a new value of a slot replaces
        the old one, which moves to ``previous``; ``through_index`` is the last turn's.

        Raises:
            ModelFailedError: an LLM engine failed after its retries.
        """
        ...
