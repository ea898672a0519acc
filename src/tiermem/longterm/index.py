"""The search index behind recall: BM25 over text, optionally cosine over embeddings.

Recall never loads a user's whole partition per query: documents (memories, archived turns,
knowledge chunks) are indexed when they are written, and a query reads only the index.

Implementations (see ``docs/recall.md`` for why each exists):

* :class:`~tiermem.longterm.index_memory.InProcessIndex` — pure Python BM25 and brute-force
  cosine; the reference, and the index for the in-memory backend.
* :class:`~tiermem.longterm.index_sqlite.SQLiteIndex` — FTS5 over pre-tokenized text (words
  and CJK bigrams) in the embedded SQLite file, vectors in a side table.
* :class:`~tiermem.longterm.index_redis.RedisIndex` — BM25 postings kept in Redis (the hot
  tier of production deployments) under the user's hash tag, scored server-side in Lua.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from tiermem.models import FrozenModel, UtcDatetime

__all__ = ["DocKind", "IndexedDoc", "SearchHit", "SearchIndex"]

DocKind = Literal["memory", "turn", "chunk"]


class IndexedDoc(FrozenModel):
    """One searchable document of a user.

    ``doc_id`` is unique per user: a memory id, ``<session_id>#<turn index>`` for a turn,
    ``<document_id>#<chunk>`` for a knowledge chunk.
    """

    user_id: str
    doc_id: str
    kind: DocKind
    text: str
    created_at: UtcDatetime
    embedding: tuple[float, ...] | None = None
    tags: tuple[str, ...] = Field(default_factory=tuple)


class SearchHit(FrozenModel):
    doc_id: str
    kind: DocKind
    score: float
    """BM25 (higher is better) for :meth:`SearchIndex.search`; cosine in [-1, 1] for
    :meth:`SearchIndex.vector_search`."""


@runtime_checkable
class SearchIndex(Protocol):
    name: str
    supports_vectors: bool

    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        """Add or replace documents (by user and doc_id)."""
        ...

    async def remove(self, user_id: str, doc_ids: Collection[str]) -> None:
        """Remove documents; unknown ids are ignored."""
        ...

    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        """BM25 over the user's documents of the given kinds, best first."""
        ...

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        """Cosine similarity over the user's embedded documents, best first.

        Raises:
            UnsupportedCapabilityError: when ``supports_vectors`` is False.
        """
        ...

    async def purge_user(self, user_id: str) -> None:
        """Remove every document of the user."""
        ...

    async def aclose(self) -> None: ...
