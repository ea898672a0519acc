"""The search index of Redis deployments: :class:`RedisIndex`, BM25 postings in the hot tier.

Why Redis and not a search engine: Redis is already deployed as the hot tier, answers in
well under a millisecond, keeps a user's index in one cluster slot, and is updated with the
write in one round trip; no extra service. Vectors are not searched here (see
``docs/recall.md``): with an embedder, recall reranks BM25 and recent candidates with the
embeddings stored on the memory records; full semantic search at scale belongs in a vector
engine plugged in through :class:`~tiermem.longterm.index.SearchIndex`.

Key layout (``tm`` is the ``prefix``, normally the Redis store's, so a user's index keys sit
in the same slot as the user's memories; ``<uid>`` is escaped by
:func:`~tiermem.store.keys.escape_segment`; ``<term>`` is a token of
:func:`~tiermem.longterm.text.tokenize`, letters, digits and CJK only, so it needs no
escaping and cannot leave the hash tag)::

    tm:{u=<uid>}:
    ├── ix:docs         hash  doc_id → "<kind>|<length>"
    ├── ix:terms        hash  doc_id → the doc's distinct terms, space-separated (to unindex)
    ├── ix:stats        hash  n → documents · len → total length       (BM25 statistics)
    ├── ix:exp          zset  doc_id → expires_at µs      (only documents that expire)
    └── ix:<k>:t=<term> hash  doc_id → length · 2^20 + tf             (one posting list per
                              term and kind; <k> = m(emory), t(urn), c(hunk))
    tm:ixdue:{ixdue=<n>} zset  user_id → a time at or before the user's earliest document
                              expiry (n = crc32(user_id) mod the activity shard count)

A posting carries its document's length, so scoring reads nothing but the posting lists
(a replaced document rewrites all its postings anyway), and kinds have separate lists, so
a memory-only search never reads the turns' postings; ``df`` is the sum of the lists'
``HLEN``. The scripts declare ``ix:docs``, ``ix:terms`` and ``ix:stats``; they address
posting lists by appending ``<k>:t=<term>`` to the name of ``ix:docs`` minus its last
segment, so every key a script touches carries the same hash tag and lives in the declared
keys' slot, which is what Redis Cluster requires. (Declaring the posting keys instead would
cost a read before every replacing write: only the server knows a replaced document's old
terms.)

Round trips: ``upsert`` 1 (one script per user and per 200 documents, and, pipelined, the
due mark of a user this process has not marked in the last 5 minutes at or before the new
documents' earliest expiry -- so a user writing turns costs one command per upsert; one
upsert in :data:`COLLECT_EVERY_WRITES` adds a ``collect_expired``),
``remove`` 1, ``search`` 1 (2 when more than 1,024 expired documents await collection),
``purge_user`` 2 (+1 per 500 documents beyond the first 500), ``collect_expired`` 1 when
nothing is due, else 4 per round.
``search`` is one pipeline of plain reads -- the statistics, the user's expired documents,
``HLEN`` of each query term's lists (df) and ``HGETALL`` of its lists in the asked kinds
(at most :data:`~tiermem.longterm.text.MAX_QUERY_TERMS` terms) -- and the client scores them
with :func:`~tiermem.longterm.index_memory.bm25_top`, the in-process index's code, so
scores are equal by construction. Why not a Lua script: scoring a broad query's ~5,000
postings in Lua held Redis's one thread for ~9 ms (measured, ``docs/recall.md``);
serializing the lists costs it ~1.6 ms, and the scoring (which prunes, see
:func:`~tiermem.longterm.index_memory.bm25_top`) runs in the application processes.
Its work grows with the user's postings of the query's terms, never with the keyspace.

Expiry. Index keys carry no native TTL (a posting list holds documents with different
expiries). A document's expiry is in ``ix:exp``; ``search`` leaves out documents whose
expiry has passed (it reads the user's expired, uncollected ids from ``ix:exp`` in its
pipeline). Collection, bounded, earliest
expiry first:

* each ``upsert`` script also drops up to
  :func:`~tiermem.longterm.index_memory.collect_budget` of the user's own expired
  documents, in the same round trip;
* a user with expiring documents is marked in one of the ``ixdue`` shards with a score at
  or before its earliest expiry (set in the write's pipeline, only ever lowered there), so
  :meth:`RedisIndex.collect_expired` finds due users, across all users, without scanning
  keys: it pops due users from the shards (atomically per shard, so concurrent collectors
  never take the same user), runs each user's collect script, and marks each user again
  with its next expiry. Popping before collecting makes a concurrent write's mark survive.
  A process that dies between the pop and the new mark leaves that user unmarked until its
  next write with an expiring document.
* every :data:`COLLECT_EVERY_WRITES` upserts, ``upsert`` runs one ``collect_expired``, so
  users who never write or recall again are collected without a sweeper (a failure there
  is logged and counted in ``collect_failures``: the write itself succeeded).

Memories carry no expiry in the index: recall removes postings whose record has gone
(deleted or expired) when it meets them.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection, Sequence
from typing import Any, Self

from tiermem.clock import Clock, SystemClock
from tiermem.errors import BackendError, ConflictError, UnsupportedCapabilityError
from tiermem.longterm.index import (
    DEFAULT_COLLECT_LIMIT,
    DocKind,
    IndexedDoc,
    SearchHit,
    SearchIndex,
    terms_of,
)
from tiermem.longterm.index_memory import (
    bm25_top,
    check_collect_limit,
    check_docs,
    check_search_args,
    collect_budget,
)
from tiermem.longterm.index_redis_scripts import (
    INDEX_COLLECT,
    INDEX_DUE_MARK,
    INDEX_DUE_POP,
    INDEX_DUE_READ,
    INDEX_REMOVE,
    INDEX_UPSERT,
)
from tiermem.longterm.text import query_terms
from tiermem.store.backends.redis_scripts import (
    Arg,
    Command,
    RedisClient,
    RedisIO,
    RedisKeys,
    client_from_url,
    optional_us,
    redis_boundary,
    to_us,
)
from tiermem.store.keys import validate_id

__all__ = ["COLLECT_EVERY_WRITES", "DUE_MARK_MEMORY_US", "RedisIndex", "RedisIndexKeys"]

logger = logging.getLogger(__name__)

_DOCS_PER_SCRIPT = 200
_REMOVE_BATCH = 500
_PURGE_ATTEMPTS = 5
COLLECT_EVERY_WRITES = 32
"""One ``upsert`` in this many (per process) also runs a ``collect_expired``."""
DUE_MARK_MEMORY_US = 300_000_000
"""How long (µs) an index remembers the due mark it sent for a user (``upsert``)."""
_DUE_MARKS_KEPT = 65_536


class RedisIndexKeys(RedisKeys):
    """The index's keys, beside the store's under the same prefix and user hash tag."""

    def index(self, user_id: str) -> list[str]:
        """docs, terms, stats, exp: the keys every index script declares, in order."""
        return [self._user(user_id, f"ix:{part}") for part in ("docs", "terms", "stats", "exp")]

    def due_shard(self, user_id: str) -> int:
        """Which ``ixdue`` shard marks the user (stable across processes)."""
        return zlib.crc32(user_id.encode()) % self.activity_shards

    def due(self, shard: int) -> str:
        """One shard of the users with expiring documents (score: when to look again)."""
        return f"{self.prefix}:ixdue:{{ixdue={shard}}}"

    def posting(self, user_id: str, kind: DocKind, term: str) -> str:
        """One term's posting list of one kind (the scripts build the same name)."""
        return self._user(user_id, f"ix:{kind[0]}:t={term}")


