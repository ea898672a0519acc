"""The Lua scripts of :class:`~tiermem.longterm.index_redis.RedisIndex` (key layout and
design in :mod:`tiermem.longterm.index_redis`).

Per-user scripts declare the user's ``ix2:docs``, ``ix2:terms``, ``ix2:stats`` and
``ix2:exp`` keys (one hash tag) and reach the rest by name under the same tag: the
document-number table ``ix2:ids`` (number → kind letter + doc_id), the packed posting
strings ``ix2:<k>:n=<term>`` (u32 document numbers, ascending) and ``ix2:<k>:v=<term>``
(u64 ``length * 2^20 + tf``; 0: a removed document's tombstone, counted per list in
``ix2:dead``), and the former layout's ``ix:`` keys, which every write keeps consistent (a
document written or removed here is dropped there too) until :data:`INDEX_MIGRATE` has
moved the user. :data:`INDEX_READ` and :data:`INDEX_DROP_EMPTY` are passed every key
they touch after those four (the client builds the same names), so a cluster routes them
by all of their keys; the write scripts cannot be (see the design limits in
:mod:`tiermem.longterm.index_redis`). The ``ixdue`` scripts touch one shard each.
``now`` always comes from the index's injected clock, never the server's.
"""

from __future__ import annotations

from tiermem.store.backends.redis_scripts import LuaScript

__all__ = [
    "INDEX_COLLECT",
    "INDEX_DROP_EMPTY",
    "INDEX_DUE_MARK",
    "INDEX_DUE_POP",
    "INDEX_DUE_READ",
    "INDEX_MIGRATE",
    "INDEX_READ",
    "INDEX_REMOVE",
    "INDEX_UPSERT",
]

