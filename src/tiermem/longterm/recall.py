"""Recall: the memories, archived turns and knowledge chunks that answer a query.

:class:`Recaller` gathers candidates from the search index, fetches their records, filters
them, and ranks them with the pure policy :mod:`tiermem.policies.recall`:

1. Candidates, N = ``policy.candidate_count(k)`` per source (50 for k ≤ 10):
   BM25 top N from the index; with an embedder, the query's embedding and either the
   index's vector top N (``index.supports_vectors``) or, for an index without vectors,
   the user's N most recent memories, reranked by the embeddings stored on the records.
   An empty query (no terms) takes the N most recent memories and ranks them by recency,
   importance and use.
2. Fetch: memories with one ``get_memories`` (one per :data:`MAX_MEMORY_IDS_PER_GET`
   candidates), turns with ``get_turn`` (at most ``fetch_concurrency`` at once) -- or, for
   per-turn recall (``turns_read``), one ``get_turns`` per run of nearby candidates of a
   session, which also reads the neighbours the context adds -- all concurrently; other
   kinds through a registered resolver, and session summary lines (``summaries=True``,
   kind ``chunk`` with :func:`summary_doc_id` ids) through the summary resolver, which
   returns only lines the session's records still hold. Never the whole partition.
3. Filter: the asked ``types``, ``min_importance`` and time range; expired records,
   superseded ones (``invalid_from`` ≤ now), not yet valid ones (``valid_from`` > now) and
   internal types (``_...``) are never returned.
4. Score and keep the top ``k`` (see :mod:`tiermem.policies.recall`); count the returned
   memories' accesses in the :class:`~tiermem.longterm.access.AccessTracker` (in memory;
   written later, off the request path). Recall itself writes nothing to the durable store.

Documents whose record has gone (deleted, expired) are removed from the index in the
background when recall meets them. The index must therefore be written **after** the
durable store: index a memory once ``put_memory`` has returned.

This module also builds the index documents (:func:`memory_doc`, :func:`turn_docs`), so
that whoever writes memories and turns indexes them the same way, and the loaders of
:class:`~tiermem.longterm.index_memory.WarmingIndex`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, get_args

from tiermem.clock import Clock, SystemClock
from tiermem.errors import BackendError, NotFoundError, ValidationError
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.access import AccessTracker
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind, IndexedDoc, SearchHit, SearchIndex
from tiermem.longterm.index_memory import DocLoader
from tiermem.longterm.recall_dates import turn_date_tags
from tiermem.longterm.records import is_hidden
from tiermem.longterm.text import count_terms, query_terms
from tiermem.longterm.types import MemoryTypeRegistry, is_internal_type
from tiermem.longterm.vectors import cosines
from tiermem.models import REDACTED_TEXT, MemoryRecord, Provenance, TextBlock, Turn
from tiermem.policies.recall import RecallPolicy, RecallSignals, rank_candidates
from tiermem.store.codec import check_aware
from tiermem.store.contract import MAX_MEMORY_IDS_PER_GET, DurableStore
from tiermem.store.keys import validate_id

__all__ = [
    "SUMMARY_DOC_KIND",
    "SUMMARY_SOURCES",
    "WARM_MEMORY_CAP",
    "WARM_MEMORY_PAGE",
    "WARM_SESSIONS",
    "WARM_TURNS_PER_SESSION",
    "RecallCounters",
    "Recaller",
    "ResolvedDoc",
    "Resolver",
    "memory_doc",
    "memory_loader",
    "parse_summary_doc_id",
    "parse_turn_doc_id",
    "summary_doc_id",
    "turn_doc_id",
    "turn_docs",
    "turn_loader",
]

logger = logging.getLogger(__name__)

_KINDS: tuple[str, ...] = get_args(DocKind)
MAX_K = 100
_MEMORY_ONLY: tuple[DocKind, ...] = ("memory",)


# -- index documents ------------------------------------------------------------------------


def memory_doc(record: MemoryRecord) -> IndexedDoc:
    """The index document of a memory: its content and tags, its embedding if any.

    A keyed preference (``metadata["preference_key"]``, as detection writes it) is also
    found by its key's words: "prefers seinen" under ``favorite_genre`` answers a query for
    "genre" or "favorite genre", which its content alone never would. The key is indexed
    as a tag (tags are searched, not shown), so the hit's text is the content as stored.

    Index it after the durable write (see the module docstring).
    """
    tags = record.tags
    key = record.metadata.get("preference_key")
    if isinstance(key, str) and key and key not in tags:
        tags = (*tags, key)  # the tokenizer splits "favorite_genre" into its two words
    return IndexedDoc(
        user_id=record.user_id,
        doc_id=record.memory_id,
        kind="memory",
        text=record.content,
        created_at=record.created_at,
        embedding=record.embedding,
        tags=tags,
        expires_at=record.expires_at,
    )


def turn_doc_id(session_id: str, index: int) -> str:
    """``<session_id>#<index>``: the doc id of an archived turn."""
    return f"{session_id}#{index}"


