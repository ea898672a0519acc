"""The search index behind recall: BM25 over text, optionally cosine over embeddings.

Recall never loads a user's whole partition per query: documents (memories, archived turns,
knowledge chunks) are indexed when they are written, and a query reads only the index.

Implementations (see ``docs/recall.md`` for why each exists):

* :class:`~tiermem.longterm.index_memory.InProcessIndex` — pure Python BM25 and brute-force
  cosine; the reference, and the index for the in-memory backend.
* :class:`~tiermem.longterm.index_sqlite.SQLiteIndex` — pre-tokenized text (words and CJK
  bigrams) in the embedded SQLite file, searched through a per-user cache, vectors in a side
  table.
* :class:`~tiermem.longterm.index_redis.RedisIndex` — BM25 postings kept in Redis (the hot
  tier of production deployments) under the user's hash tag: each term's postings packed in
  two strings, read by one script per search and scored in the client (``postings``).

**Expiry.** A document may carry ``expires_at`` (archived turns get their turn's retention,
see :func:`~tiermem.longterm.recall.turn_docs`). Every index reads the time from its
injected :class:`~tiermem.clock.Clock` and follows the same rules:

* a document whose ``expires_at`` ≤ now is never returned by ``search`` or
  ``vector_search``; until it is collected it may still count in BM25's corpus statistics
  (document count, document frequency, average length), the same way in every index, so
  scores agree across indexes;
* upserting a document whose ``expires_at`` has already passed removes it (if it was
  indexed) instead of indexing it;
* expired documents are physically removed by :meth:`SearchIndex.collect_expired` (bounded
  work per call, across all users) and, amortised, by ``upsert`` (see each index for how
  much one write collects), so nothing of a user who never comes back stays forever.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from tiermem.longterm.text import doc_terms
from tiermem.models import FrozenModel, UtcDatetime

__all__ = ["DEFAULT_COLLECT_LIMIT", "DocKind", "IndexedDoc", "SearchHit", "SearchIndex"]

DocKind = Literal["memory", "turn", "chunk"]

DEFAULT_COLLECT_LIMIT = 1000
"""Documents one :meth:`SearchIndex.collect_expired` call removes at most, by default."""


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
    expires_at: UtcDatetime | None = None
    """When the document stops being searchable and may be collected; None: never (it
    stays until removed)."""
    terms: dict[str, int] | None = Field(default=None, exclude=True, repr=False)
    """Term frequencies of ``text`` and ``tags`` when the caller computed them already (the
    turn analysis does, from the text it normalised once, off the event loop for a large
    turn); None: the index computes them with :func:`tiermem.longterm.text.doc_terms`."""


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
        """Add or replace documents (by user and doc_id).

        A document whose ``expires_at`` has passed is removed instead. The write also
        collects a bounded number of expired documents (module docstring).
        """
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

    async def collect_expired(self, limit: int = DEFAULT_COLLECT_LIMIT) -> int:
        """Physically remove up to ``limit`` documents whose ``expires_at`` has passed, of
        any user, earliest expiry first; return how many were removed.

        Fewer than ``limit`` means none was left that this call could take (a concurrent
        collector may be holding some, and more expire as time passes), so a sweeper calls
        it until it returns less, and again on its next pass.

        Raises:
            ValidationError: ``limit`` < 1.
        """
        ...

    async def purge_user(self, user_id: str) -> None:
        """Remove every document of the user."""
        ...

    async def aclose(self) -> None: ...


def terms_of(doc: IndexedDoc) -> Mapping[str, int]:
    """A document's term frequencies: the precomputed ones (not copied: read them only), or
    computed now."""
    return doc.terms if doc.terms is not None else doc_terms(doc.text, doc.tags)
