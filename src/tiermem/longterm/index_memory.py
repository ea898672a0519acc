"""The reference search index, in process: :class:`InProcessIndex` (and its warm-up wrapper
:class:`WarmingIndex` for deployments whose durable store has no search of its own).

Per user it keeps postings (term → doc → ``length · 2^20 + tf``, the encoding of
:mod:`tiermem.longterm.postings`), document lengths and kinds, and the user's embedding
vectors. BM25 reads only the posting lists of the query's terms
(:func:`~tiermem.longterm.postings.bm25_top`, shared with the Redis index's client-side
scoring); vector search is brute-force cosine over the user's vectors (one matrix
product with numpy, pure Python without). Everything is in memory: nothing survives the
process.

Documents with an expiry also sit in one min-heap of all users' expiries, so collecting the
expired ones costs O(log n) each, without scanning anybody's documents (see
:class:`InProcessIndex`).

The other indexes are tested against this one: for the same documents and query they must
return the same hits with the same scores.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tiermem.clock import Clock, SystemClock
from tiermem.errors import ValidationError
from tiermem.longterm.index import (
    DEFAULT_COLLECT_LIMIT,
    DocKind,
    IndexedDoc,
    SearchHit,
    SearchIndex,
    terms_of,
)
from tiermem.longterm.postings import (
    HAS_NUMPY,
    POSTING_SHIFT,
    DenseList,
    bm25_scores,
    bm25_top,
    bm25_top_dense,
    top_scores,
)
from tiermem.longterm.text import query_terms
from tiermem.longterm.vectors import cosine_top, matrix_of, unit_vector
from tiermem.store.keys import MAX_ID_LENGTH, validate_id

_np: Any
try:
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None

__all__ = [
    "COLLECT_PER_WRITE",
    "POSTING_SHIFT",
    "DocLoader",
    "InProcessIndex",
    "WarmingIndex",
    "bm25_scores",
    "bm25_top",
    "check_collect_limit",
    "check_search_args",
    "collect_budget",
    "top_scores",
]

logger = logging.getLogger(__name__)

_KINDS: frozenset[str] = frozenset({"memory", "turn", "chunk"})

COLLECT_PER_WRITE = 2
"""Expired documents an ``upsert`` collects per document it writes (at least
:data:`MIN_COLLECT_PER_WRITE`): more than one, so writes outpace expiry and expired
documents never pile up while anyone writes."""
MIN_COLLECT_PER_WRITE = 32


DENSE_TERMS = 3
"""Queries of at least this many known terms are scored with numpy
(:func:`~tiermem.longterm.postings.bm25_top_dense`); fewer, by
:func:`~tiermem.longterm.postings.bm25_top`, which is faster for one or two terms."""


def collect_budget(written: int) -> int:
    """How many expired documents an upsert of ``written`` documents collects at most (the
    same rule in every index)."""
    return max(MIN_COLLECT_PER_WRITE, COLLECT_PER_WRITE * written)


def check_collect_limit(limit: int) -> None:
    """Raises:
    ValidationError: ``limit`` is not an integer >= 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValidationError(f"collect_expired limit must be an integer >= 1, got {limit!r}")


def check_search_args(user_id: str, kinds: Collection[str], limit: int) -> None:
    """The argument checks every index runs before a search.

    Raises:
        ValidationError: a bad user id, an unknown kind, or ``limit`` < 1.
    """
    validate_id(user_id, what="user_id")
    unknown = set(kinds) - _KINDS
    if unknown:
        raise ValidationError(
            f"unknown document kinds {sorted(unknown)}; use some of {sorted(_KINDS)}"
        )
    if not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit must be an integer >= 1, got {limit!r}")