def parse_turn_doc_id(doc_id: str) -> tuple[str, int]:
    """Invert :func:`turn_doc_id` (a session id may itself contain ``#``).

    Raises:
        ValidationError: ``doc_id`` is not ``<session_id>#<index>``.
    """
    session_id, sep, index = doc_id.rpartition("#")
    if not sep or not session_id or not index.isdigit():
        raise ValidationError(f"turn doc id {doc_id!r} is not '<session_id>#<turn index>'")
    return session_id, int(index)


def _plain_terms(terms: Mapping[str, int]) -> bool:
    """Whether term counts are already what :attr:`IndexedDoc.terms` holds (str → int),
    so the document needs no validation. (The types are collected in C: a generator
    testing each pair costs more than the rest of a short turn's document.)"""
    return {*map(type, terms)} <= _STR_TYPE and {*map(type, terms.values())} <= _INT_TYPE


_STR_TYPE = frozenset({str})
_INT_TYPE = frozenset({int})


def turn_docs(
    user_id: str,
    session_id: str,
    turns: Sequence[Turn],
    *,
    embeddings: Sequence[Sequence[float] | None] | None = None,
    expires_at: datetime | None = None,
    terms: Sequence[Mapping[str, int] | None] | None = None,
    owned_terms: bool = False,
) -> list[IndexedDoc]:
    """Index documents of archived turns (episodic recall); redacted and empty turns are
    left out. ``embeddings``, when given, are the turns' vectors in the same order;
    ``terms`` their term frequencies, when the turn analysis computed them already.
    ``owned_terms``: each of ``terms`` is a fresh ``dict`` of ``str`` → ``int`` that the
    caller gives away, counted from the turn's own text
    (:func:`~tiermem.longterm.text.text_term_counts`): the documents take it as it is, the
    date terms added, instead of a checked copy, and a turn none of whose terms is a date
    word is not searched for date mentions (``recall_dates.turn_date_tags``).

    ``expires_at`` is the turns' retention, the ``expires_at`` their durable append was
    given (the session tier's ``durable_ttl`` after the write; None: kept forever): the
    index stops returning the documents then and collects them (see
    :mod:`tiermem.longterm.index`).

    Each document is tagged with date terms (``recall_dates.turn_date_terms``):
    the turn's own day, week and month and the dates it mentions, relative ones resolved
    against the turn's timestamp, so "what did I buy on March 9?" finds "I bought it
    yesterday" said on 10 March.

    Index them after the durable append; remove a turn's document when it is redacted.

    The documents are built without validation (this is on every turn's path, and the
    turns are validated models); a document with anything the caller passed in another shape
    than the index's (a vector, term counts, non-``str`` ids) takes the validating
    constructor, which raises as usual.

    Raises:
        ValidationError: ``embeddings`` does not have one entry per turn, or
            ``expires_at`` is naive.
    """
    if embeddings is not None and len(embeddings) != len(turns):
        raise ValidationError("turn_docs needs one embedding (or None) per turn")
    if terms is not None and len(terms) != len(turns):
        raise ValidationError("turn_docs needs one term count (or None) per turn")
    plain_ids = type(user_id) is str and type(session_id) is str
    # The session's retention is in UTC already: taken as it is (what ``astimezone``
    # returns for a datetime in its own zone), without the checks.
    if expires_at is None or (type(expires_at) is datetime and expires_at.tzinfo is UTC):
        expires_utc = expires_at
    else:
        check_aware(expires_at, what="expires_at")
        expires_utc = expires_at.astimezone(UTC)
    docs = []
    trusted_doc = IndexedDoc.trusted
    for i, turn in enumerate(turns):
        content = turn.content
        # ``turn.text`` joins the blocks' texts; a turn of one text block is that text.
        text = content[0].text if len(content) == 1 and type(content[0]) is TextBlock else turn.text
        # ``not text or text.isspace()`` is ``not text.strip()`` without the copy.
        if turn.redacted or not text or text.isspace() or text == REDACTED_TEXT:
            continue
        vector = embeddings[i] if embeddings is not None else None
        given = terms[i] if terms is not None else None
        # Dated: the turn's day, week and month, and the dates it mentions resolved
        # against its own timestamp ("yesterday" said on 10 March is 9 March), as tags.
        # Fresh counts given away are the text's own terms (``owned_terms``): a text that
        # names no date word skips the search for date mentions.
        dates = turn_date_tags(
            text, turn.timestamp, given if owned_terms and type(given) is dict else None
        )
        counted: dict[str, int] | None = None
        checked = True  # the counts are str -> int (fresh counts given away are)
        if given is not None:
            if owned_terms and type(given) is dict:
                counted = given
            else:
                counted = dict(given)
                checked = _plain_terms(counted)
            count_terms(counted, dates)  # counted[term] = counted.get(term, 0) + 1
        values: dict[str, object] = {
            "user_id": user_id,
            "doc_id": f"{session_id}#{turn.index}",  # turn_doc_id, inlined
            "kind": "turn",
            "text": text,
            "created_at": turn.timestamp,
            "embedding": None if vector is None else tuple(vector),
            "tags": dates,
            "expires_at": expires_utc,
            "terms": counted,
        }
        trusted = plain_ids and vector is None and checked
        docs.append(trusted_doc(values) if trusted else IndexedDoc(**values))
    return docs


