"""What recall returns."""

from __future__ import annotations

from pydantic import Field

from tiermem.longterm.index import DocKind
from tiermem.models import FrozenModel, MemoryRecord, Provenance, Turn, UtcDatetime

__all__ = ["RecallHit"]


class RecallHit(FrozenModel):
    """One recalled item with its score, the parts of the score, and where it came from."""

    kind: DocKind
    doc_id: str
    text: str
    score: float
    components: dict[str, float] = Field(default_factory=dict)
    """The weighted parts of ``score``: bm25, embedding, recency, importance, access."""
    memory: MemoryRecord | None = None
    """The memory record, for ``kind == "memory"``."""
    turn: Turn | None = None
    """The archived turn, for ``kind == "turn"``."""
    session_id: str | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    created_at: UtcDatetime | None = None
    """When a resolved item (a knowledge chunk, a summary line) was made, if its resolver
    knows; memories and turns carry their own time."""
    neighbour_of: str | None = None
    """For a turn added as context around a hit: the hit's ``doc_id`` (placed only if the
    budget has room after every hit)."""