_KIND_OF_LETTER: dict[str, DocKind] = {"m": "memory", "t": "turn", "c": "chunk"}
_EXPIRED_READ = 1024
"""Expired, uncollected documents a search reads in its round trip (more: a second read)."""


class RedisIndex:
    """BM25 postings in Redis under each user's hash tag, scored in the client.

    ``client`` is an asyncio client with ``decode_responses=False`` (as for the Redis
    stores; share theirs); it is not closed by :meth:`aclose` unless the index was made by
    :meth:`from_url`. ``supports_vectors`` is False: :meth:`vector_search` raises.

    Raises (every method): :class:`~tiermem.errors.ValidationError` for bad ids, kinds or
    limits; :class:`~tiermem.errors.BackendUnavailableError`,
    :class:`~tiermem.errors.BackendTimeoutError` (both retryable) or
    :class:`~tiermem.errors.BackendError` for failures of Redis, chained to redis-py's error.
    """

    name = "redis"
    supports_vectors = False

    def __init__(
        self, client: RedisClient, *, prefix: str = "tm", clock: Clock | None = None
    ) -> None:
        self._io = RedisIO(client)
        self._keys = RedisIndexKeys(prefix)
        self._clock: Clock = clock or SystemClock()
        self._owns_client = False
        self._writes = 0
        self._due_marks: dict[str, tuple[int, int]] = {}
        """User → (the due time this process last marked, when): see _due_mark_needed."""
        self.collect_failures = 0
        """Amortised collections (in ``upsert``) that failed; logged, and retried later."""

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "tm", clock: Clock | None = None, **client_options: Any
    ) -> Self:
        """An index on a new client for ``url``; it owns (and closes) the client."""
        index = cls(client_from_url(url, **client_options), prefix=prefix, clock=clock)
        index._owns_client = True
        return index

    @property
    def keys(self) -> RedisIndexKeys:
        return self._keys

    @redis_boundary
    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        check_docs(docs)
        by_user: dict[str, list[IndexedDoc]] = {}
        for doc in docs:
            by_user.setdefault(doc.user_id, []).append(doc)
        now = self._clock.now()
        now_us = to_us(now)
        commands: list[Command] = []
        marked: list[tuple[str, int]] = []
        for user_id, user_docs in by_user.items():
            keys = self._keys.index(user_id)
            for start in range(0, len(user_docs), _DOCS_PER_SCRIPT):
                chunk = user_docs[start : start + _DOCS_PER_SCRIPT]
                args: list[Arg] = [now_us, collect_budget(len(chunk))]
                for doc in chunk:
                    live = doc.expires_at is None or doc.expires_at > now
                    counts = terms_of(doc) if live else {}
                    args += [
                        doc.doc_id,
                        doc.kind,
                        sum(counts.values()),
                        optional_us(doc.expires_at),
                        len(counts),
                    ]
                    for term, tf in counts.items():
                        args += [term, tf]
                commands.append(INDEX_UPSERT.command(keys, args))
            expiries = [d.expires_at for d in user_docs if d.expires_at and d.expires_at > now]
            if expiries and self._due_mark_needed(user_id, to_us(min(expiries)), now_us):
                commands.append(self._mark_due(user_id, to_us(min(expiries))))
                marked.append((user_id, to_us(min(expiries))))
        if not commands:
            return
        await self._io.batch(commands)
        for user_id, when_us in marked:
            self._due_marks[user_id] = (when_us, now_us)
        self._writes += 1
        if self._writes >= COLLECT_EVERY_WRITES:
            self._writes = 0
            try:
                await self.collect_expired()
            except BackendError as exc:
                self.collect_failures += 1
                logger.warning("collecting expired index documents failed: %s", exc)

    @redis_boundary
    async def collect_expired(self, limit: int = DEFAULT_COLLECT_LIMIT) -> int:
        """See :meth:`~tiermem.longterm.index.SearchIndex.collect_expired`.

        In rounds of 4 round trips (read every ``ixdue`` shard, pop the due users, collect
        their documents, mark them again with their next expiry) until ``limit`` documents
        are removed or no user is due; 1 round trip when none is.
        """
        check_collect_limit(limit)
        now_us = to_us(self._clock.now())
        removed = 0
        while removed < limit:
            done = await self._collect_round(now_us, limit - removed)
            if done is None:
                break
            removed += done
        return removed

    async def _collect_round(self, now_us: int, limit: int) -> int | None:
        """One round of :meth:`collect_expired`: documents removed, or None if no user was
        due. Each popped user has either expired documents (and a share of ``limit`` of
        at least 1) or a stale mark, which the round removes: rounds always progress."""
        shards = range(self._keys.activity_shards)
        pages = await self._io.batch(
            [INDEX_DUE_READ.command([self._keys.due(shard)], [now_us, limit]) for shard in shards]
        )
        due = sorted(
            (float(score), shard, user)
            for shard, page in zip(shards, pages, strict=True)
            for user, score in zip(page[::2], page[1::2], strict=True)
        )[:limit]
        if not due:
            return None
        by_shard: dict[int, list[Arg]] = {}
        for _, shard, user in due:
            by_shard.setdefault(shard, []).append(user)
        popped = await self._io.batch(
            [
                INDEX_DUE_POP.command([self._keys.due(shard)], [now_us, *users])
                for shard, users in by_shard.items()
            ]
        )
        users = [raw.decode() for page in popped for raw in page]
        for user in users:
            self._due_marks.pop(user, None)  # popped: the next write must mark it again
        if not users:
            return 0  # other collectors took them
        # Shares of ``limit`` that add up to it, each at least 1 (len(users) <= limit).
        share, extra = divmod(limit, len(users))
        try:
            results = await self._io.batch(
                [
                    INDEX_COLLECT.command(
                        self._keys.index(user), [now_us, share + (1 if i < extra else 0)]
                    )
                    for i, user in enumerate(users)
                ]
            )
        except BaseException:
            # Mark them due again, so a failed round loses nobody. Best effort: when Redis
            # is gone this fails too, and each user's next expiring write marks it again.
            try:
                await self._io.send([self._mark_due(user, now_us) for user in users])
            except Exception as again:  # noqa: BLE001 -- the original error is raised below
                logger.debug("could not mark users due again: %s", again)
            raise
        removed = 0
        marks: list[Command] = []
        for user, (count, following) in zip(users, results, strict=True):
            removed += int(count)
            if following:
                marks.append(self._mark_due(user, int(float(following))))
        if marks:
            await self._io.batch(marks)
        return removed

    def _due_mark_needed(self, user_id: str, when_us: int, now_us: int) -> bool:
        """Whether an upsert must send the user's due mark (a second command).

        A mark only ever lowers the user's due time, so one at or before ``when_us`` that
        this process sent recently already covers the new documents: turns of a session
        expire in order, so a user writing turns needs one mark, not one per turn. The
        memory of a mark lasts :data:`DUE_MARK_MEMORY_US`: a collector elsewhere may have
        popped the user meanwhile and died before marking it again, and the next write
        after that repairs it.
        """
        held = self._due_marks.get(user_id)
        if held is not None and held[0] <= when_us and now_us - held[1] < DUE_MARK_MEMORY_US:
            return False
        if len(self._due_marks) >= _DUE_MARKS_KEPT:
            self._due_marks.clear()
        return True

    def _mark_due(self, user_id: str, when_us: int) -> Command:
        return INDEX_DUE_MARK.command(
            [self._keys.due(self._keys.due_shard(user_id))], [when_us, user_id]
        )

    @redis_boundary
    async def remove(self, user_id: str, doc_ids: Collection[str]) -> None:
        validate_id(user_id, what="user_id")
        ids = list(doc_ids)
        keys = self._keys.index(user_id)
        commands = [
            INDEX_REMOVE.command(keys, ids[start : start + _REMOVE_BATCH])
            for start in range(0, len(ids), _REMOVE_BATCH)
        ]
        if commands:
            await self._io.batch(commands)

    @redis_boundary
    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        terms = query_terms(query)
        if not terms or not kinds:
            return []
        _, _, stats_key, exp_key = self._keys.index(user_id)
        now_us = to_us(self._clock.now())
        asked = sorted({kind[0] for kind in kinds})
        # One round trip of plain reads: statistics, the expired documents not yet
        # collected, each term's df (HLEN of its three kinds' lists) and the asked kinds'
        # posting lists. Scoring runs here, not in a Lua script: Redis's one thread only
        # serializes the lists (see the module docstring).
        commands = [
            Command(("HMGET", stats_key, "n", "len")),
            Command(("ZRANGEBYSCORE", exp_key, "-inf", now_us, "LIMIT", 0, _EXPIRED_READ)),
        ]
        for term in terms:
            commands += [
                Command(("HLEN", self._keys.posting(user_id, _KIND_OF_LETTER[k], term)))
                for k in "mtc"
            ]
            commands += [
                Command(("HGETALL", self._keys.posting(user_id, _KIND_OF_LETTER[k], term)))
                for k in asked
            ]
        replies = await self._io.batch(commands)
        n_raw, len_raw = replies[0]
        count = int(n_raw or 0)
        if count <= 0:
            return []
        expired: set[bytes] = set(replies[1])
        if len(expired) >= _EXPIRED_READ:  # rare: many await collection; read them all
            expired = set(await self._io.execute("ZRANGEBYSCORE", exp_key, "-inf", now_us))
        lists: list[tuple[int, dict[bytes, bytes]]] = []
        kind_lists: list[tuple[str, dict[bytes, bytes]]] = []
        step = 3 + len(asked)
        for t in range(len(terms)):
            at = 2 + t * step
            df = sum(int(replies[at + j]) for j in range(3))
            for j, k in enumerate(asked):
                posting: dict[bytes, bytes] = replies[at + 3 + j]
                if posting:
                    lists.append((df, posting))
                    kind_lists.append((k, posting))
        top = bm25_top(
            lists, count, int(len_raw) / count, limit, lambda doc_id: doc_id not in expired
        )

        def kind(doc_id: bytes) -> DocKind:
            return next(_KIND_OF_LETTER[k] for k, posting in kind_lists if doc_id in posting)

        return [SearchHit(doc_id=doc_id.decode(), kind=kind(doc_id), score=s) for doc_id, s in top]

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        raise UnsupportedCapabilityError(
            "RedisIndex keeps BM25 postings only and cannot search vectors. With an embedder, "
            "recall reranks BM25 and recent candidates by their stored embeddings; for full "
            "semantic search plug a vector engine in as a SearchIndex (see docs/recall.md)"
        )

    @redis_boundary
    async def purge_user(self, user_id: str) -> None:
        validate_id(user_id, what="user_id")
        keys = self._keys.index(user_id)
        self._due_marks.pop(user_id, None)
        for _ in range(_PURGE_ATTEMPTS):
            ids = [raw.decode() for raw in await self._io.execute("HKEYS", keys[0])]
            if not ids:
                shard = self._keys.due(self._keys.due_shard(user_id))
                await self._io.batch([Command(("DEL", *keys)), Command(("ZREM", shard, user_id))])
                return
            await self.remove(user_id, ids)
        raise ConflictError(
            f"user {user_id!r} kept getting new index documents while being purged; stop "
            "writes for the user and retry"
        )

    async def aclose(self) -> None:
        if self._owns_client:
            self._owns_client = False
            await self._io.client.aclose()


def _check_protocol() -> SearchIndex:  # pragma: no cover - typing only
    return RedisIndex.from_url("redis://localhost")
