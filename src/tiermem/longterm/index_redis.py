"""The search index of Redis deployments: :class:`RedisIndex`, BM25 postings in the hot tier.

Why Redis and not a search engine: Redis is already deployed as the hot tier, answers in
well under a millisecond, keeps a user's index in one cluster slot, and is updated with the
write in one round trip; no extra service. Vectors are not searched here (see
``docs/recall.md``): with an embedder, recall reranks BM25 and recent candidates with the
embeddings stored on the memory records; full semantic search at scale belongs in a vector
engine plugged in through :class:`~tiermem.longterm.index.SearchIndex`.

Key layout, version 2 (``tm`` is the ``prefix``, normally the Redis store's, so a user's
index keys sit in the same slot as the user's memories; ``<uid>`` is escaped by
:func:`~tiermem.store.keys.escape_segment`; ``<term>`` is a token of
:func:`~tiermem.longterm.text.tokenize`, letters, digits and CJK only, so it needs no
escaping and cannot leave the hash tag)::

    tm:{u=<uid>}:
    ├── ix2:docs          hash   doc_id → "<kind>|<length>|<number>"
    ├── ix2:terms         hash   doc_id → the doc's distinct terms, space-separated
    ├── ix2:ids           hash   number → <k><doc_id>     (the doc-number table, <k>: kind)
    ├── ix2:stats         hash   n → documents · len → total length (BM25 statistics)
    │                            · next → the last number given · epoch → a token
    ├── ix2:exp           zset   doc_id → expires_at µs     (only documents that expire)
    ├── ix2:<k>:n=<term>  string the numbers of the documents holding the term, u32
    │                            little-endian, ascending        (<k> = m(emory),
    ├── ix2:<k>:v=<term>  string their ``length · 2^20 + tf``, u64     t(urn), c(hunk))
    │                            (0: the tombstone of a removed document)
    ├── ix2:dead          hash   "<k>:<term>" → tombstones in that list
    tm:ixdue:{ixdue=<n>} zset  user_id → a time at or before the user's earliest document
                              expiry (n = crc32(user_id) mod the activity shard count)

Why packed strings: a search reads each query term's posting list whole. As a hash of
decimal values (layout 1, below) a broad query's ~5,000 postings came back as ~10,000
reply elements, and parsing them cost the client ~5 ms; as two strings per list they are
two bulk replies, decoded by :func:`~tiermem.longterm.postings.unpack_postings` in C
(``array`` + ``zip``, ~0.1 µs a posting). A posting still carries its document's length,
so scoring reads nothing but the lists; kinds have separate lists, so a memory-only search
never reads the turns'; ``df`` is the lists' total ``STRLEN`` / 4 minus their tombstones.

Numbers. Each indexed document gets the next number of its user (``next``); a replaced
document gets a new one, so numbers only grow, appending keeps every list sorted, and a
number never names two documents while the user's statistics live. When the user's last
document goes, the statistics go too and numbering starts again under a new ``epoch``
token: the client's cache of number → doc_id is keyed by the epoch, and a search checks
the epoch when it reads the ids, so a stale mapping is never used. Every script that may
start a numbering brings its own token (one per script, not per call: another process may
empty the user between two scripts of one call). Compaction never renumbers. Numbers are
u32: a script that would give a number past 2^32 - 1 fails before writing anything, and
the user must be purged and reindexed (a design limit: ~4 billion writes to one user).

Concurrency. Every write is one Lua script (atomic on the server): an upsert first removes
the named documents' former versions, then APPENDs each new posting to its two strings
(O(1) per posting; the postings of several documents of one script that share a list go
in one APPEND, and each hash and the statistics are written once per script, not once per
document); several processes indexing the same user interleave whole scripts, so
the lists stay parallel and sorted. Removal (delete, replace, expiry, purge) finds each
number by binary search and overwrites its value with zeros in place (``SETRANGE``, a
tombstone, counted in ``ix2:dead``); a list is rewritten without its tombstones once a
quarter of it is dead, and deleted once all of it is. Why not rewrite at once: a list of a
common term holds thousands of postings, and rewriting a turn's ~12 lists on every removal
cost Redis ~1.5 ms per removed turn (measured), against ~0.1 ms this way; amortised, a
removal copies a few postings. A tombstone keeps only a number no id names any more (the
``ids`` entry goes with the document), never returns from a search, and does not count in
df, so scores equal an index that never saw the document. ``purge_user`` removes the
documents, then checks that none is left and deletes the rest in one script
(:data:`INDEX_DROP_EMPTY`), so an upsert racing the purge keeps its statistics.

Design limits:

* Redis Cluster. The search script and the purge's last step declare every key they
  touch (:meth:`RedisIndexKeys.read`, :meth:`RedisIndexKeys.drop_empty`; a 64-term query
  declares ~390). The write scripts (upsert, remove, collect, migrate) declare the user's
  four index keys and address the ``ids`` and ``dead`` hashes, the posting strings and
  layout 1's keys by name under the same hash tag: a write's posting keys depend on the
  former version's terms, which only Redis knows, and declaring them would cost a read
  round trip per write. Redis does not check that same-slot keys are declared, and every
  key of a user is in one slot, so this works on a stable cluster; but while the user's
  slot is being migrated, a key already moved makes a write script fail at that command
  (a redirect is an error inside a script) after the writes before it, which Redis does
  not roll back. Do not reshard slots under writing processes.
* BM25 statistics (``n``, ``len``, df) count expired documents until they are collected,
  as every index does; a search reads the numbers of all expired, uncollected documents of
  the user, so its cost grows with a collection backlog.
* Ties are ordered by doc_id, which only the ids table knows: a search fetches the id of
  every document tied with the ``limit``-th one (thousands when thousands of identical
  documents tie), and caches them.
* A posting packs ``tf`` in 20 bits (as every index): a term occurring 2^20 times or more
  in one document spills into its length.
* Client caches: number → doc_id for at most :data:`_ID_CACHE_USERS` users and
  :data:`_ID_CACHE_TOTAL` ids, due marks for :data:`_DUE_MARKS_KEPT` users; over a bound a
  cache starts again; :meth:`RedisIndex.clear_caches` empties both.

Round trips: ``upsert`` 1 (one script per user and per 200 documents, and, pipelined, the
due mark of a user this process has not marked in the last 5 minutes at or before the new
documents' earliest expiry; one upsert in :data:`COLLECT_EVERY_WRITES` adds a
``collect_expired``), ``remove`` 1, ``search`` 1 when the ids of the hits are in the
process's cache, else 2 (an ``HMGET`` of the missing ones), ``purge_user`` 2 (+1 per 500
documents beyond the first 500; +1 per attempt when writes race it), ``collect_expired``
1 when nothing is due, else 4 per round. ``search`` is one read-only script returning the
statistics, the numbers of the user's expired, uncollected documents, each term's df and
the asked kinds' packed lists (at most :data:`~tiermem.longterm.text.MAX_QUERY_TERMS`
terms); the client scores them with :func:`~tiermem.longterm.postings.bm25_top_packed`
(numpy, or the in-process index's :func:`~tiermem.longterm.postings.bm25_top`), summing
in query order, so scores are equal by construction (ties, whose order the numbers would
decide, are ordered by doc_id as everywhere). Why not score in Lua: a broad query's
~5,000 postings held Redis's one thread for ~9 ms (measured, ``docs/recall.md``).

Migration from layout 1. Layout 1 kept ``ix:docs`` (doc_id → "<kind>|<length>"),
``ix:terms``, ``ix:stats``, ``ix:exp`` and one hash per list, ``ix:<k>:t=<term>``
(doc_id → length · 2^20 + tf, decimal). Layout 2's keys have a new prefix (``ix2:``), so
the two never collide, and the user is rebuilt on first search: when the read script sees
``ix:docs``, :meth:`RedisIndex.search` runs :data:`INDEX_MIGRATE` pages (200 documents a
script, no text needed: terms and tfs are in layout 1) until layout 1 is empty, then
searches. Meanwhile every write drops the documents it names from layout 1 too, so a
removed or replaced document cannot come back from there. A rolling upgrade that keeps
processes of the former version writing must finish before relying on removals: a
removal made by an old process reaches layout 1 only; :meth:`RedisIndex.migrate_user`
moves a user eagerly (for a scripted reindex of known users).

Expiry. Index keys carry no native TTL (a posting list holds documents with different
expiries). A document's expiry is in ``ix2:exp``; ``search`` leaves out documents whose
expiry has passed (its script reads the user's expired, uncollected numbers). Collection,
bounded, earliest expiry first:

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
import struct
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
    check_collect_limit,
    check_docs,
    check_search_args,
    collect_budget,
)
from tiermem.longterm.index_redis_scripts import (
    INDEX_COLLECT,
    INDEX_DROP_EMPTY,
    INDEX_DUE_MARK,
    INDEX_DUE_POP,
    INDEX_DUE_READ,
    INDEX_MIGRATE,
    INDEX_READ,
    INDEX_REMOVE,
    INDEX_UPSERT,
)
from tiermem.longterm.postings import (
    POSTING_SHIFT,
    PackedList,
    bm25_top_packed,
    unpack_numbers,
)
from tiermem.longterm.text import query_terms
from tiermem.store.backends.redis_scripts import (
    Arg,
    Command,
    RedisClient,
    RedisIO,
    RedisKeys,
    client_from_url,
    new_write_id,
    optional_us,
    redis_boundary,
    to_us,
)
from tiermem.store.keys import validate_id

__all__ = [
    "COLLECT_EVERY_WRITES",
    "DUE_MARK_MEMORY_US",
    "LAYOUT",
    "LEGACY_LAYOUT",
    "RedisIndex",
    "RedisIndexKeys",
]

logger = logging.getLogger(__name__)

_DOCS_PER_SCRIPT = 200
_REMOVE_BATCH = 500
_PURGE_ATTEMPTS = 5
COLLECT_EVERY_WRITES = 32
"""One ``upsert`` in this many (per process) also runs a ``collect_expired``."""
DUE_MARK_MEMORY_US = 300_000_000
"""How long (µs) an index remembers the due mark it sent for a user (``upsert``)."""
_DUE_MARKS_KEPT = 65_536
_MIGRATE_PAGE = 200
"""Layout-1 documents one migration script moves."""
_MIGRATE_PASSES = 5
"""Full scans of a user's layout-1 documents before a migration gives up (ConflictError):
more are needed only while processes of the former version keep writing there."""
_SEARCH_ATTEMPTS = 3
"""Reads a search makes when the user's numbering restarts between its two round trips."""
_ID_CACHE_USERS = 256
_ID_CACHE_TOTAL = 65_536
"""Bounds of the number → doc_id cache: users, and ids in all (a few MB); over either, the
cache starts again (:meth:`RedisIndex.clear_caches` empties it on demand)."""
LAYOUT = "ix2"
"""The key segment of the current layout (see the module docstring)."""
LEGACY_LAYOUT = "ix"
"""The key segment of layout 1, migrated on first search."""

