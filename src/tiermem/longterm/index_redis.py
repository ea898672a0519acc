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
    └── ix:<k>:t=<term> hash  doc_id → length · 2^20 + tf             (one posting list per
                              term and kind; <k> = m(emory), t(urn), c(hunk))

A posting carries its document's length, so scoring reads nothing but the posting lists
(a replaced document rewrites all its postings anyway), and kinds have separate lists, so
a memory-only search never reads the turns' postings; ``df`` is the sum of the lists'
``HLEN``. The scripts declare ``ix:docs``, ``ix:terms`` and ``ix:stats``; they address
posting lists by appending ``<k>:t=<term>`` to the name of ``ix:docs`` minus its last
segment, so every key a script touches carries the same hash tag and lives in the declared
keys' slot, which is what Redis Cluster requires. (Declaring the posting keys instead would
cost a read before every replacing write: only the server knows a replaced document's old
terms.)

Round trips: ``upsert`` 1 (one script per user and per 200 documents, pipelined),
``remove`` 1, ``search`` 1, ``purge_user`` 2 (+1 per 500 documents beyond the first 500).
``search`` reads the posting lists of the query's terms (at most
:data:`~tiermem.longterm.text.MAX_QUERY_TERMS`) in the asked kinds and keeps the best
``limit`` in a heap: its work (and the time it holds Redis's one thread) grows with the
user's postings of those terms, never with the keyspace; see ``docs/recall.md`` for
numbers. Scores equal the in-process index's (same formula, same order of operations).

Index keys carry no native TTL: a memory's postings stay until it is removed from the
index; recall removes postings whose record has gone (deleted or expired) when it meets
them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from tiermem.errors import ConflictError, UnsupportedCapabilityError
from tiermem.longterm.index import DocKind, IndexedDoc, SearchHit, SearchIndex
from tiermem.longterm.index_memory import check_docs, check_search_args
from tiermem.longterm.text import BM25_B, BM25_K1, doc_terms, query_terms
from tiermem.store.backends.redis_scripts import (
    Arg,
    Command,
    LuaScript,
    RedisClient,
    RedisIO,
    RedisKeys,
    client_from_url,
    redis_boundary,
)
from tiermem.store.keys import validate_id

__all__ = ["RedisIndex", "RedisIndexKeys"]

_DOCS_PER_SCRIPT = 200
_REMOVE_BATCH = 500
_PURGE_ATTEMPTS = 5


class RedisIndexKeys(RedisKeys):
    """The index's keys, beside the store's under the same prefix and user hash tag."""

    def index(self, user_id: str) -> list[str]:
        """docs, terms, stats: the keys every index script declares, in order."""
        return [self._user(user_id, f"ix:{part}") for part in ("docs", "terms", "stats")]

    def posting(self, user_id: str, kind: DocKind, term: str) -> str:
        """One term's posting list of one kind (the scripts build the same name)."""
        return self._user(user_id, f"ix:{kind[0]}:t={term}")


_PRELUDE = """
-- KEYS: 1 docs (doc_id -> 'kind|length'), 2 terms (doc_id -> 'term term ...'),
-- 3 stats (n, len). A posting key is KEYS[1] minus 'docs', plus '<k>:t=<term>', where <k>
-- is the kind's first letter; a posting value is length * 2^20 + tf.
local base = string.sub(KEYS[1], 1, -5)
local SHIFT = 1048576
local function drop(id)
  local meta = redis.call('HGET', KEYS[1], id)
  if not meta then return 0 end
  local kind, len = string.match(meta, '^(%a)[^|]*|(%d+)$')
  local terms = redis.call('HGET', KEYS[2], id)
  if terms then
    for term in string.gmatch(terms, '%S+') do
      redis.call('HDEL', base .. kind .. ':t=' .. term, id)
    end
  end
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HINCRBY', KEYS[3], 'n', -1)
  redis.call('HINCRBY', KEYS[3], 'len', -tonumber(len))
  return 1
end
local function tidy()
  if tonumber(redis.call('HGET', KEYS[3], 'n') or '0') <= 0 then
    redis.call('DEL', KEYS[3])
  end
end
"""

INDEX_UPSERT = LuaScript(
    "index_upsert",
    _PRELUDE
    + """
-- ARGV, per document: doc_id, kind, length, number of terms, then term, tf pairs.
local i = 1
while i <= #ARGV do
  local id, kind, len, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  drop(id)
  local prefix = base .. string.sub(kind, 1, 1) .. ':t='
  local terms = {}
  for j = 0, n - 1 do
    local term = ARGV[i + 4 + 2 * j]
    redis.call('HSET', prefix .. term, id,
               string.format('%d', len * SHIFT + tonumber(ARGV[i + 5 + 2 * j])))
    terms[#terms + 1] = term
  end
  redis.call('HSET', KEYS[1], id, kind .. '|' .. ARGV[i + 2])
  redis.call('HSET', KEYS[2], id, table.concat(terms, ' '))
  redis.call('HINCRBY', KEYS[3], 'n', 1)
  redis.call('HINCRBY', KEYS[3], 'len', ARGV[i + 2])
  i = i + 4 + 2 * n
end
return 'ok'
""",
)

INDEX_REMOVE = LuaScript(
    "index_remove",
    _PRELUDE
    + """
-- ARGV: doc ids. Answers how many were indexed.
local removed = 0
for _, id in ipairs(ARGV) do removed = removed + drop(id) end
tidy()
return removed
""",
)

INDEX_SEARCH = LuaScript(
    "index_search",
    _PRELUDE
    + """
-- ARGV: 1 k1, 2 b, 3 limit, 4 kinds (space-separated), 5.. distinct query terms.
-- Read-only. Answers doc_id, kind letter, score ('%.17g') triples, best first (ties by
-- doc_id). Work: one HLEN per term and kind, one HGETALL per term and asked kind, and a
-- heap of `limit` entries; no table per document.
local n = tonumber(redis.call('HGET', KEYS[3], 'n') or '0')
if n <= 0 then return {} end
local avg = tonumber(redis.call('HGET', KEYS[3], 'len')) / n
local k1, b, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local asked = {}
for kind in string.gmatch(ARGV[4], '%S+') do asked[#asked + 1] = string.sub(kind, 1, 1) end
local scores, kind_of, ids = {}, {}, {}
for t = 5, #ARGV do
  local suffix = ':t=' .. ARGV[t]
  local df = 0
  for _, k in ipairs({'m', 't', 'c'}) do df = df + redis.call('HLEN', base .. k .. suffix) end
  if df > 0 then
    local idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
    for _, k in ipairs(asked) do
      local flat = redis.call('HGETALL', base .. k .. suffix)
      for j = 1, #flat, 2 do
        local id, v = flat[j], tonumber(flat[j + 1])
        local tf = v % SHIFT
        local len = (v - tf) / SHIFT
        local part = idf * (tf * (k1 + 1.0)) / (tf + k1 * (1.0 - b + b * len / avg))
        local s = scores[id]
        if s then
          scores[id] = s + part
        else
          scores[id] = part
          kind_of[id] = k
          ids[#ids + 1] = id
        end
      end
    end
  end
end
-- Keep the best `limit` in a heap whose root is the worst kept (lowest score, then the
-- largest id), then sort those few.
local function worse(x, y)
  local sx, sy = scores[x], scores[y]
  if sx ~= sy then return sx < sy end
  return x > y
end
local heap = {}
local function sift_down(i)
  local size = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= size and worse(heap[l], heap[m]) then m = l end
    if r <= size and worse(heap[r], heap[m]) then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]
    i = m
  end
end
for _, id in ipairs(ids) do
  if #heap < limit then
    heap[#heap + 1] = id
    local i = #heap
    while i > 1 do
      local parent = math.floor(i / 2)
      if not worse(heap[i], heap[parent]) then break end
      heap[i], heap[parent] = heap[parent], heap[i]
      i = parent
    end
  elseif worse(heap[1], id) then
    heap[1] = id
    sift_down(1)
  end
end
table.sort(heap, function(x, y) return worse(y, x) end)
local out = {}
for _, id in ipairs(heap) do
  out[#out + 1] = id
  out[#out + 1] = kind_of[id]
  out[#out + 1] = string.format('%.17g', scores[id])
end
return out
""",
)

_KIND_OF_LETTER: dict[bytes, DocKind] = {b"m": "memory", b"t": "turn", b"c": "chunk"}


class RedisIndex:
    """BM25 postings in Redis under each user's hash tag, scored server-side in Lua.

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

    def __init__(self, client: RedisClient, *, prefix: str = "tm") -> None:
        self._io = RedisIO(client)
        self._keys = RedisIndexKeys(prefix)
        self._owns_client = False

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "tm", **client_options: Any) -> Self:
        """An index on a new client for ``url``; it owns (and closes) the client."""
        index = cls(client_from_url(url, **client_options), prefix=prefix)
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
        commands: list[Command] = []
        for user_id, user_docs in by_user.items():
            keys = self._keys.index(user_id)
            for start in range(0, len(user_docs), _DOCS_PER_SCRIPT):
                args: list[Arg] = []
                for doc in user_docs[start : start + _DOCS_PER_SCRIPT]:
                    counts = doc_terms(doc.text, doc.tags)
                    args += [doc.doc_id, doc.kind, sum(counts.values()), len(counts)]
                    for term, tf in counts.items():
                        args += [term, tf]
                commands.append(INDEX_UPSERT.command(keys, args))
        if commands:
            await self._io.batch(commands)

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
        reply = await self._io.call(
            INDEX_SEARCH,
            self._keys.index(user_id),
            [repr(BM25_K1), repr(BM25_B), limit, " ".join(sorted(set(kinds))), *terms],
        )
        return [
            SearchHit(
                doc_id=reply[i].decode(),
                kind=_KIND_OF_LETTER[reply[i + 1]],
                score=float(reply[i + 2]),
            )
            for i in range(0, len(reply), 3)
        ]

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
        for _ in range(_PURGE_ATTEMPTS):
            ids = [raw.decode() for raw in await self._io.execute("HKEYS", keys[0])]
            if not ids:
                await self._io.execute("DEL", *keys)
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
