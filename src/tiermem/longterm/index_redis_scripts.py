"""The Lua scripts of :class:`~tiermem.longterm.index_redis.RedisIndex` (key layout and
design in :mod:`tiermem.longterm.index_redis`).

Search has no script: it reads the posting lists with plain commands in one pipeline and
scores them in the client (see :meth:`~tiermem.longterm.index_redis.RedisIndex.search`).
Per-user scripts declare the user's ``docs``, ``terms``, ``stats`` and ``exp`` keys (one hash
tag) and reach posting lists by name under the same tag; the ``ixdue`` scripts touch one
shard each. ``now`` always comes from the index's injected clock, never the server's.
"""

from __future__ import annotations

from tiermem.store.backends.redis_scripts import LuaScript

__all__ = [
    "INDEX_COLLECT",
    "INDEX_DUE_MARK",
    "INDEX_DUE_POP",
    "INDEX_DUE_READ",
    "INDEX_REMOVE",
    "INDEX_UPSERT",
]

_PRELUDE = """
-- KEYS: 1 docs (doc_id -> 'kind|length'), 2 terms (doc_id -> 'term term ...'),
-- 3 stats (n, len), 4 exp (doc_id -> expires_at us). A posting key is KEYS[1] minus
-- 'docs', plus '<k>:t=<term>', where <k> is the kind's first letter; a posting value is
-- length * 2^20 + tf.
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
  redis.call('ZREM', KEYS[4], id)
  redis.call('HINCRBY', KEYS[3], 'n', -1)
  redis.call('HINCRBY', KEYS[3], 'len', -tonumber(len))
  return 1
end
local function tidy()
  if tonumber(redis.call('HGET', KEYS[3], 'n') or '0') <= 0 then
    redis.call('DEL', KEYS[3])
  end
end
-- Drop up to `most` of the user's documents whose expiry is at or before `now`.
local function collect(now, most)
  if most <= 0 then return 0 end
  local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, most)
  for _, id in ipairs(due) do drop(id) end
  return #due
end
"""

INDEX_UPSERT = LuaScript(
    "index_upsert",
    _PRELUDE
    + """
-- ARGV: 1 now, 2 how many expired documents to collect; then per document: doc_id, kind,
-- length, expires_at us ('' never), number of terms, then term, tf pairs. A document whose
-- expiry has passed only drops its old version.
local now = tonumber(ARGV[1])
local i = 3
while i <= #ARGV do
  local id, kind, len, exp, n =
    ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], tonumber(ARGV[i + 4])
  drop(id)
  if exp == '' or tonumber(exp) > now then
    local prefix = base .. string.sub(kind, 1, 1) .. ':t='
    local terms = {}
    for j = 0, n - 1 do
      local term = ARGV[i + 5 + 2 * j]
      redis.call('HSET', prefix .. term, id,
                 string.format('%d', len * SHIFT + tonumber(ARGV[i + 6 + 2 * j])))
      terms[#terms + 1] = term
    end
    redis.call('HSET', KEYS[1], id, kind .. '|' .. ARGV[i + 2])
    redis.call('HSET', KEYS[2], id, table.concat(terms, ' '))
    if exp ~= '' then redis.call('ZADD', KEYS[4], exp, id) end
    redis.call('HINCRBY', KEYS[3], 'n', 1)
    redis.call('HINCRBY', KEYS[3], 'len', ARGV[i + 2])
  end
  i = i + 5 + 2 * n
end
collect(ARGV[1], tonumber(ARGV[2]))
tidy()
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

INDEX_COLLECT = LuaScript(
    "index_collect",
    _PRELUDE
    + """
-- ARGV: 1 now, 2 how many at most. Drops the user's expired documents, earliest first.
-- Answers {how many were dropped, the user's next expiry (us) or ''}.
local removed = collect(ARGV[1], tonumber(ARGV[2]))
tidy()
local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #first == 0 then return {removed, ''} end
return {removed, first[2]}
""",
)

INDEX_DUE_MARK = LuaScript(
    "index_due_mark",
    """
-- KEYS: 1 one ixdue shard. ARGV: 1 when (us), 2 user_id. Marks the user due at `when`
-- unless it is marked earlier already (ZADD LT, without needing Redis 6.2).
local at = redis.call('ZSCORE', KEYS[1], ARGV[2])
if at == false or tonumber(at) > tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
end
return 1
""",
)

INDEX_DUE_READ = LuaScript(
    "index_due_read",
    """
-- KEYS: 1 one ixdue shard. ARGV: 1 now (us), 2 how many. Read-only: the users due, earliest
-- first, as user_id, score pairs (a flat list, whatever the client's reply parsing).
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
""",
)

INDEX_DUE_POP = LuaScript(
    "index_due_pop",
    """
-- KEYS: 1 one ixdue shard. ARGV: 1 now (us), 2.. user ids. Unmarks those still due and
-- answers them: the caller collects them (another collector got the others).
local now, out = tonumber(ARGV[1]), {}
for i = 2, #ARGV do
  local at = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if at ~= false and tonumber(at) <= now then
    redis.call('ZREM', KEYS[1], ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
return out
""",
)