_KIND_OF_LETTER: dict[str, DocKind] = {"m": "memory", "t": "turn", "c": "chunk"}


def _packed_values(length: int, tfs: Collection[int]) -> bytes:
    """A document's posting values as :data:`INDEX_UPSERT` appends them: per term, in the
    order of ``tfs``, ``length * 2^20 + tf`` as a little-endian u64 (the layout's ``v=``
    strings). Packed here, not in Lua, where it cost Redis more than the APPENDs."""
    base = length * POSTING_SHIFT
    return struct.pack(f"<{len(tfs)}Q", *[base + tf for tf in tfs])


class RedisIndexKeys(RedisKeys):
    """The index's keys, beside the store's under the same prefix and user hash tag."""

    def index(self, user_id: str, *, layout: str = LAYOUT) -> list[str]:
        """docs, terms, stats, exp: the keys every index script declares, in order (of
        layout 1 with ``layout=LEGACY_LAYOUT``)."""
        return [
            self._user(user_id, f"{layout}:{part}") for part in ("docs", "terms", "stats", "exp")
        ]

    def ids(self, user_id: str) -> str:
        """The user's doc-number table: number → kind letter + doc_id."""
        return self._user(user_id, f"{LAYOUT}:ids")

    def dead(self, user_id: str) -> str:
        """The user's tombstone counts: "<k>:<term>" → tombstones in that list."""
        return self._user(user_id, f"{LAYOUT}:dead")

    def due_shard(self, user_id: str) -> int:
        """Which ``ixdue`` shard marks the user (stable across processes)."""
        return zlib.crc32(user_id.encode()) % self.activity_shards

    def due(self, shard: int) -> str:
        """One shard of the users with expiring documents (score: when to look again)."""
        return f"{self.prefix}:ixdue:{{ixdue={shard}}}"

    def posting(self, user_id: str, kind: DocKind, term: str) -> tuple[str, str]:
        """One term's packed posting list of one kind: its numbers and values strings (the
        scripts build the same names)."""
        part = f"{LAYOUT}:{kind[0]}"
        return self._user(user_id, f"{part}:n={term}"), self._user(user_id, f"{part}:v={term}")

    def read(self, user_id: str, terms: Sequence[str], asked: str) -> list[str]:
        """Every key :data:`INDEX_READ` touches, declared (``index`` first): ``dead``,
        layout 1's docs, each term's numbers string of every kind (df) and values string
        of the ``asked`` kinds' letters."""
        tag = self._user(user_id, "")  # escaped once: a broad query declares hundreds
        keys = [*self.index(user_id), self.dead(user_id), f"{tag}{LEGACY_LAYOUT}:docs"]
        for term in terms:
            for letter in "mtc":
                keys.append(f"{tag}{LAYOUT}:{letter}:n={term}")
                if letter in asked:
                    keys.append(f"{tag}{LAYOUT}:{letter}:v={term}")
        return keys

    def drop_empty(self, user_id: str) -> list[str]:
        """Every key :data:`INDEX_DROP_EMPTY` touches, declared (``index`` first)."""
        return [
            *self.index(user_id),
            self.ids(user_id),
            self.dead(user_id),
            *self.index(user_id, layout=LEGACY_LAYOUT),
        ]

    def legacy_posting(self, user_id: str, kind: DocKind, term: str) -> str:
        """One term's posting hash of one kind in layout 1 (doc_id → decimal value)."""
        return self._user(user_id, f"{LEGACY_LAYOUT}:{kind[0]}:t={term}")