_PRELUDE = """
-- KEYS: 1 docs (doc_id -> 'kind|length|number'), 2 terms (doc_id -> 'term term ...'),
-- 3 stats (n, len, next: the last number given, epoch), 4 exp (doc_id -> expires_at us).
local base = string.sub(KEYS[1], 1, -5)
local IDS = base .. 'ids'
local DEAD = base .. 'dead'
local SHIFT = 1048576
-- Document numbers are packed as u32: the last one a user may be given.
local MAX_NUMBER = 4294967295
-- The former layout (ix:, hashes of decimal postings), kept consistent until migrated.
local old = string.sub(base, 1, -5) .. 'ix:'
local OLD_DOCS, OLD_TERMS, OLD_STATS, OLD_EXP =
  old .. 'docs', old .. 'terms', old .. 'stats', old .. 'exp'
local legacy = redis.call('EXISTS', OLD_DOCS) == 1

-- Drop a document from the former layout; answers {kind, length, expires_at or false,
-- {term, tf, ...}}, or nil when it is not there.
local function legacy_drop(id)
  local meta = redis.call('HGET', OLD_DOCS, id)
  if not meta then return nil end
  local kind, len = string.match(meta, '^(%a+)|(%d+)$')
  local tfs = {}
  local terms = redis.call('HGET', OLD_TERMS, id)
  if terms then
    for term in string.gmatch(terms, '%S+') do
      local key = old .. string.sub(kind, 1, 1) .. ':t=' .. term
      local value = redis.call('HGET', key, id)
      if value then
        tfs[#tfs + 1] = term
        tfs[#tfs + 1] = tonumber(value) % SHIFT
        redis.call('HDEL', key, id)
      end
    end
  end
  local exp = redis.call('ZSCORE', OLD_EXP, id)
  redis.call('HDEL', OLD_DOCS, id)
  redis.call('HDEL', OLD_TERMS, id)
  redis.call('ZREM', OLD_EXP, id)
  local n = redis.call('HINCRBY', OLD_STATS, 'n', -1)
  redis.call('HINCRBY', OLD_STATS, 'len', -tonumber(len))
  if n <= 0 then
    redis.call('DEL', OLD_STATS, OLD_DOCS, OLD_TERMS, OLD_EXP)
    legacy = false
  end
  return {kind, tonumber(len), exp, tfs}
end

-- Rewrite one packed list without its tombstones (values of 8 zero bytes: a live value is
-- at least 2^20, and a run of zeros at another offset is skipped by the alignment check).
local ZERO8 = string.rep(string.char(0), 8)
local function compact(nk, vk, N, field)
  local V = redis.call('GET', vk)
  local np, vp, from, at = {}, {}, 0, 1
  while true do
    local p = string.find(V, ZERO8, at, true)
    if not p then break end
    if (p - 1) % 8 == 0 then
      local i = (p - 1) / 8
      if i > from then
        np[#np + 1] = string.sub(N, 4 * from + 1, 4 * i)
        vp[#vp + 1] = string.sub(V, 8 * from + 1, 8 * i)
      end
      from = i + 1
      at = p + 8
    else
      at = p + 1
    end
  end
  if from < #N / 4 then
    np[#np + 1] = string.sub(N, 4 * from + 1)
    vp[#vp + 1] = string.sub(V, 8 * from + 1)
  end
  redis.call('SET', nk, table.concat(np))
  redis.call('SET', vk, table.concat(vp))
  redis.call('HDEL', DEAD, field)
end

-- Where `num` sits in the numbers string `nk` of `count` entries (0-based), or nil. Reads
-- windows of 256 numbers (1 KB) with GETRANGE, never the whole list (GET of a common term's
-- list into Lua costs ~20 us): the first guesses interpolate (numbers are spread fairly
-- evenly over 1..`top`), then halve, so a search ends in O(log(count / 256)) reads; one on
-- average in the benchmark.
local WINDOW = 256
local function locate(nk, count, num, top)
  local lo, hi, vlo, vhi = 0, count - 1, 0, top + 1
  local round = 0
  while lo <= hi do
    round = round + 1
    local wlo, whi
    if hi - lo < WINDOW then
      wlo, whi = lo, hi
    else
      local guess
      if round <= 2 then
        guess = lo + math.floor((num - vlo) / (vhi - vlo) * (hi - lo + 1))
      else
        guess = math.floor((lo + hi) / 2)
      end
      wlo = math.max(lo, math.min(guess - WINDOW / 2, hi - WINDOW + 1))
      whi = wlo + WINDOW - 1
    end
    local win = redis.call('GETRANGE', nk, 4 * wlo, 4 * whi + 3)
    local first = struct.unpack('<I4', win, 1)
    local last = struct.unpack('<I4', win, #win - 3)
    if num < first then
      hi, vhi = wlo - 1, first
    elseif num > last then
      lo, vlo = whi + 1, last
    else
      local packed, at = struct.pack('<I4', num), 1
      while true do
        local p = string.find(win, packed, at, true)
        if not p then return nil end
        if (p - 1) % 4 == 0 then return wlo + (p - 1) / 4 end
        at = p + 1
      end
    end
  end
  return nil
end

-- Remove the numbers `nums` from one packed list: each found by `locate` (numbers stay
-- ascending) and its value overwritten with zeros in place; the list is rewritten once a
-- quarter of it is dead (amortised O(1) per removal) and deleted once all of it is.
local function cut(kind, term, nums, top)
  local nk, vk = base .. kind .. ':n=' .. term, base .. kind .. ':v=' .. term
  local count = redis.call('STRLEN', nk) / 4
  if count == 0 then return end
  local hits = 0
  for _, num in ipairs(nums) do
    local at = locate(nk, count, num, top)
    if at then
      redis.call('SETRANGE', vk, 8 * at, ZERO8)
      hits = hits + 1
    end
  end
  if hits == 0 then return end
  local field = kind .. ':' .. term
  local dead = redis.call('HINCRBY', DEAD, field, hits)
  if dead >= count then
    redis.call('DEL', nk, vk)
    redis.call('HDEL', DEAD, field)
  elseif dead * 4 > count then
    compact(nk, vk, redis.call('GET', nk), field)
  end
end

-- Call redis.call(cmd, key, <a chunk of values>) for `values` in chunks (unpack's limit).
local CHUNK = 500
local function chunked(cmd, key, values)
  for from = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, from, math.min(from + CHUNK - 1, #values)))
  end
end

-- Remove documents (from both layouts); each posting list is rewritten once. Answers how
-- many were in this layout, and their total length. One HMGET finds them, and each hash
-- is cleaned in one command.
local function unindex(ids)
  local lists, order, removed = {}, {}, 0
  local seen, dropped, numbers, total = {}, {}, {}, 0
  for from = 1, #ids, CHUNK do
    local chunk = {unpack(ids, from, math.min(from + CHUNK - 1, #ids))}
    local metas = redis.call('HMGET', KEYS[1], unpack(chunk))
    for j, id in ipairs(chunk) do
      if legacy then legacy_drop(id) end
      local meta = metas[j]
      if meta and not seen[id] then
        seen[id] = true
        local kind, len, num = string.match(meta, '^(%a)[^|]*|(%d+)|(%d+)$')
        num = tonumber(num)
        local terms = redis.call('HGET', KEYS[2], id)
        if terms then
          for term in string.gmatch(terms, '%S+') do
            local key = kind .. term
            local list = lists[key]
            if not list then
              list = {}
              lists[key] = list
              order[#order + 1] = key
            end
            list[#list + 1] = num
          end
        end
        dropped[#dropped + 1] = id
        numbers[#numbers + 1] = string.format('%d', num)
        total = total + tonumber(len)
        removed = removed + 1
      end
    end
  end
  if removed > 0 then
    chunked('HDEL', KEYS[1], dropped)
    chunked('HDEL', KEYS[2], dropped)
    chunked('HDEL', IDS, numbers)
    chunked('ZREM', KEYS[4], dropped)
    redis.call('HINCRBY', KEYS[3], 'n', -removed)
    redis.call('HINCRBY', KEYS[3], 'len', -total)
  end
  if #order > 0 then
    local top = tonumber(redis.call('HGET', KEYS[3], 'next') or '0')
    for _, key in ipairs(order) do
      cut(string.sub(key, 1, 1), string.sub(key, 2), lists[key], top)
    end
  end
  return removed, total
end

-- Fail, before any write, when `adds` more numbers would not fit in a u32 (struct.pack
-- would wrap them: lists out of order, numbers naming two documents). `top`: the user's
-- 'next' when the caller has read it, else nil.
local function check_numbers(adds, top)
  top = top or tonumber(redis.call('HGET', KEYS[3], 'next') or '0')
  if top + adds > MAX_NUMBER then
    error({err = 'tiermem index: the user has used up its document numbers (2^32 - 1); ' ..
      'purge_user and reindex the user to start them again'})
  end
end

-- Index a document under a new number; `tfs` is {term, tf, ...}, `exp` a string or false.
-- Numbers only grow, so appending keeps every posting list in ascending order.
local function add(id, kind, len, exp, tfs)
  local num = redis.call('HINCRBY', KEYS[3], 'next', 1)
  local k = string.sub(kind, 1, 1)
  local packed = struct.pack('<I4', num)
  local terms = {}
  for j = 1, #tfs, 2 do
    local term = tfs[j]
    redis.call('APPEND', base .. k .. ':n=' .. term, packed)
    redis.call('APPEND', base .. k .. ':v=' .. term, struct.pack('<I8', len * SHIFT + tfs[j + 1]))
    terms[#terms + 1] = term
  end
  local number = string.format('%d', num)
  redis.call('HSET', KEYS[1], id, kind .. '|' .. string.format('%d', len) .. '|' .. number)
  redis.call('HSET', KEYS[2], id, table.concat(terms, ' '))
  redis.call('HSET', IDS, number, k .. id)
  if exp then redis.call('ZADD', KEYS[4], exp, id) end
  redis.call('HINCRBY', KEYS[3], 'n', 1)
  redis.call('HINCRBY', KEYS[3], 'len', len)
end

-- Index the documents `docs` under new numbers, in order: each {doc_id, kind, length,
-- expires_at or false, where its terms start in ARGV, how many, its terms space-separated,
-- their packed values (u64 `length * 2^20 + tf` each, in term order, built by the
-- client)}, given the statistics as they are now: `top` (the last number given), `n`
-- and `len`. What `add` does for one, batched: the numbers follow `top`, a list that
-- several of the documents share gets their postings in one APPEND (numbers ascending),
-- and each hash, the statistics included, is written in one command. Why the client
-- packs the values and joins the terms: per term, `tonumber` + `struct.pack` and a table
-- per list cost Redis more than the APPENDs themselves (measured: ~1/3 of the script's
-- time, bench/redis_commandstats.py). The lists are gathered per kind letter, keyed by
-- the term itself: a key string built per posting (letter .. term) and taken apart again
-- per list cost redis-server ~12k instructions a turn (bench/redis_script_replay.py).
local function add_many(docs, top, n, len)
  if #docs == 0 then return end
  local num = top
  -- nacc[k][term], vacc[k][term]: the list's numbers and values so far; `order`: each
  -- list once, as kind letter, term (first seen first).
  local nacc, vacc, order = {}, {}, {}
  local dfields, tfields, ifields, zargs, total = {}, {}, {}, {}, 0
  for _, d in ipairs(docs) do
    num = num + 1
    local id, kind, len = d[1], d[2], d[3]
    local k = string.sub(kind, 1, 1)
    local packed = struct.pack('<I4', num)
    local from, values = d[5], d[8]
    local kn, kv = nacc[k], vacc[k]
    if not kn then
      kn, kv = {}, {}
      nacc[k], vacc[k] = kn, kv
    end
    for j = 0, d[6] - 1 do
      local term = ARGV[from + j]
      local held = kn[term]
      if held then
        kn[term] = held .. packed
        kv[term] = kv[term] .. string.sub(values, 8 * j + 1, 8 * j + 8)
      else
        kn[term] = packed
        kv[term] = string.sub(values, 8 * j + 1, 8 * j + 8)
        order[#order + 1] = k
        order[#order + 1] = term
      end
    end
    local number = string.format('%d', num)
    dfields[#dfields + 1] = id
    dfields[#dfields + 1] = kind .. '|' .. string.format('%d', len) .. '|' .. number
    tfields[#tfields + 1] = id
    tfields[#tfields + 1] = d[7]
    ifields[#ifields + 1] = number
    ifields[#ifields + 1] = k .. id
    if d[4] then
      zargs[#zargs + 1] = d[4]
      zargs[#zargs + 1] = id
    end
    total = total + len
  end
  for at = 1, #order, 2 do
    local k, term = order[at], order[at + 1]
    redis.call('APPEND', base .. k .. ':n=' .. term, nacc[k][term])
    redis.call('APPEND', base .. k .. ':v=' .. term, vacc[k][term])
  end
  chunked('HSET', KEYS[1], dfields)
  chunked('HSET', KEYS[2], tfields)
  chunked('HSET', IDS, ifields)
  if #zargs > 0 then chunked('ZADD', KEYS[4], zargs) end
  redis.call('HSET', KEYS[3], 'next', string.format('%d', num), 'n',
             string.format('%d', n + #docs), 'len', string.format('%d', len + total))
end

-- A user with no document keeps no statistics (numbers and epoch start again).
local function tidy()
  if tonumber(redis.call('HGET', KEYS[3], 'n') or '0') <= 0 then
    redis.call('DEL', KEYS[3])
  end
end

-- Drop up to `most` of the user's documents whose expiry is at or before `now`.
local function collect(now, most)
  if most <= 0 then return 0 end
  local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, most)
  unindex(due)
  return #due
end
"""