SUMMARY_DOC_KIND: DocKind = "chunk"
"""The index kind of a session summary's line or structured-memory item (earlier sessions'
summaries as recall sources, :mod:`tiermem.summaries.recall_docs`). The search index knows
three kinds; summary documents share ``chunk`` with knowledge chunks and are told apart by
their doc id (:func:`summary_doc_id`), so every index backend holds them unchanged."""
SUMMARY_SOURCES = frozenset({"summary", "structured"})
"""``Provenance.source`` of a recalled summary line / structured-memory item."""
_SUMMARY_MARK = "#summary-"


def summary_doc_id(session_id: str, key: str) -> str:
    """``<session_id>#summary-<key>``: the doc id of one summary line or structured item of
    a session (``key``: what the line is, see :mod:`tiermem.summaries.recall_docs`). Never a
    turn's (``#<digits>``) or a knowledge chunk's id."""
    return f"{session_id}{_SUMMARY_MARK}{key}"


def parse_summary_doc_id(doc_id: str) -> tuple[str, str] | None:
    """``(session_id, key)`` of a summary doc id, or None for any other id."""
    session_id, sep, key = doc_id.rpartition(_SUMMARY_MARK)
    if not sep or not session_id or not key or "#" in key:
        return None
    return session_id, key


WARM_MEMORY_CAP = 10_000
"""Most memories :func:`memory_loader` reads for one user (the newest)."""
WARM_MEMORY_PAGE = 500
"""Memories per ``query_memories`` call of :func:`memory_loader`."""
WARM_SESSIONS = 20
"""Sessions :func:`turn_loader` reads for one user (the newest)."""
WARM_TURNS_PER_SESSION = 200
"""Turns :func:`turn_loader` reads per session (the last ones)."""


def memory_loader(
    durable: DurableStore,
    *,
    types: MemoryTypeRegistry | None = None,
    clock: Clock | None = None,
    max_memories: int = WARM_MEMORY_CAP,
    page: int = WARM_MEMORY_PAGE,
) -> DocLoader:
    """A :class:`~tiermem.longterm.index_memory.WarmingIndex` loader of the user's memories.

    Reads only what recall can return: live records (``query_memories`` leaves expired ones
    out) of the registered ``types`` — pass the registry of the
    :class:`~tiermem.longterm.memory.LongTermMemory` (its names are read at each warm-up,
    so types registered later are included); without one, the default types. So the change
    log (a year of entries) and knowledge chunks (their own loader) are never read.
    Superseded records are left out, as the write path leaves them out of the index.

    Bounded: the newest ``max_memories`` (default :data:`WARM_MEMORY_CAP`), read in pages
    of ``page`` records (several store calls, none of them large); a user with more has the
    older ones unsearchable in this process (a warning is logged).

    Raises:
        ValidationError: ``max_memories`` or ``page`` < 1. The loader raises
            ValidationError for a bad user id, and the store's mapped errors.
    """
    if max_memories < 1 or page < 1:
        raise ValidationError("memory_loader needs max_memories >= 1 and page >= 1")
    registry = types if types is not None else MemoryTypeRegistry()
    now_of = (clock or SystemClock()).now

    async def load(user_id: str) -> list[IndexedDoc]:
        names = registry.names()
        now = now_of()
        docs: list[IndexedDoc] = []
        seen: set[str] = set()
        until: datetime | None = None
        size = min(page, max_memories)
        while len(seen) < max_memories:
            batch = await durable.query_memories(
                user_id, memory_types=names, until=until, limit=size
            )
            for record in batch:
                if record.memory_id in seen or len(seen) >= max_memories:
                    continue
                seen.add(record.memory_id)
                if not is_hidden(record, now):
                    docs.append(memory_doc(record))
            if len(batch) < size:
                return docs
            oldest = batch[-1].created_at
            if batch[0].created_at == oldest:
                size *= 2  # one instant fills the page: widen it to get past the instant
                continue
            # ``until`` is exclusive: take the oldest instant again, deduplicated by ``seen``.
            until = oldest + timedelta(microseconds=1)
            size = min(page, max_memories)
        logger.warning(
            "warming the index read the newest %d memories of a user; older ones are not "
            "searchable in this process",
            max_memories,
        )
        return docs

    return load