def check_docs(docs: Sequence[IndexedDoc]) -> None:
    """Validate the ids of documents before any of them is written."""
    checked: str | None = None  # a batch is mostly one user's documents: check each user id once
    for doc in docs:
        if doc.user_id != checked:
            checked = validate_id(doc.user_id, what="user_id")
        doc_id = doc.doc_id
        # ``validate_id``'s own test of a common id, inline: a turn's doc id is new each
        # time (never in its cache of ids seen), and remembering every one would only push
        # the session and user ids out of that cache. Anything else takes the full check.
        if not (
            type(doc_id) is str
            and 0 < len(doc_id) <= MAX_ID_LENGTH
            and doc_id.isascii()
            and doc_id.isprintable()
        ):
            validate_id(doc_id, what="doc_id")


@dataclass(slots=True)
class _Doc:
    kind: DocKind
    length: int
    terms: tuple[str, ...]
    vector: tuple[float, ...] | None
    expires_at: datetime | None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclass(slots=True)
class _Matrix:
    """The user's vectors of some kinds and one dimension, for a numpy product."""

    keys: list[str]
    rows: Any
    valid_until: datetime | None
    """The earliest expiry among its documents: the matrix is rebuilt from then on."""


class _Groups(dict[str, dict[int, set[str]]]):
    """term → ``length * POSTING_SHIFT + tf`` → doc ids: a term's postings by value, so a
    search takes a common term's best documents in without walking its list
    (:func:`bm25_top`).

    A term's entry is built from its postings when a search first asks for it, then kept
    up to date by every write: most indexed terms are never searched, and keeping a set
    per value for each of them was a third of indexing a turn. (The order of its values
    and sets never shows in a result: :func:`bm25_top` ranks with ties by doc id.)
    """

    __slots__ = ("_postings",)

    def __init__(self, postings: dict[str, dict[str, int]]) -> None:
        super().__init__()
        self._postings = postings

    def __missing__(self, term: str) -> dict[int, set[str]]:
        by_value: dict[int, set[str]] = {}
        for doc_id, value in self._postings[term].items():  # KeyError: no such term
            holders = by_value.get(value)
            if holders is None:
                by_value[value] = {doc_id}
            else:
                holders.add(doc_id)
        self[term] = by_value
        return by_value


