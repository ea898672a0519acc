"""Long-term user memory records."""

from __future__ import annotations

from pydantic import Field

from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime

__all__ = ["MemoryRecord", "Provenance"]


class Provenance(FrozenModel):
    """Where a derived item came from: turns of a session, or other memories."""

    source: str = "explicit"
    """How it was made: ``explicit``, ``auto``, ``handoff``, ``rollup``, ``import``..."""
    session_id: str | None = None
    turn_indexes: tuple[int, ...] = ()
    memory_ids: tuple[str, ...] = ()


class MemoryRecord(FrozenModel):
    """One long-term memory of a user.

    ``valid_from`` / ``invalid_from`` implement supersession: a record whose
    ``invalid_from`` has passed stays in history but is hidden from recall.
    ``expires_at`` is the retention deadline; reads filter on it with the injected clock.
    """

    schema_version: int = 1
    memory_id: str
    user_id: str
    memory_type: str
    content: str
    tags: tuple[str, ...] = ()
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    created_at: UtcDatetime
    accessed_at: UtcDatetime | None = None
    access_count: int = Field(default=0, ge=0)
    expires_at: UtcDatetime | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    valid_from: UtcDatetime | None = None
    invalid_from: UtcDatetime | None = None
    version: int = Field(default=1, ge=1)
    embedding: tuple[float, ...] | None = None
    """The content's embedding vector, when an embedder is configured."""
    embedding_model: str | None = None