def turn_loader(
    durable: DurableStore,
    *,
    sessions: int = WARM_SESSIONS,
    turns_per_session: int = WARM_TURNS_PER_SESSION,
    retention: timedelta | None = None,
    clock: Clock | None = None,
    concurrency: int = 4,
) -> DocLoader:
    """A loader of the live archived turns of the user's ``sessions`` newest sessions, the
    last ``turns_per_session`` of each (``tail_turns``): at most sessions ×
    turns_per_session turns (4,000 by default) in ``sessions + 1`` store calls.

    ``retention`` is the session tier's ``durable_ttl``: each document then expires that
    long after the load. A turn's own expiry is never later (it was appended before the
    load), so the warm index stops returning turns the store has dropped; recall removes
    one it meets earlier. None: the documents do not expire (the index's eviction of cold
    users bounds them).

    Raises:
        ValidationError: ``sessions``, ``turns_per_session`` or ``concurrency`` < 1. The
            loader raises ValidationError for a bad user id, and the store's mapped errors.
    """
    if sessions < 1 or turns_per_session < 1 or concurrency < 1:
        raise ValidationError(
            "turn_loader needs sessions >= 1, turns_per_session >= 1 and concurrency >= 1"
        )
    now_of = (clock or SystemClock()).now

    async def load(user_id: str) -> list[IndexedDoc]:
        expires_at = None if retention is None else now_of() + retention
        refs = await durable.list_sessions(user_id, limit=sessions)
        gate = asyncio.Semaphore(concurrency)

        async def one(session_id: str) -> list[IndexedDoc]:
            async with gate:
                turns = await durable.tail_turns(session_id, turns_per_session)
            return turn_docs(user_id, session_id, turns, expires_at=expires_at)

        loaded = await asyncio.gather(*(one(ref.session_id) for ref in refs))
        return [doc for docs in loaded for doc in docs]

    return load


# -- resolvers --------------------------------------------------------------------------------


class ResolvedDoc(NamedTuple):
    """What a resolver knows of one document of its kind. A plain ``(text, provenance)``
    pair is accepted too; ``created_at`` gives it recency, ``importance`` (0..1) weight."""

    text: str
    provenance: Provenance
    created_at: datetime | None = None
    importance: float | None = None


Resolver = Callable[
    [str, Sequence[str]], Awaitable[Mapping[str, ResolvedDoc | tuple[str, Provenance]]]
]
"""``async (user_id, doc_ids) -> {doc_id: ResolvedDoc}``; ids it does not know are left out."""


# -- recall -----------------------------------------------------------------------------------


@dataclass(slots=True)
class RecallCounters:
    """What recall degraded or repaired, for metrics."""

    recalls: int = 0
    embedding_failures: int = 0
    """Embedder errors; recall went on without embeddings (logged)."""
    stale_documents: int = 0
    """Index documents whose record had gone; removed from the index in the background."""


@dataclass(slots=True)
class _Candidate:
    kind: DocKind
    doc_id: str
    bm25: float = 0.0
    cosine: float | None = None
    memory: MemoryRecord | None = None
    turn: Turn | None = None
    resolved: ResolvedDoc | None = None