class RedisIndex:
    """BM25 postings in Redis under each user's hash tag, scored in the client.

    ``client`` is an asyncio client with ``decode_responses=False`` (as for the Redis
    stores; share theirs); it is not closed by :meth:`aclose` unless the index was made by
    :meth:`from_url`. ``supports_vectors`` is False: :meth:`vector_search` raises.

    Raises (every method): :class:`~tiermem.errors.ValidationError` for bad ids, kinds or
    limits; :class:`~tiermem.errors.BackendUnavailableError`,
    :class:`~tiermem.errors.BackendTimeoutError` (both retryable) or
    :class:`~tiermem.errors.BackendError` for failures of Redis, chained to redis-py's error;
    :class:`~tiermem.errors.ConflictError` from ``purge_user``, ``migrate_user`` (and a
    ``search`` that migrates) when other writers keep adding documents meanwhile, and from
    ``search`` when the user's index is emptied and refilled under each of its attempts.
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
        self._id_cache: dict[str, tuple[bytes, dict[int, tuple[DocKind, str]]]] = {}
        """User → (epoch, number → (kind, doc_id)): see the module docstring's Numbers."""
        self._ids_held = 0
        """Entries in all of ``_id_cache``'s maps (bounded by _ID_CACHE_TOTAL)."""
        self.collect_failures = 0
        """Amortised collections (in ``upsert``) that failed; logged, and retried later."""
        self.migrations = 0
        """Users this index moved from layout 1, for tests and metrics."""

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
        # The last version of a document wins, as in a sequence of upserts; a script names
        # each document once.
        latest: dict[tuple[str, str], IndexedDoc] = {}
        for doc in docs:
            latest.pop((doc.user_id, doc.doc_id), None)
            latest[(doc.user_id, doc.doc_id)] = doc
        by_user: dict[str, list[IndexedDoc]] = {}
        for doc in latest.values():
            by_user.setdefault(doc.user_id, []).append(doc)
        now = self._clock.now()
        now_us = to_us(now)
        commands: list[Command] = []
        marked: list[tuple[str, int]] = []
        for user_id, user_docs in by_user.items():
            keys = self._keys.index(user_id)
            for start in range(0, len(user_docs), _DOCS_PER_SCRIPT):
                chunk = user_docs[start : start + _DOCS_PER_SCRIPT]
                # A token per script: another process may empty the user between two
                # scripts of this call, and the next one then numbers from 1 again.
                args: list[Arg] = [now_us, collect_budget(len(chunk)), new_write_id()]
                for doc in chunk:
                    live = doc.expires_at is None or doc.expires_at > now
                    counts = terms_of(doc) if live else {}
                    length = sum(counts.values())
                    args += (
                        doc.doc_id,
                        doc.kind,
                        length,
                        optional_us(doc.expires_at),
                        len(counts),
                        " ".join(counts),
                        _packed_values(length, counts.values()),
                    )
                    args.extend(counts)
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
        now_us = to_us(self._clock.now())
        asked = "".join(sorted({kind[0] for kind in kinds}))
        read = INDEX_READ.command(self._keys.read(user_id, terms, asked), [now_us, asked, *terms])
        for _ in range(_SEARCH_ATTEMPTS):
            replies = (await self._io.batch([read]))[0]
            if int(replies[3]):  # layout 1 still holds documents of the user: move them
                await self._migrate(user_id)
                replies = (await self._io.batch([read]))[0]
            count = int(replies[0])
            if count <= 0:
                return []
            lists: list[PackedList] = []
            at = 5
            for _ in terms:
                df = int(replies[at])
                lists += [
                    (df, replies[at + 1 + 2 * j], replies[at + 2 + 2 * j])
                    for j in range(len(asked))
                ]
                at += 1 + 2 * len(asked)
            expired = set(unpack_numbers(replies[4]))
            top = bm25_top_packed(lists, count, int(replies[1]) / count, limit, expired)
            ids = await self._doc_ids(user_id, replies[2], [number for number, _ in top])
            if ids is None:  # the user's numbering started again meanwhile: read again
                continue
            hits = [
                SearchHit(doc_id=ids[number][1], kind=ids[number][0], score=score)
                for number, score in top
                if number in ids  # removed since the read: gone
            ]
            hits.sort(key=lambda hit: (-hit.score, hit.doc_id))
            return hits[:limit]
        raise ConflictError(
            f"the search index of user {user_id!r} was emptied and refilled during each of "
            f"{_SEARCH_ATTEMPTS} searches; retry"
        )

    async def _doc_ids(
        self, user_id: str, epoch: bytes, numbers: Sequence[int]
    ) -> dict[int, tuple[DocKind, str]] | None:
        """The kinds and doc ids of ``numbers`` under ``epoch``, from the cache or one
        ``HMGET``; a number whose document is gone has none. None: the user's epoch is not
        ``epoch`` any more (numbers may name other documents now)."""
        cached = self._id_cache.get(user_id)
        if cached is None or cached[0] != epoch:
            self._forget_ids(user_id)
            if len(self._id_cache) >= _ID_CACHE_USERS:
                self._id_cache.clear()
                self._ids_held = 0
            cached = self._id_cache[user_id] = (epoch, {})
        known = cached[1]
        answer = {number: known[number] for number in numbers if number in known}
        missing = [number for number in numbers if number not in known]
        if missing:
            stats_key = self._keys.index(user_id)[2]
            found, now_epoch = await self._io.batch(
                [
                    Command(("HMGET", self._keys.ids(user_id), *missing)),
                    Command(("HGET", stats_key, "epoch")),
                ]
            )
            if now_epoch != epoch:
                self._forget_ids(user_id)
                return None
            fetched = {
                number: (_KIND_OF_LETTER[raw[:1].decode()], raw[1:].decode())
                for number, raw in zip(missing, found, strict=True)
                if raw is not None
            }
            answer.update(fetched)
            if self._ids_held + len(fetched) > _ID_CACHE_TOTAL:
                # Over the bound: start again (cheap, and never a wrong answer).
                for entry in self._id_cache.values():
                    entry[1].clear()
                self._ids_held = 0
            if len(fetched) <= _ID_CACHE_TOTAL:
                known.update(fetched)
                self._ids_held += len(fetched)
        return answer

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        raise UnsupportedCapabilityError(
            "RedisIndex keeps BM25 postings only and cannot search vectors. With an embedder, "
            "recall reranks BM25 and recent candidates by their stored embeddings; for full "
            "semantic search plug a vector engine in as a SearchIndex (see docs/recall.md)"
        )

    @redis_boundary
    async def migrate_user(self, user_id: str) -> bool:
        """Move the user's documents from layout 1 to the current layout now (a search does
        it on its own when it meets them); True if there were any."""
        validate_id(user_id, what="user_id")
        if not await self._io.execute("EXISTS", self._keys.index(user_id, layout=LEGACY_LAYOUT)[0]):
            return False
        await self._migrate(user_id)
        return True

    async def _migrate(self, user_id: str) -> None:
        """Run migration pages until layout 1 holds nothing of the user, then mark the
        user due at its earliest expiry (layout 1's marks may have been spent)."""
        keys = self._keys.index(user_id)
        now_us = to_us(self._clock.now())
        cursor: Arg = 0
        passes = 0
        while True:
            cursor, remaining = await self._io.call(
                # A token per page, as in upsert: numbering may restart between pages.
                INDEX_MIGRATE,
                keys,
                [now_us, cursor, _MIGRATE_PAGE, new_write_id()],
            )
            if not int(remaining):
                break
            if int(cursor) == 0:  # a whole scan, and still some: written meanwhile
                passes += 1
                if passes >= _MIGRATE_PASSES:
                    raise ConflictError(
                        f"user {user_id!r} kept getting index documents in the former "
                        "layout while being migrated; upgrade every process, then retry"
                    )
        self._forget_ids(user_id)
        self.migrations += 1
        first = await self._io.execute("ZRANGE", keys[3], 0, 0)
        if first:
            when = await self._io.execute("ZSCORE", keys[3], first[0])
            if when is not None:
                await self._io.batch([self._mark_due(user_id, int(float(when)))])
        logger.info("moved a user's search index to layout %s", LAYOUT)

    @redis_boundary
    async def purge_user(self, user_id: str) -> None:
        validate_id(user_id, what="user_id")
        keys = self._keys.index(user_id)
        legacy = self._keys.index(user_id, layout=LEGACY_LAYOUT)
        self._due_marks.pop(user_id, None)
        self._forget_ids(user_id)
        for _ in range(_PURGE_ATTEMPTS):
            current, former = await self._io.batch(
                [Command(("HKEYS", keys[0])), Command(("HKEYS", legacy[0]))]
            )
            ids = sorted({raw.decode() for raw in (*current, *former)})
            if not ids:
                # Checked and deleted in one script: an upsert landing after the HKEYS
                # above must keep its statistics and numbers (its lists exist already).
                shard = self._keys.due(self._keys.due_shard(user_id))
                dropped, _ = await self._io.batch(
                    [
                        INDEX_DROP_EMPTY.command(self._keys.drop_empty(user_id), []),
                        Command(("ZREM", shard, user_id)),
                    ]
                )
                if int(dropped):
                    return
                continue
            await self.remove(user_id, ids)
        raise ConflictError(
            f"user {user_id!r} kept getting new index documents while being purged; stop "
            "writes for the user and retry"
        )

    @property
    def cached_doc_ids(self) -> int:
        """How many number → doc_id entries the cache holds (at most
        :data:`_ID_CACHE_TOTAL`), for tests and metrics."""
        return self._ids_held

    def clear_caches(self) -> None:
        """Drop every cached doc id and due mark (memory back; the next searches and
        writes pay a round trip or a command more, nothing else changes)."""
        self._id_cache.clear()
        self._ids_held = 0
        self._due_marks.clear()

    def _forget_ids(self, user_id: str) -> None:
        entry = self._id_cache.pop(user_id, None)
        if entry is not None:
            self._ids_held -= len(entry[1])

    async def aclose(self) -> None:
        self.clear_caches()
        if self._owns_client:
            self._owns_client = False
            await self._io.client.aclose()


def _check_protocol() -> SearchIndex:  # pragma: no cover - typing only
    return RedisIndex.from_url("redis://localhost")