@dataclass(slots=True)
class _UserIndex:
    docs: dict[str, _Doc] = field(default_factory=dict)
    postings: dict[str, dict[str, int]] = field(default_factory=dict)
    """term → doc id → ``length * POSTING_SHIFT + tf``."""
    groups: _Groups = field(init=False)
    """The postings of searched terms by value (:class:`_Groups`)."""
    total_length: int = 0
    expiring: int = 0
    """How many of ``docs`` have an expiry (for the heap's compaction)."""
    matrix_cache: dict[tuple[int, frozenset[str]], _Matrix] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)
    """doc id → its slot, a small number for numpy scoring (:meth:`dense`)."""
    keys: list[str | None] = field(default_factory=list)
    """slot → doc id (None: a removed document's slot, until :meth:`renumber`)."""
    dense_cache: dict[str, tuple[array[int], array[int]]] = field(default_factory=dict)
    """term → (slots, packed values) of its posting list, built on the term's first dense
    query; :meth:`add` appends to it, :meth:`remove` drops it (rare: rewrites, expiry)."""

    def __post_init__(self) -> None:
        self.groups = _Groups(self.postings)

    def dense(self, term: str) -> DenseList:
        """The term's posting list as numpy arrays (copies: the cache may grow later)."""
        cached = self.dense_cache.get(term)
        posting = self.postings[term]
        if cached is None:
            slots = self.slots
            cached = self.dense_cache[term] = (
                array("I", [slots[doc_id] for doc_id in posting]),
                array("Q", posting.values()),
            )
        numbers, values = cached
        return (
            len(posting),
            _np.frombuffer(numbers, dtype=f"=u{numbers.itemsize}").copy(),
            _np.frombuffer(values, dtype=f"=u{values.itemsize}").copy(),
        )

    def renumber(self) -> None:
        """Give the live documents consecutive slots (after many removals)."""
        live = list(self.docs)
        self.slots = {doc_id: slot for slot, doc_id in enumerate(live)}
        self.keys = list[str | None](live)
        self.dense_cache.clear()

    def remove(self, doc_id: str) -> None:
        doc = self.docs.pop(doc_id, None)
        if doc is None:
            return
        self.keys[self.slots.pop(doc_id)] = None
        dense_cache = self.dense_cache
        if doc.expires_at is not None:
            self.expiring -= 1
        self.total_length -= doc.length
        for term in doc.terms:
            if dense_cache:
                dense_cache.pop(term, None)
            posting = self.postings.get(term)
            if posting is None:
                continue
            value = posting.pop(doc_id, None)
            by_value = self.groups.get(term)  # None: never searched, nothing to update
            if by_value is not None and value is not None and value in by_value:
                by_value[value].discard(doc_id)
                if not by_value[value]:
                    del by_value[value]
            if not posting:
                del self.postings[term]
                self.groups.pop(term, None)
        if doc.vector is not None:
            self.matrix_cache.clear()

    def add(self, doc: IndexedDoc) -> None:
        doc_id = doc.doc_id
        docs = self.docs
        if doc_id in docs:  # a rewrite (most writes are new documents)
            self.remove(doc_id)
        if len(self.keys) > 2 * len(docs) + 1024:
            self.renumber()
        keys = self.keys
        slot = self.slots[doc_id] = len(keys)
        keys.append(doc_id)
        counts = terms_of(doc)
        embedding = doc.embedding
        vector = unit_vector(embedding) if embedding else None
        length = sum(counts.values())
        expires_at = doc.expires_at
        docs[doc_id] = _Doc(doc.kind, length, tuple(counts), vector, expires_at)
        if expires_at is not None:
            self.expiring += 1
        self.total_length += length
        packed = length * POSTING_SHIFT
        postings = self.postings
        # get-then-create: ``setdefault(term, {})`` would build a dict per term even when
        # it exists, and this runs for every term of every indexed turn.
        for term, tf in counts.items():
            posting = postings.get(term)
            if posting is None:
                postings[term] = {doc_id: packed + tf}
            else:
                posting[doc_id] = packed + tf
        # Only searched terms have a dense list or groups (most terms never are): find the
        # document's ones with one set intersection, not a test per term.
        dense_cache = self.dense_cache
        if dense_cache:
            for term in dense_cache.keys() & counts.keys():
                cached = dense_cache[term]
                cached[0].append(slot)
                cached[1].append(packed + counts[term])
        groups = self.groups
        if groups:
            for term in groups.keys() & counts.keys():
                value = packed + counts[term]
                by_value = groups[term]
                holders = by_value.get(value)
                if holders is None:
                    by_value[value] = {doc_id}
                else:
                    holders.add(doc_id)
        if vector is not None:
            self.matrix_cache.clear()