class Recaller:
    """Recall over one durable store and one search index (see the module docstring).

    ``embedder``: optional; with it recall is hybrid. Its failures degrade recall to
    BM25 (logged, counted in :attr:`counters`) unless ``raise_embedding_errors``.
    ``access``: where returned memories' accesses are counted (written later).
    """

    def __init__(
        self,
        durable: DurableStore,
        index: SearchIndex,
        *,
        clock: Clock,
        policy: RecallPolicy | None = None,
        embedder: Embedder | None = None,
        access: AccessTracker | None = None,
        fetch_concurrency: int = 16,
        raise_embedding_errors: bool = False,
    ) -> None:
        if fetch_concurrency < 1:
            raise ValidationError("fetch_concurrency must be at least 1")
        self._durable = durable
        self._index = index
        self._clock = clock
        self._policy = policy or RecallPolicy()
        self._embedder = embedder
        self._access = access
        self._fetch_concurrency = fetch_concurrency
        self._raise_embedding_errors = raise_embedding_errors
        self._resolvers: dict[str, Resolver] = {}
        self._summaries: Resolver | None = None
        self._repairs: set[asyncio.Task[None]] = set()
        self.counters = RecallCounters()

    @property
    def policy(self) -> RecallPolicy:
        return self._policy

    def register_resolver(self, kind: DocKind, resolver: Resolver) -> None:
        """Fetch documents of ``kind`` (e.g. ``"chunk"``) through ``resolver``.

        Raises:
            ValidationError: ``kind`` is unknown, or is ``memory``/``turn`` (built in).
        """
        if kind not in _KINDS or kind in ("memory", "turn"):
            raise ValidationError(
                f"cannot register a resolver for {kind!r}: memories and turns are built in; "
                f"other kinds are {[k for k in _KINDS if k not in ('memory', 'turn')]}"
            )
        self._resolvers[kind] = resolver

    def register_summary_resolver(self, resolver: Resolver) -> None:
        """Fetch summary documents (:func:`summary_doc_id`) through ``resolver``; a
        :meth:`recall` with ``summaries=True`` then searches them. The resolver returns only
        lines the session's current summary records still hold: the others (superseded by a
        later pass, reset by a redaction, expired) are stale and leave the index."""
        self._summaries = resolver

    @property
    def has_summaries(self) -> bool:
        """Whether summary documents can be recalled (a resolver is registered)."""
        return self._summaries is not None

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        types: Collection[str] | None = None,
        min_importance: float = 0.0,
        since: datetime | None = None,
        until: datetime | None = None,
        k: int = 5,
        scope: Collection[DocKind] = _MEMORY_ONLY,
        candidates: int | None = None,
        embed_missing: bool = True,
        turns_read: dict[str, Turn | None] | None = None,
        summaries: bool = False,
    ) -> list[RecallHit]:
        """The ``k`` best hits for ``query`` among the user's documents of ``scope``.

        ``candidates``: how many each source contributes (and so how many records are
        fetched); default ``policy.candidate_count(k)``. Per-turn recall for the context
        asks for fewer, as every candidate turn is one store read. ``embed_missing=False``:
        a candidate without a vector (from the index's vector search or the record) gets no
        embedding part instead of being embedded now, so the query is the only text
        embedded (per-turn recall: turns are embedded when indexed, see
        :meth:`embed_documents`). ``turns_read``: when given, candidate turns are read with
        the turns either side of them (one ``get_turns`` per run of nearby candidates in a
        session, instead of one ``get_turn`` each), and every turn read is recorded there
        by doc id (None: no visible turn at that index), for :meth:`neighbour_turns`.

        ``types`` and the time range (``since`` inclusive, ``until`` exclusive, on the
        creation time) filter memories; ``min_importance`` filters memories and turns.

        ``summaries=True`` adds the lines of the user's session summaries and structured
        memory (earlier sessions' derived memory, which outlives their raw turns) to
        ``scope``, when a summary resolver is registered; otherwise they are never returned,
        whatever ``scope`` says (a knowledge search finds only knowledge chunks).

        Raises:
            ValidationError: bad ids, ``k`` outside 1..100, an unknown kind in ``scope``
                or one without a resolver, a naive datetime, ``min_importance`` outside
                [0, 1], ``types`` given as one string.
            BackendError: the index or the durable store failed (mapped by them).
        """
        validate_id(user_id, what="user_id")
        if not isinstance(query, str):
            raise ValidationError(f"query must be a string, got {type(query).__name__}")
        kinds = self._check_scope(scope)
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValidationError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
        if not 0.0 <= min_importance <= 1.0:
            raise ValidationError(f"min_importance must be in [0, 1], got {min_importance}")
        if candidates is not None and (not isinstance(candidates, int) or candidates < k):
            raise ValidationError(f"candidates must be an integer >= k, got {candidates!r}")
        check_aware(since, what="since")
        check_aware(until, what="until")
        if isinstance(types, str):
            raise ValidationError(f"types must be a collection of type names, got {types!r}")
        type_set = None if types is None else frozenset(types)
        now = self._clock.now()
        self.counters.recalls += 1

        with_summaries = summaries and self._summaries is not None
        searched = kinds
        if with_summaries and SUMMARY_DOC_KIND not in kinds:
            searched = [*kinds, SUMMARY_DOC_KIND]
        found, vector = await self._gather(
            user_id, query, searched, type_set, since, until, k, candidates
        )
        for key, c in list(found.items()):
            if c.kind != SUMMARY_DOC_KIND:
                continue
            is_summary = parse_summary_doc_id(c.doc_id) is not None
            if (is_summary and not with_summaries) or (
                not is_summary and SUMMARY_DOC_KIND not in kinds
            ):
                del found[key]
        stale = await self._fetch(user_id, found, turns_read)
        kept = [
            c
            for c in found.values()
            if _visible(
                c, now=now, types=type_set, min_importance=min_importance, since=since, until=until
            )
        ]
        if vector is not None and self._embedder is not None:
            await self._fill_cosines(self._embedder, kept, vector, embed_missing=embed_missing)
        ranked = rank_candidates(
            self._policy,
            [(c, _signals(c, now)) for c in kept],
            k=k,
            require_relevance=bool(query_terms(query)) or vector is not None,
        )
        hits = [_hit(c, score.score, score.components) for c, score in ranked]
        if self._access is not None:
            self._access.record(user_id, [h.doc_id for h in hits if h.kind == "memory"])
        if stale:
            self._repair(user_id, stale)
        return hits

    async def embed_documents(self, docs: Sequence[IndexedDoc]) -> list[IndexedDoc]:
        """``docs`` with their embeddings, in one batch call of the embedder (documents that
        have one keep it); unchanged without an embedder or when it fails (logged and
        counted: the documents stay searchable by BM25). Call it when indexing, off the
        response path, so that a recall embeds only its query.

        Raises:
            BackendError: the embedder failed and ``raise_embedding_errors`` is set.
        """
        embedder = self._embedder
        if embedder is None:  # every turn's batch without embeddings: no scan of the texts
            return list(docs)
        todo = [i for i, doc in enumerate(docs) if doc.embedding is None and doc.text.strip()]
        if not todo:
            return list(docs)
        vectors = await self._embed(embedder, [docs[i].text for i in todo])
        if vectors is None:
            return list(docs)
        out = list(docs)
        for i, vec in zip(todo, vectors, strict=True):
            out[i] = docs[i].model_copy(update={"embedding": tuple(vec)})
        return out

    async def neighbour_turns(
        self,
        hits: Sequence[RecallHit],
        *,
        exclude: Collection[str] = (),
        known: Mapping[str, Turn | None] | None = None,
    ) -> list[RecallHit]:
        """For each turn hit, the turn completing its exchange: after a user turn the
        next turn (the answer), before any other the previous one (the question); as hits
        with ``neighbour_of`` set and the hit's score, in the order of ``hits``. Turns in
        ``exclude`` (doc ids), missing, redacted or empty turns are left out. Turns in
        ``known`` (the ``turns_read`` of :meth:`recall`) are not read again.

        Raises:
            BackendError: the durable store failed.
        """
        wanted: list[tuple[RecallHit, str, int]] = []
        seen = set(exclude)
        for hit in hits:
            if hit.kind != "turn" or hit.turn is None or hit.session_id is None:
                continue
            index = hit.turn.index + 1 if hit.turn.role == "user" else hit.turn.index - 1
            doc_id = turn_doc_id(hit.session_id, index)
            if index < 0 or doc_id in seen:
                continue
            seen.add(doc_id)
            wanted.append((hit, hit.session_id, index))
        gate = asyncio.Semaphore(self._fetch_concurrency)

        read = known or {}

        async def one(session_id: str, index: int) -> Turn | None:
            doc_id = turn_doc_id(session_id, index)
            if doc_id in read:
                return read[doc_id]
            async with gate:
                try:
                    return await self._durable.get_turn(session_id, index)
                except NotFoundError:
                    return None

        turns = await asyncio.gather(*(one(s, i) for _, s, i in wanted))
        out: list[RecallHit] = []
        for (hit, session_id, index), turn in zip(wanted, turns, strict=True):
            if turn is None or turn.redacted or not turn.text.strip():
                continue
            out.append(
                RecallHit(
                    kind="turn",
                    doc_id=turn_doc_id(session_id, index),
                    text=turn.text,
                    score=hit.score,
                    turn=turn,
                    session_id=session_id,
                    provenance=Provenance(
                        source="archive", session_id=session_id, turn_indexes=(index,)
                    ),
                    neighbour_of=hit.doc_id,
                )
            )
        return out

    async def aclose(self) -> None:
        """Wait for background index repairs. The store and index stay open (not owned)."""
        while self._repairs:
            await asyncio.gather(*self._repairs, return_exceptions=True)

    # -- steps ----------------------------------------------------------------------------

    def _check_scope(self, scope: Collection[DocKind]) -> list[DocKind]:
        kinds = list(dict.fromkeys(scope))
        if isinstance(scope, str) or not kinds:
            raise ValidationError(
                f"scope must be a non-empty collection of kinds such as ('memory', 'turn'), "
                f"got {scope!r}"
            )
        for kind in kinds:
            if kind not in _KINDS:
                raise ValidationError(f"unknown kind {kind!r} in scope; known: {list(_KINDS)}")
            if kind not in ("memory", "turn") and kind not in self._resolvers:
                raise ValidationError(
                    f"no resolver for {kind!r} documents: register one with "
                    f"Recaller.register_resolver({kind!r}, ...)"
                )
        return kinds

    async def _gather(
        self,
        user_id: str,
        query: str,
        kinds: list[DocKind],
        types: frozenset[str] | None,
        since: datetime | None,
        until: datetime | None,
        k: int,
        count: int | None = None,
    ) -> tuple[dict[tuple[str, str], _Candidate], list[float] | None]:
        """Candidates from BM25, vectors and recent memories; and the query's embedding."""
        n = count if count is not None else self._policy.candidate_count(k)
        has_terms = bool(query_terms(query))
        embedder = self._embedder if query.strip() else None
        # Recent memories: the candidates of an empty query, and the rerank pool of an
        # embedder without index vectors.
        recent_wanted = "memory" in kinds and (
            not has_terms or (embedder is not None and not self._index.supports_vectors)
        )

        async def bm25() -> list[SearchHit]:
            if not has_terms:
                return []
            return await self._index.search(user_id, query, kinds=kinds, limit=n)

        async def recent() -> list[MemoryRecord]:
            if not recent_wanted:
                return []
            return await self._durable.query_memories(
                user_id, memory_types=types, since=since, until=until, limit=n
            )

        lexical, vector, recent_records = await asyncio.gather(
            bm25(), self._embed_query(embedder, query) if embedder else _none(), recent()
        )
        semantic: list[SearchHit] = []
        if vector is not None and self._index.supports_vectors:
            semantic = await self._index.vector_search(user_id, vector, kinds=kinds, limit=n)

        candidates: dict[tuple[str, str], _Candidate] = {}
        for hit in lexical:
            candidates[(hit.kind, hit.doc_id)] = _Candidate(hit.kind, hit.doc_id, bm25=hit.score)
        for hit in semantic:
            candidate = candidates.setdefault(
                (hit.kind, hit.doc_id), _Candidate(hit.kind, hit.doc_id)
            )
            candidate.cosine = hit.score
        for record in recent_records:
            candidate = candidates.setdefault(
                ("memory", record.memory_id), _Candidate("memory", record.memory_id)
            )
            candidate.memory = record
        return candidates, vector

    async def _embed_query(self, embedder: Embedder, query: str) -> list[float] | None:
        vectors = await self._embed(embedder, [query])
        return None if vectors is None else vectors[0]

    async def _embed(self, embedder: Embedder, texts: list[str]) -> list[list[float]] | None:
        """Embeddings of ``texts``, or None when the embedder failed and we degrade."""
        try:
            return await embedder.embed(texts)
        except BackendError as exc:
            if self._raise_embedding_errors:
                raise
            self.counters.embedding_failures += 1
            logger.warning("embedder failed, recalling without embeddings: %s", exc)
            return None

    async def _fetch(
        self,
        user_id: str,
        candidates: dict[tuple[str, str], _Candidate],
        turns_read: dict[str, Turn | None] | None = None,
    ) -> list[tuple[DocKind, str]]:
        """Fetch every candidate's record; drop (and return) those that have gone."""
        gate = asyncio.Semaphore(self._fetch_concurrency)
        stale: list[tuple[DocKind, str]] = []

        async def turn_run(session_id: str, start: int, end: int, group: list[_Candidate]) -> None:
            async with gate:
                read = {t.index: t for t in await self._durable.get_turns(session_id, start, end)}
            for c in group:
                c.turn = read.get(parse_turn_doc_id(c.doc_id)[1])
            if turns_read is not None:
                for index in range(start, end):
                    turns_read[turn_doc_id(session_id, index)] = read.get(index)

        async def memories(group: list[_Candidate]) -> None:
            found = await self._durable.get_memories(user_id, [c.doc_id for c in group])
            for c in group:
                c.memory = found.get(c.doc_id)

        async def turn(c: _Candidate) -> None:
            try:
                session_id, index = parse_turn_doc_id(c.doc_id)
            except ValidationError:
                return
            async with gate:
                try:
                    c.turn = await self._durable.get_turn(session_id, index)
                except NotFoundError:
                    c.turn = None

        async def resolve(kind: DocKind | None, group: list[_Candidate]) -> None:
            resolver = self._summaries if kind is None else self._resolvers[kind]
            assert resolver is not None
            found = await resolver(user_id, [c.doc_id for c in group])
            for c in group:
                value = found.get(c.doc_id)
                if value is not None:
                    c.resolved = value if isinstance(value, ResolvedDoc) else ResolvedDoc(*value)

        jobs: list[Awaitable[None]] = []
        unfetched: list[_Candidate] = []
        others: dict[DocKind, list[_Candidate]] = {}
        summary_docs: list[_Candidate] = []
        by_session: dict[str, list[tuple[int, _Candidate]]] = {}
        for c in candidates.values():
            if c.kind == SUMMARY_DOC_KIND and parse_summary_doc_id(c.doc_id) is not None:
                summary_docs.append(c)
            elif c.kind == "memory" and c.memory is None:
                unfetched.append(c)
            elif c.kind == "turn" and turns_read is not None:
                try:
                    session_id, index = parse_turn_doc_id(c.doc_id)
                except ValidationError:
                    continue
                by_session.setdefault(session_id, []).append((index, c))
            elif c.kind == "turn":
                jobs.append(turn(c))
            elif c.kind not in ("memory", "turn"):
                others.setdefault(c.kind, []).append(c)
        for session_id, runs in _turn_runs(by_session):
            jobs.extend(turn_run(session_id, start, end, group) for start, end, group in runs)
        jobs.extend(
            memories(unfetched[start : start + MAX_MEMORY_IDS_PER_GET])
            for start in range(0, len(unfetched), MAX_MEMORY_IDS_PER_GET)
        )
        jobs.extend(resolve(kind, group) for kind, group in others.items())
        if summary_docs:
            jobs.append(resolve(None, summary_docs))
        await asyncio.gather(*jobs)

        for key, c in list(candidates.items()):
            if c.memory is None and c.turn is None and c.resolved is None:
                del candidates[key]
                # A resolver's unknown ids are its own business, except summary lines: one
                # its session's records no longer hold was superseded, reset or expired.
                if c.kind != "chunk" or parse_summary_doc_id(c.doc_id) is not None:
                    stale.append((c.kind, c.doc_id))
        return stale

    async def _fill_cosines(
        self,
        embedder: Embedder,
        kept: list[_Candidate],
        vector: list[float],
        *,
        embed_missing: bool = True,
    ) -> None:
        """Cosine for candidates the vector search did not score: from the record's stored
        embedding when it has the query's dimension, else by embedding the text (one call)."""
        model = embedder.model_id
        missing: list[_Candidate] = []
        scored: list[_Candidate] = []
        stored_vectors: list[Sequence[float]] = []
        for c in kept:
            if c.cosine is not None:
                continue
            stored = c.memory.embedding if c.memory is not None else None
            same_model = c.memory is not None and c.memory.embedding_model in (None, model)
            if stored is not None and same_model and len(stored) == len(vector):
                scored.append(c)
                stored_vectors.append(stored)
            else:
                missing.append(c)
        # One call for all: the query is normalised once (see vectors.cosines).
        for c, value in zip(scored, cosines(vector, stored_vectors), strict=True):
            c.cosine = value
        if not missing or not embed_missing:
            return
        embedded = await self._embed(embedder, [_text(c) for c in missing])
        if embedded is None:
            return
        for c, value in zip(missing, cosines(vector, embedded), strict=True):
            c.cosine = value

    def _repair(self, user_id: str, stale: list[tuple[DocKind, str]]) -> None:
        """Remove documents whose record has gone, off the request path."""
        self.counters.stale_documents += len(stale)

        async def remove() -> None:
            await self._index.remove(user_id, [doc_id for _, doc_id in stale])

        task = asyncio.get_running_loop().create_task(remove(), name="tiermem-index-repair")
        self._repairs.add(task)
        task.add_done_callback(self._repair_done)

    def _repair_done(self, task: asyncio.Task[None]) -> None:
        self._repairs.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning("removing stale documents from the index failed: %s", exc)