INDEX_UPSERT = LuaScript(
    "index_upsert",
    _PRELUDE
    + """
-- ARGV: 1 now, 2 how many expired documents to collect, 3 an epoch token (kept if the user
-- has one); then per document (each id once): doc_id, kind, length, expires_at us ('' never),
-- number of terms n, the terms space-separated, their values packed (n u64 little-endian,
-- `length * 2^20 + tf`), then the n terms. A document whose expiry has passed only drops
-- its old version.
local now = ARGV[1] + 0
local ids, docs, i, last = {}, {}, 4, #ARGV
while i <= last do
  local n, exp = ARGV[i + 4] + 0, ARGV[i + 3]
  ids[#ids + 1] = ARGV[i]
  if exp == '' or exp + 0 > now then
    docs[#docs + 1] = {ARGV[i], ARGV[i + 1], ARGV[i + 2] + 0, exp ~= '' and exp, i + 7, n,
                       ARGV[i + 5], ARGV[i + 6]}
  end
  i = i + 7 + n
end
-- The statistics are read once and written once (with the new documents' numbers), and
-- a user given documents here keeps them through the collection (they have not expired),
-- so it is not tidied: each command a script runs costs Redis ~5-10k instructions.
local stats = redis.call('HMGET', KEYS[3], 'next', 'n', 'len', 'epoch')
local top = (stats[1] or '0') + 0
check_numbers(#docs, top)
if not stats[4] then redis.call('HSET', KEYS[3], 'epoch', ARGV[3]) end
local removed, total = unindex(ids)
add_many(docs, top, (stats[2] or '0') - removed, (stats[3] or '0') - total)
collect(ARGV[1], ARGV[2] + 0)
if #docs == 0 then tidy() end
return 'ok'
""",
)