class InProcessIndex:
    """BM25 and brute-force cosine over documents held in this process.

    The reference implementation of :class:`~tiermem.longterm.index.SearchIndex`, and the
    index of the in-memory backend. Costs per query: BM25 reads the posting lists of the
    query's terms (at most :data:`~tiermem.longterm.text.MAX_QUERY_TERMS`); vector search
    multiplies the user's vectors of the asked kinds by the query (cached as a matrix
    between writes when numpy is installed).

    Expiry (``clock``, default the wall clock): expired documents are hidden from queries
    at once, and collected, earliest expiry first, from a heap of every user's expiries:
    each ``upsert`` collects up to :func:`collect_budget` of them, and
    :meth:`collect_expired` more. The heap keeps an entry per write of an expiring document
    (entries of replaced or removed documents are skipped when they come up); it is rebuilt
    when it holds more than twice as many entries as live expiring documents, so its size
    stays proportional to the documents held.

    Raises (every method): :class:`~tiermem.errors.ValidationError` for bad ids, kinds or
    limits. Nothing else: there is no I/O.
    """

    name = "in_process"
    supports_vectors = True

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._users: dict[str, _UserIndex] = {}
        self._expiries: list[tuple[datetime, str, str]] = []
        """(expires_at, user_id, doc_id) of every expiring document written: a min-heap."""
        self._expiring = 0
        """Live documents with an expiry, over all users."""

    def has_user(self, user_id: str) -> bool:
        """Whether any document of the user is held (expired or not)."""
        return user_id in self._users

    def document_count(self, user_id: str) -> int:
        """Documents of the user held in memory, expired ones not yet collected included."""
        user = self._users.get(user_id)
        return 0 if user is None else len(user.docs)

    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        check_docs(docs)
        self.add_checked(docs)

    def add_checked(self, docs: Sequence[IndexedDoc]) -> None:
        """``upsert`` of documents :func:`check_docs` passed already (the caller's own
        ``upsert`` checked them: :class:`WarmingIndex`), so they are not checked again."""
        now = self._clock.now()
        users, expiries, push = self._users, self._expiries, heapq.heappush
        for doc in docs:
            user_id = doc.user_id
            user = users.get(user_id)
            expires_at = doc.expires_at
            if expires_at is not None and expires_at <= now:
                if user is not None:
                    self._remove(user_id, user, [doc.doc_id])
                continue
            if user is None:
                user = users[user_id] = _UserIndex()
            before = user.expiring
            user.add(doc)
            self._expiring += user.expiring - before
            if expires_at is not None:
                push(expiries, (expires_at, user_id, doc.doc_id))
        if expiries and expiries[0][0] <= now:  # something to collect (``_collect``'s test)
            self._collect(now, collect_budget(len(docs)))
        if len(expiries) > 2 * self._expiring + 1024:
            self._compact()

    async def remove(self, user_id: str, doc_ids: Collection[str]) -> None:
        validate_id(user_id, what="user_id")
        user = self._users.get(user_id)
        if user is not None:
            self._remove(user_id, user, doc_ids)

    async def collect_expired(self, limit: int = DEFAULT_COLLECT_LIMIT) -> int:
        check_collect_limit(limit)
        return self._collect(self._clock.now(), limit)

    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        user = self._users.get(user_id)
        terms = query_terms(query)
        if user is None or not terms or not kinds:
            return []
        now = self._clock.now()
        count = len(user.docs)
        postings, groups = user.postings, user.groups
        found = [term for term in terms if term in postings]
        wanted = set(kinds)
        docs = user.docs

        def keep(doc_id: str) -> bool:
            doc = docs[doc_id]
            return doc.kind in wanted and not doc.expired(now)

        average = user.total_length / count
        if HAS_NUMPY and len(found) >= DENSE_TERMS:
            dense = [user.dense(term) for term in found]
            top = bm25_top_dense(dense, count, average, limit, keep, user.keys)
        else:
            lists = [(len(postings[term]), postings[term]) for term in found]
            top = bm25_top(lists, count, average, limit, keep, [groups[t] for t in found])
        return [
            SearchHit(doc_id=doc_id, kind=docs[doc_id].kind, score=score) for doc_id, score in top
        ]

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        user = self._users.get(user_id)
        if user is None or not kinds or not vector:
            return []
        now = self._clock.now()
        cache_key = (len(vector), frozenset(kinds))
        cached = user.matrix_cache.get(cache_key)
        if cached is None or (cached.valid_until is not None and cached.valid_until <= now):
            # Documents embedded with another model (another dimension) are left out.
            chosen = [
                (doc_id, doc)
                for doc_id, doc in user.docs.items()
                if doc.vector is not None
                and len(doc.vector) == len(vector)
                and doc.kind in cache_key[1]
                and not doc.expired(now)
            ]
            expiries = [doc.expires_at for _, doc in chosen if doc.expires_at is not None]
            cached = _Matrix(
                keys=[doc_id for doc_id, _ in chosen],
                rows=matrix_of([doc.vector for _, doc in chosen if doc.vector is not None]),
                valid_until=min(expiries, default=None),
            )
            user.matrix_cache[cache_key] = cached
        if not cached.keys:
            return []
        top = cosine_top(vector, cached.keys, cached.rows, limit)
        return [
            SearchHit(doc_id=doc_id, kind=user.docs[doc_id].kind, score=score)
            for doc_id, score in top
        ]

    async def purge_user(self, user_id: str) -> None:
        validate_id(user_id, what="user_id")
        user = self._users.pop(user_id, None)
        if user is not None:
            # Its heap entries are skipped when they come up, or dropped by a compaction.
            self._expiring -= user.expiring

    async def aclose(self) -> None:
        self._users.clear()
        self._expiries.clear()
        self._expiring = 0

    def _remove(self, user_id: str, user: _UserIndex, doc_ids: Collection[str]) -> None:
        before = user.expiring
        for doc_id in doc_ids:
            user.remove(doc_id)
        self._expiring -= before - user.expiring
        if not user.docs:
            del self._users[user_id]

    def _collect(self, now: datetime, limit: int) -> int:
        """Remove up to ``limit`` expired documents, earliest expiry first."""
        removed = 0
        heap = self._expiries
        while heap and removed < limit and heap[0][0] <= now:
            expires_at, user_id, doc_id = heapq.heappop(heap)
            user = self._users.get(user_id)
            doc = None if user is None else user.docs.get(doc_id)
            # An entry of a document replaced (with another expiry) or removed since.
            if user is None or doc is None or doc.expires_at != expires_at:
                continue
            self._remove(user_id, user, [doc_id])
            removed += 1
        if removed:
            logger.debug("collected %d expired index documents", removed)
        return removed

    def _compact(self) -> None:
        """Rebuild the heap from the live expiring documents, dropping stale entries."""
        self._expiries = [
            (doc.expires_at, user_id, doc_id)
            for user_id, user in self._users.items()
            for doc_id, doc in user.docs.items()
            if doc.expires_at is not None
        ]
        heapq.heapify(self._expiries)