async def _none() -> None:
    return None


_RUN_GAP = 4
"""Candidate turns of a session at most this far apart are read in one ``get_turns``."""


def _turn_runs(
    by_session: Mapping[str, list[tuple[int, _Candidate]]],
) -> list[tuple[str, list[tuple[int, int, list[_Candidate]]]]]:
    """Per session, the index ranges [start, end) to read: each candidate's turn and the
    turns either side, nearby candidates merged into one range."""
    out: list[tuple[str, list[tuple[int, int, list[_Candidate]]]]] = []
    for session_id, found in by_session.items():
        found.sort(key=lambda pair: pair[0])
        runs: list[tuple[int, int, list[_Candidate]]] = []
        for index, c in found:
            start, end = max(0, index - 1), index + 2
            if runs and start <= runs[-1][1] + _RUN_GAP:
                runs[-1] = (runs[-1][0], end, [*runs[-1][2], c])
            else:
                runs.append((start, end, [c]))
        out.append((session_id, runs))
    return out


def _text(c: _Candidate) -> str:
    if c.memory is not None:
        return c.memory.content
    if c.turn is not None:
        return c.turn.text
    return c.resolved.text if c.resolved is not None else ""


def _created_at(c: _Candidate) -> datetime | None:
    if c.memory is not None:
        return c.memory.created_at
    if c.turn is not None:
        return c.turn.timestamp
    return c.resolved.created_at if c.resolved is not None else None