INDEX_REMOVE = LuaScript(
    "index_remove",
    _PRELUDE
    + """
-- ARGV: doc ids. Answers how many were indexed (in this layout).
local removed = unindex(ARGV)
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

INDEX_READ = LuaScript(
    "index_read",
    _PRELUDE
    + """
-- Read-only. ARGV: 1 now, 2 the asked kinds' letters (e.g. 'mt'), 3.. query terms.
-- Answers {n, len, epoch, whether the former layout holds documents (1/0), the numbers of
-- expired documents not yet collected (packed u32), then per term: df (over all kinds),
-- then per asked kind its numbers and values strings ('' when absent; a value of 0 is a
-- removed document's tombstone)}.
local stats = redis.call('HMGET', KEYS[3], 'n', 'len', 'epoch')
local out = {stats[1] or '0', stats[2] or '0', stats[3] or '', legacy and 1 or 0}
local expired = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1])) do
  local meta = redis.call('HGET', KEYS[1], id)
  if meta then
    expired[#expired + 1] = struct.pack('<I4', tonumber(string.match(meta, '|(%d+)$')))
  end
end
out[5] = table.concat(expired)
for t = 3, #ARGV do
  local term = ARGV[t]
  local df = 0
  for k in string.gmatch('mtc', '.') do
    df = df + redis.call('STRLEN', base .. k .. ':n=' .. term) / 4
  end
  for _, dead in ipairs(redis.call('HMGET', DEAD, 'm:' .. term, 't:' .. term, 'c:' .. term)) do
    if dead then df = df - tonumber(dead) end
  end
  out[#out + 1] = df
  for k in string.gmatch(ARGV[2], '.') do
    out[#out + 1] = redis.call('GET', base .. k .. ':n=' .. term) or ''
    out[#out + 1] = redis.call('GET', base .. k .. ':v=' .. term) or ''
  end
end
return out
""",
)

INDEX_MIGRATE = LuaScript(
    "index_migrate",
    _PRELUDE
    + """
-- ARGV: 1 now, 2 HSCAN cursor over the former docs hash, 3 how many per call, 4 an epoch
-- token. Moves a page of the user's documents from the former layout into this one
-- (expired ones are only dropped): a document still there was written there last, so it
-- replaces this layout's version. Answers {next cursor, whether documents remain there}.
local now = tonumber(ARGV[1])
local page = redis.call('HSCAN', OLD_DOCS, ARGV[2], 'COUNT', ARGV[3])
local fields = page[2]
check_numbers(#fields / 2)
redis.call('HSETNX', KEYS[3], 'epoch', ARGV[4])
for j = 1, #fields, 2 do
  local id = fields[j]
  local doc = legacy_drop(id)
  if doc then
    unindex({id})
    if not doc[3] or tonumber(doc[3]) > now then
      add(id, doc[1], doc[2], doc[3], doc[4])
    end
  end
end
tidy()
return {page[1], redis.call('EXISTS', OLD_DOCS)}
""",
)

INDEX_DROP_EMPTY = LuaScript(
    "index_drop_empty",
    _PRELUDE
    + """
-- The last step of a purge, atomic so that a concurrent upsert cannot lose its statistics
-- and number table under lists it already wrote: if the user has no document in either
-- layout, delete whatever is left of its index (answers 1); else change nothing (0).
if redis.call('EXISTS', KEYS[1]) == 1 or legacy then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], IDS, DEAD, OLD_TERMS, OLD_STATS, OLD_EXP)
return 1
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