DocLoader = Callable[[str], Awaitable[Sequence[IndexedDoc]]]
"""Loads the live documents of one kind of one user from durable storage, for
:class:`WarmingIndex`: a bounded read, never the user's whole history (see
:func:`tiermem.longterm.recall.memory_loader` and
:func:`~tiermem.longterm.recall.turn_loader` for their caps)."""

_Write = tuple[str, Sequence[IndexedDoc] | Collection[str]]


class WarmingIndex:
    """An :class:`InProcessIndex` filled per user on the user's first query in this process.

    For deployments whose durable store has no search of its own and no Redis (DynamoDB
    alone). The first ``search`` or ``vector_search`` for a user runs the ``loaders`` —
    bounded reads of the user's live memories and recent sessions' live turns with
    :func:`~tiermem.longterm.recall.memory_loader` and
    :func:`~tiermem.longterm.recall.turn_loader`, each with a documented cap — and keeps
    the documents; later queries read only memory, never the store. Concurrent first
    queries of a user load once. Expired documents are hidden and collected as in
    :class:`InProcessIndex` (``clock``).

    Writes of a warm user go to the in-process index at once; writes arriving while the user
    is being loaded are applied after the load, in order, so the load cannot overwrite
    them with older data. Writes of a cold user are dropped: the loaders read them from the
    durable store at warm-up, so **index a document after its durable write**, and give a
    loader for every kind you want searchable. Beyond ``max_users`` warm users, the least
    recently queried is evicted (and loaded again on its next query): memory stays bounded,
    and writes made by other processes are picked up at that point.

    Raises: what the loaders raise (mapped backend errors), and the argument errors of
    :class:`InProcessIndex`.
    """

    name = "warming_in_process"
    supports_vectors = True

    def __init__(
        self,
        loaders: Sequence[DocLoader],
        *,
        max_users: int = 1000,
        clock: Clock | None = None,
    ) -> None:
        if max_users < 1:
            raise ValidationError(f"max_users must be at least 1, got {max_users}")
        self._inner = InProcessIndex(clock=clock)
        self._loaders = tuple(loaders)
        self._max_users = max_users
        self._warm: OrderedDict[str, None] = OrderedDict()
        self._loading: dict[str, tuple[asyncio.Future[None], list[_Write]]] = {}
        self.loads = 0
        """How many warm-ups ran, for tests and metrics."""

    def add_loader(self, loader: DocLoader) -> None:
        """Load one more kind of document at warm-up (users already warm are not reloaded)."""
        self._loaders = (*self._loaders, loader)

    def is_warm(self, user_id: str) -> bool:
        return user_id in self._warm

    @property
    def max_users(self) -> int:
        return self._max_users

    async def warm(self, user_id: str) -> None:
        """Load the user now unless it is warm; wait for a load already running."""
        validate_id(user_id, what="user_id")
        if user_id in self._warm:
            self._warm.move_to_end(user_id)
            return
        running = self._loading.get(user_id)
        if running is not None:
            await asyncio.shield(running[0])
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending: list[_Write] = []
        self._loading[user_id] = (done, pending)
        try:
            loaded = [doc for loader in self._loaders for doc in await loader(user_id)]
            await self._inner.purge_user(user_id)
            await self._inner.upsert(loaded)
            for op, arg in pending:  # writes that raced the load, in arrival order
                if op == "upsert":
                    await self._inner.upsert(arg)  # type: ignore[arg-type]
                else:
                    await self._inner.remove(user_id, arg)  # type: ignore[arg-type]
        except BaseException as exc:
            del self._loading[user_id]
            done.set_exception(exc)
            done.exception()  # retrieved: waiters re-raise it; nobody else needs to
            raise
        del self._loading[user_id]
        done.set_result(None)
        self.loads += 1
        self._warm[user_id] = None
        logger.debug("warmed the in-process index for a user: %d documents", len(loaded))
        while len(self._warm) > self._max_users:
            evicted, _ = self._warm.popitem(last=False)
            await self._inner.purge_user(evicted)

    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        check_docs(docs)
        self.upsert_checked(docs)

    def upsert_checked(self, docs: Sequence[IndexedDoc]) -> None:
        """``upsert`` of documents :func:`check_docs` passed already: for an index that
        keeps this one as its in-process copy and checked them in its own ``upsert``
        (:class:`~tiermem.longterm.index_sqlite.SQLiteIndex`), so a batch is checked once."""
        by_user: dict[str, list[IndexedDoc]] = {}
        for doc in docs:
            by_user.setdefault(doc.user_id, []).append(doc)
        warm = self._warm
        for user_id, user_docs in by_user.items():
            if user_id in warm:
                self._inner.add_checked(user_docs)
            elif user_id in self._loading:
                self._loading[user_id][1].append(("upsert", user_docs))

    async def remove(self, user_id: str, doc_ids: Collection[str]) -> None:
        validate_id(user_id, what="user_id")
        if user_id in self._warm:
            await self._inner.remove(user_id, doc_ids)
        elif user_id in self._loading:
            self._loading[user_id][1].append(("remove", list(doc_ids)))

    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        await self.warm(user_id)
        return await self._inner.search(user_id, query, kinds=kinds, limit=limit)

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        await self.warm(user_id)
        return await self._inner.vector_search(user_id, vector, kinds=kinds, limit=limit)

    async def collect_expired(self, limit: int = DEFAULT_COLLECT_LIMIT) -> int:
        return await self._inner.collect_expired(limit)

    async def purge_user(self, user_id: str) -> None:
        validate_id(user_id, what="user_id")
        self._warm.pop(user_id, None)
        await self._inner.purge_user(user_id)

    async def aclose(self) -> None:
        self._warm.clear()
        await self._inner.aclose()


def _check_protocol() -> tuple[SearchIndex, SearchIndex]:  # pragma: no cover - typing only
    return InProcessIndex(), WarmingIndex(())