def _visible(
    c: _Candidate,
    *,
    now: datetime,
    types: frozenset[str] | None,
    min_importance: float,
    since: datetime | None,
    until: datetime | None,
) -> bool:
    """Whether a fetched candidate may be returned under the recall's filters."""
    created = _created_at(c)
    if created is not None and (
        (since is not None and created < since) or (until is not None and created >= until)
    ):
        return False
    if c.memory is not None:
        record = c.memory
        if is_internal_type(record.memory_type):
            return False
        if types is not None and record.memory_type not in types:
            return False
        if record.expires_at is not None and record.expires_at <= now:
            return False
        if record.invalid_from is not None and record.invalid_from <= now:
            return False
        if record.valid_from is not None and record.valid_from > now:
            return False
        return record.importance >= min_importance
    if c.turn is not None:
        return c.turn.importance >= min_importance
    if c.resolved is not None and c.resolved.importance is not None:
        return c.resolved.importance >= min_importance
    return True


def _signals(c: _Candidate, now: datetime) -> RecallSignals:
    created = _created_at(c)
    importance, accesses = 0.5, 0
    if c.memory is not None:
        importance, accesses = c.memory.importance, c.memory.access_count
    elif c.turn is not None:
        importance = c.turn.importance
    elif c.resolved is not None and c.resolved.importance is not None:
        importance = c.resolved.importance
    return RecallSignals(
        bm25=c.bm25,
        cosine=c.cosine,
        age=None if created is None else now - created,
        importance=importance,
        access_count=accesses,
    )


def _hit(c: _Candidate, score: float, components: dict[str, float]) -> RecallHit:
    if c.memory is not None:
        return RecallHit(
            kind="memory",
            doc_id=c.doc_id,
            text=c.memory.content,
            score=score,
            components=components,
            memory=c.memory,
            session_id=c.memory.provenance.session_id,
            provenance=c.memory.provenance,
        )
    if c.turn is not None:
        session_id, index = parse_turn_doc_id(c.doc_id)
        return RecallHit(
            kind="turn",
            doc_id=c.doc_id,
            text=c.turn.text,
            score=score,
            components=components,
            turn=c.turn,
            session_id=session_id,
            provenance=Provenance(source="archive", session_id=session_id, turn_indexes=(index,)),
        )
    resolved = c.resolved or ResolvedDoc("", Provenance())
    return RecallHit(
        kind=c.kind,
        doc_id=c.doc_id,
        text=resolved.text,
        score=score,
        components=components,
        session_id=resolved.provenance.session_id,
        provenance=resolved.provenance,
        created_at=resolved.created_at,
    )
