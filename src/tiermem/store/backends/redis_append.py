"""The append scripts of the Redis backend: a hot append, a durable append, and both in one
(:data:`APPEND_THROUGH`, behind :meth:`RedisHotStore.append_through
<tiermem.store.backends.redis_hot.RedisHotStore.append_through>`).

They share their Lua: the hot session's functions address its keys through ``HK`` and the
durable session's through ``DK``, which each script binds first (a hot script to its
``KEYS``, a durable one to its ``KEYS``, the combined one to both halves of its eight keys,
which all carry the session's hash tag, so it runs on one cluster slot). Key layout and
round trips: :mod:`tiermem.store.backends.redis`.

Every append carries an optional entity change (``n removed`` kinds, then ``n upserts``
kind/json pairs), applied in the same script: to the hot ``ent`` hash, and merged into the
durable ``entities`` record (decoded and encoded with Redis's bundled ``cjson``; version
+ 1, framed as ``put_record`` frames it). A durable append that is recognised as a retry --
by the caller's idempotency key, or by the write id the store gives every call -- writes
nothing at all, entity change included; it only rewrites the session's lifetime field
with its own value, a write that changes nothing but is replicated, so that a ``WAIT``
sent after the retry confirms the first arrival on the replicas too (see "Replication
and WAIT" in :mod:`tiermem.store.backends.redis`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_core import PydanticSerializationError

from tiermem.models import NewTurn
from tiermem.models.turns import TURN_SCHEMA_VERSION
from tiermem.store.backends.redis_scripts import LuaScript, turn_template
from tiermem.store.contract import ENTITIES_RECORD, MAX_TURN_BYTES

__all__ = [
    "APPEND_THROUGH",
    "ARCHIVE_APPEND",
    "DURABLE_PRELUDE",
    "HORIZON_PRELUDE",
    "HOT_APPEND",
    "HOT_APPEND_KEEP_EXPIRED",
    "HOT_PRELUDE",
    "RECENT_WRITES",
    "RECORD_PRELUDE",
    "TTL_SLACK",
    "bind_durable",
    "bind_hot",
    "turn_templates",
]

RECENT_WRITES = 8
"""How many write ids of recent durable appends a session remembers (a blind retry of a
call arrives right after it, so a short list suffices)."""

_INDEX_TAIL_BYTES = len(',"index":0}') - len("}")
"""What the index field adds to a turn's JSON over its :class:`NewTurn` JSON."""


def turn_templates(turns: Sequence[NewTurn]) -> list[str]:
    """:func:`~tiermem.store.backends.redis_scripts.turn_template` of each turn: the same
    strings and the same errors, at about half the CPU for a plain :class:`NewTurn`.

    A ``NewTurn``'s JSON is its ``Turn``'s JSON without the closing index field (same
    fields, same order, ``index`` last), so its template is the ``NewTurn`` JSON without
    its closing brace: no indexed copy of the turn is built. Any other turn (a ``Turn``
    passed as a ``NewTurn``, another schema version), a turn that cannot be serialized
    and one over the size limit go through ``turn_template``, which raises the usual
    error with the usual message.
    """
    templates = []
    for turn in turns:
        if type(turn) is NewTurn and turn.schema_version == TURN_SCHEMA_VERSION:
            try:
                payload = turn.model_dump_json()
                size = len(payload.encode())
            except (PydanticSerializationError, UnicodeEncodeError):
                payload, size = "", MAX_TURN_BYTES  # turn_template raises the usual error
            if size + _INDEX_TAIL_BYTES <= MAX_TURN_BYTES:
                templates.append(payload[:-1])
                continue
        templates.append(turn_template(turn))
    return templates


bind_hot = "local HK = KEYS\n"
bind_durable = "local DK = KEYS\n"
_BIND_BOTH = (
    "local DK = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}\n"
    "local HK = {KEYS[5], KEYS[6], KEYS[7], KEYS[8]}\n"
)

TTL_SLACK = 8
"""A native TTL is set 1/TTL_SLACK longer than the logical lifetime + grace needs, and not
re-set while the deadline the keys have covers that need without exceeding it by more
than the slack (``native_ttl`` below): a session written every few seconds re-sets its
TTLs about once per eighth of its lifetime instead of on every write. Measured on the
combined append: its eight ``PEXPIRE`` cost ~6.5 µs of redis-server CPU a turn; this
saves ~2.6 µs of them where a third of the turns change an entity (whose hash and
record still get one each)."""

_NATIVE_TTL_LUA = """
local function native_ttl(deadline, now, ttl)
  -- Keys whose native deadline is `deadline` (us by the store's clock, false if unknown)
  -- must outlive `ttl` ms from `now`. Answers nil when they already do and not by more
  -- than the slack (1/@SLACK@ of ttl), else the TTL (ms) to set and the new deadline (us).
  local need = now + ttl * 1000
  if deadline then
    local d = deadline + 0
    if d >= need and d <= need + ttl * 1000 / @SLACK@ then return nil end
  end
  local set = ttl + math.floor(ttl / @SLACK@)
  return set, now + set * 1000
end
local function ms_left(deadline, now)
  -- What is left of a deadline (us) in whole ms, at least 1: the TTL that gives a key
  -- created now the deadline its group already has.
  local left = math.ceil((tonumber(deadline) - now) / 1000)
  if left < 1 then left = 1 end
  return string.format('%d', left)
end
""".replace("@SLACK@", str(TTL_SLACK))

_RECENT_WRITES_LUA = """
local function with_write(recent, wid, first, count)
  -- A list of recent write ids (' id:a:b ...') once this write is added: its id
  -- first, then up to @RECENT@ - 1 older ones (one pattern match keeps them, where a
  -- loop over every entry cost a C call each).
  local entry = ' ' .. wid .. ':' .. string.format('%d:%d', first, count)
  if not recent then return entry end
  return entry .. (string.match(recent, '@KEEP@') or recent)
end
""".replace("@RECENT@", str(RECENT_WRITES)).replace(
    "@KEEP@", "^(" + " [^ ]+" * (RECENT_WRITES - 1) + ")"
)

_HOT_STATUS_LUA = """
-- HK: 1 meta, 2 turns, 3 entities, 4 state (one hot session, one hash tag)
local function hot_live(now)
  local x = redis.call('HGET', HK[1], 'x')
  return x ~= false and tonumber(x) > now
end
local function hot_version(live)
  -- The version, and whether the part markers are current (see hot_commit).
  if not live then return 0, false end
  local m = redis.call('HMGET', HK[1], 'v', 'c')
  return tonumber(m[1] or '0'), m[2] ~= false and m[2] == m[1]
end
local function hot_deadline(live)
  -- The native deadline of a live session's keys (meta 'd'), false when unknown.
  return live and redis.call('HGET', HK[1], 'd')
end
"""

_HOT_WRITE_LUA = """
local function hot_begin(live, epoch)
  -- The write goes ahead: an expired, not yet collected session is dropped first, so the
  -- write starts afresh, under a new epoch (readers' caches key on epoch and version).
  -- (A refused write leaves it, readable with include_expired.)
  if not live then
    redis.call('DEL', HK[1], HK[2], HK[3], HK[4])
    redis.call('HSET', HK[1], 'e', epoch)
  end
end
local function hot_read(now)
  -- One read for an append: live?, version, next index, epoch, recent write ids, native
  -- deadline of the session's keys, whether the part markers are current.
  local m = redis.call('HMGET', HK[1], 'x', 'v', 'n', 'e', 'w', 'd', 'c')
  if m[1] == false or m[1] + 0 <= now then
    return false, 0, 0, '', false, false, false
  end
  return true, (m[2] or '0') + 0, (m[3] or '0') + 0, m[4] or '', m[5], m[6],
         m[7] ~= false and m[7] == m[2]
end
local function hot_commit(version, entities, state, expires, ttl, next_index, now, deadline,
                          fresh, fresh2, extra)
  -- Version, expiry and next index; the native TTL of the four keys is re-set only when
  -- native_ttl says so (meta 'd' keeps the deadline they were given), else only the keys
  -- this write may have created (HK indexes `fresh`, `fresh2`, or nil) get the deadline
  -- the others have. `extra` (or nil): more meta field/value pairs, written by the same
  -- HSET (a redis.call saved).
  -- Part markers, for readers that cache the session: 'ev' and 'sv' are the versions at
  -- which the entities and the state hash last changed (`entities`, `state`: this write
  -- changed them, or the markers were not current), 'c' the version of the last write
  -- that kept them. A write by a script that predates them moves 'v' alone, so while
  -- 'c' differs from 'v' the markers say nothing, and the next write sets both afresh.
  local set, until_us = native_ttl(deadline, now, ttl + 0)
  local v = string.format('%d', version)
  local f = extra or {}
  f[#f + 1] = 'v'
  f[#f + 1] = v
  f[#f + 1] = 'x'
  f[#f + 1] = expires
  f[#f + 1] = 'c'
  f[#f + 1] = v
  if next_index then
    f[#f + 1] = 'n'
    f[#f + 1] = string.format('%d', next_index)
  end
  if entities then
    f[#f + 1] = 'ev'
    f[#f + 1] = v
  end
  if state then
    f[#f + 1] = 'sv'
    f[#f + 1] = v
  end
  if set then
    f[#f + 1] = 'd'
    f[#f + 1] = string.format('%d', until_us)
    redis.call('HSET', HK[1], unpack(f))
    local ms = string.format('%d', set)
    for i = 1, 4 do redis.call('PEXPIRE', HK[i], ms) end
    return
  end
  redis.call('HSET', HK[1], unpack(f))
  if fresh or fresh2 then
    local left = ms_left(deadline, now)
    if fresh then redis.call('PEXPIRE', HK[fresh], left) end
    if fresh2 then redis.call('PEXPIRE', HK[fresh2], left) end
  end
end
local function hot_entities(at, removed, upserts)
  -- ARGV[at ..]: `removed` kinds to delete, then `upserts` kind/json pairs to set.
  -- Answers whether this may have created the hash: not when its first upsert replaced a
  -- field (the hash was there, and removals all come before it) or when nothing is set.
  for i = at, at + removed - 1 do redis.call('HDEL', HK[3], ARGV[i]) end
  local from, created = at + removed, false
  for i = from, from + 2 * upserts - 1, 2 do
    local added = redis.call('HSET', HK[3], ARGV[i], ARGV[i + 1])
    if i == from then created = added == 1 end
  end
  return created
end
local function hot_push(turns, window)
  -- Answers whether the list was created by this push (it has no native TTL yet). A
  -- list still within the window is not trimmed (most sessions are shorter than it).
  local length = redis.call('RPUSH', HK[2], unpack(turns))
  if length > window then redis.call('LTRIM', HK[2], -window, -1) end
  return length == #turns
end
local function fresh_keys(created_turns, created_entities)
  -- HK indexes an append may have created: the turns list, the entities hash (or nil).
  return created_turns and 2 or nil, created_entities and 3 or nil
end
"""

HOT_PRELUDE = _RECENT_WRITES_LUA + _NATIVE_TTL_LUA + _HOT_STATUS_LUA + _HOT_WRITE_LUA
"""What a hot script may use (bound to ``HK``)."""

HORIZON_PRELUDE = """
-- Native TTL of a group of keys that share one logical lifetime: they live until the
-- latest expiry of anything in them (field 'h' of the group's meta hash, 'inf' once
-- anything is kept forever) plus the grace period. A script calls extend_horizon after
-- creating its keys: PEXPIRE does nothing to a key that does not exist yet.
local function later_horizon(meta, expires)
  -- The horizon once data kept until expires ('' = forever) is added.
  local h = redis.call('HGET', meta, 'h')
  if h == 'inf' or expires == '' then return 'inf' end
  if h and tonumber(h) > tonumber(expires) then return h end
  return expires
end
local function extend_horizon(meta, keys, now, grace, expires)
  -- Every key gets the exact TTL; field 't' records the deadline they were given, which
  -- an append reads to skip its own PEXPIREs (see native_ttl).
  local h = redis.call('HGET', meta, 'h')
  if h == 'inf' then return end
  h = later_horizon(meta, expires)
  if h == 'inf' then
    redis.call('HSET', meta, 'h', h)
    for _, key in ipairs(keys) do redis.call('PERSIST', key) end
    return
  end
  local ttl = math.ceil((tonumber(h) - now) / 1000) + grace
  if ttl < 1 then ttl = 1 end
  redis.call('HSET', meta, 'h', h, 't', string.format('%d', now + ttl * 1000))
  for _, key in ipairs(keys) do redis.call('PEXPIRE', key, string.format('%d', ttl)) end
end
"""

_SESSION_LUA = """
-- DK: 1 archive, 2 records, 3 dmeta, 4 idem (one durable session, one hash tag).
-- The session's lifetime is its horizon: it lives while 'h' is 'inf' or after now.
local function session_live(now)
  local h = redis.call('HGET', DK[3], 'h')
  return h == 'inf' or (h ~= false and tonumber(h) > now)
end
local function session_extend(now, grace, expires)
  extend_horizon(DK[3], DK, now, grace, expires)
end
"""

_SESSION_BEGIN_LUA = """
local function session_begin(live)
  -- The write goes ahead on a session whose lifetime has passed (or that never was):
  -- what is left of its last life is dropped first, so nothing of it reappears (records,
  -- idempotency keys and write ids, owner; its turns had all expired). The 'u=' notes of
  -- users whose lists name the session stay, for delete_session.
  if not live then
    redis.call('DEL', DK[1], DK[2], DK[4])
    redis.call('HDEL', DK[3], 'h', 'o', 'c', 'w', 't')
  end
end
"""

_ARCHIVE_LUA = """
local function seen_append(key, wid, recent)
  -- first index and count of an earlier append of this live session with the same
  -- idempotency key or write id (`recent`: the header's 'w'), or nil.
  if key ~= '' then
    local seen = redis.call('HGET', DK[4], key)
    if seen then
      local first, count = string.match(seen, '^(%d+)|(%d+)$')
      return tonumber(first), tonumber(count)
    end
  end
  if wid ~= '' and recent and string.find(recent, ' ' .. wid .. ':', 1, true) then
    -- write ids are hex: no pattern magic characters. (The plain find first: the usual
    -- answer, not seen, without an unanchored pattern search, ~14k instructions.)
    local first, count = string.match(recent, ' ' .. wid .. ':(%d+):(%d+)')
    if first then return tonumber(first), tonumber(count) end
  end
  return nil
end
local function record_entities(now_arg, lifetime, at, removed, upserts)
  -- Merge an entity change into the entities record (kind -> ActiveEntity object),
  -- framed as record_put frames it: 'version|lifetime_us|updated_us|data json'. Answers
  -- whether the records hash may be new (no entities record was there).
  local raw = redis.call('HGET', DK[2], '@ENTITIES@')
  local version, data = 0, {}
  if raw then
    local v, payload = string.match(raw, '^(%d+)|[^|]*|[^|]*|(.*)$')
    version, data = tonumber(v), cjson.decode(payload)
  end
  for i = at, at + removed - 1 do data[ARGV[i]] = nil end
  local from = at + removed
  for i = from, from + 2 * upserts - 1, 2 do data[ARGV[i]] = cjson.decode(ARGV[i + 1]) end
  if lifetime == 'inf' then lifetime = '' end
  local encoded = '{}'
  if next(data) ~= nil then encoded = cjson.encode(data) end
  redis.call('HSET', DK[2], '@ENTITIES@', string.format('%d', version + 1) .. '|' .. lifetime
             .. '|' .. now_arg .. '|' .. encoded)
  return not raw
end
local function archive_append(now_arg, now, grace, expires, first, key, wid, ent_at,
                              removed, upserts, tpl_at)
  -- Archive the turn templates ARGV[tpl_at ..] (`now`: now_arg as a number, which the
  -- caller has parsed); answers 'ok', start, turn jsons or 'repeat', first, count (an
  -- earlier append with this key or write id: nothing written) or 'index', next index
  -- (first is not it: nothing written). Each number is parsed once: a tonumber of a
  -- timestamp costs redis-server ~2k instructions.
  local header = redis.call('HMGET', DK[3], 'h', 'w', 't')
  local h, recent, deadline = header[1], header[2], header[3]
  local h_us = h and h ~= 'inf' and h + 0
  local live = h == 'inf' or (h_us and h_us > now)
  if live then
    local seen_first, seen_count = seen_append(key, wid, recent)
    if seen_first then
      -- Rewrite the lifetime unchanged: no data changes, but the write is replicated, so
      -- a WAIT after this answer confirms everything written before it on this master,
      -- the first arrival of this append included (a retry re-confirms replication).
      redis.call('HSET', DK[3], 'h', h)
      return 'repeat', seen_first, seen_count
    end
  end
  local start = 0
  if live then start = redis.call('LLEN', DK[1]) end
  if first ~= '' and first + 0 ~= start then return 'index', start end
  if not live then
    session_begin(false)
    h, recent, deadline = false, false, false
  end
  local turns, framed = {}, {}
  for i = tpl_at, #ARGV do
    local turn = ARGV[i] .. ',"index":' .. string.format('%d', start + i - tpl_at) .. '}'
    turns[#turns + 1] = turn
    framed[#framed + 1] = expires .. '|' .. turn
  end
  redis.call('RPUSH', DK[1], unpack(framed))
  if key ~= '' then redis.call('HSET', DK[4], key, string.format('%d|%d', start, #turns)) end
  -- The lifetime (horizon) rises to this write's expiry, never falls, and every key's
  -- native TTL follows it (as extend_horizon does, within native_ttl's slack), with one
  -- write of the header.
  local horizon = h
  if h ~= 'inf' then
    if expires == '' then horizon = 'inf'
    elseif not h or expires + 0 > h_us then horizon = expires end
  end
  local records_new = false
  if removed + upserts > 0 then
    records_new = record_entities(now_arg, horizon, ent_at, removed, upserts)
  end
  local set, until_us
  if horizon ~= 'inf' then
    local ttl = math.ceil((horizon - now) / 1000) + grace
    if ttl < 1 then ttl = 1 end
    set, until_us = native_ttl(deadline, now, ttl)
  end
  if set then
    local t = string.format('%d', until_us)
    if wid ~= '' then
      redis.call('HSET', DK[3], 'h', horizon, 'w', with_write(recent, wid, start, #turns),
                 't', t)
    else
      redis.call('HSET', DK[3], 'h', horizon, 't', t)
    end
  elseif wid ~= '' then
    redis.call('HSET', DK[3], 'h', horizon, 'w', with_write(recent, wid, start, #turns))
  elseif horizon ~= h then
    redis.call('HSET', DK[3], 'h', horizon)
  end
  if horizon == 'inf' then
    if h ~= 'inf' then for _, k in ipairs(DK) do redis.call('PERSIST', k) end end
  elseif set then
    local ms = string.format('%d', set)
    for _, k in ipairs(DK) do redis.call('PEXPIRE', k, ms) end
  elseif start == 0 or records_new or key ~= '' then
    -- The keys this append may have created get the deadline the others have: the
    -- archive (empty before it), the records hash (no entities record before it), the
    -- idempotency keys. (A key that was there has that deadline already.)
    local left = ms_left(deadline, now)
    if start == 0 then redis.call('PEXPIRE', DK[1], left) end
    if records_new then redis.call('PEXPIRE', DK[2], left) end
    if key ~= '' then redis.call('PEXPIRE', DK[4], left) end
  end
  return 'ok', start, turns
end
""".replace("@ENTITIES@", ENTITIES_RECORD)

DURABLE_PRELUDE = (
    HORIZON_PRELUDE
    + _RECENT_WRITES_LUA
    + _NATIVE_TTL_LUA
    + _SESSION_LUA
    + _SESSION_BEGIN_LUA
    + _ARCHIVE_LUA
)
"""What a durable script may use (bound to ``DK``)."""

RECORD_PRELUDE = _SESSION_BEGIN_LUA
"""What ``record_put`` uses (bound to ``DK``): ``session_begin`` alone (it reads the
header once itself, where ``session_live``, ``later_horizon`` and ``extend_horizon`` read
it four times)."""

_HOT_APPEND_BODY = """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 window, 5 expected_version|'', 6 first_index|'',
--       7 metadata json|'', 8 write id (also the epoch if it starts afresh), 9 n removed,
--       10 n upserts, then removed kinds, then entity kind/json pairs, then turn templates.
-- Answers 'ok', version, start, 1 if it started the session afresh else 0, epoch. The
-- last few write ids are kept in meta 'w' (' id:version:start ...'), so a resend of a
-- call that was applied is answered as the first time and appends nothing.
local now = ARGV[1] + 0
local live, version, start, epoch, recent, deadline, marked = hot_read(now)
if recent and string.find(recent, ' ' .. ARGV[8] .. ':', 1, true) then
  -- A resend of this very call (its write id is ARGV[8], hex): answer as the first time.
  -- (The plain find first, as seen_append does: the usual answer is no.)
  local v, s = string.match(recent, ' ' .. ARGV[8] .. ':(%d+):(%d+)')
  if v then return {'ok', tonumber(v), tonumber(s), v == '1' and 1 or 0, epoch} end
end
if ARGV[5] ~= '' and ARGV[5] + 0 ~= version then return {'conflict', version} end
if ARGV[6] ~= '' then
  local first = ARGV[6] + 0
  if live and first ~= start then return {'index', start} end
  start = first
end
if not live then
  hot_begin(false, ARGV[8])
  epoch = ARGV[8]
end
local removed, upserts = ARGV[9] + 0, ARGV[10] + 0
local tpl_at = 11 + removed + 2 * upserts
local turns = {}
for i = tpl_at, #ARGV do
  turns[#turns + 1] = ARGV[i] .. ',"index":' .. string.format('%d', start + i - tpl_at) .. '}'
end
local created = hot_push(turns, ARGV[4] + 0)
-- The recent write ids and the metadata go in hot_commit's HSET.
local meta = {'w', with_write(live and recent, ARGV[8], version + 1, start)}
if ARGV[7] ~= '' then
  meta[3] = 'm'
  meta[4] = ARGV[7]
end
local fresh, fresh2 = fresh_keys(created, hot_entities(11, removed, upserts))
hot_commit(version + 1, not marked or removed + upserts > 0, not marked, ARGV[2], ARGV[3],
           start + #turns, now, live and deadline, fresh, fresh2, meta)
return {'ok', version + 1, start, live and 0 or 1, epoch}
"""

HOT_APPEND = LuaScript("hot_append", bind_hot + HOT_PRELUDE + _HOT_APPEND_BODY)

HOT_APPEND_KEEP_EXPIRED = LuaScript(
    "hot_append_keep_expired",
    bind_hot
    # ARGV: 1 the store's gc grace (us), then hot_append's. The rest of the script reads
    # a local ARGV without it, declared before the prelude so that its functions read it.
    # Copied in a loop: unpack returns at most ~8,000 values (a large entity change).
    + "local grace = tonumber(ARGV[1])\nlocal ARGV = (function(a)\n"
    + "  local t = {}\n  for i = 2, #a do t[i - 1] = a[i] end\n  return t\nend)(ARGV)\n"
    + HOT_PRELUDE
    + """
-- HotStore.append_turns(keep_expired=True): an expired session still held (as hot_load
-- with a grace sees it: now < expires + grace) is not started afresh. Answers 'expired',
-- its version (nothing written), or as hot_append.
do
  local m = redis.call('HMGET', HK[1], 'x', 'v')
  local x, now = tonumber(m[1]), tonumber(ARGV[1])
  if x and x <= now and x > now - grace then return {'expired', m[2] or '0'} end
end
"""
    + _HOT_APPEND_BODY,
)
"""``HOT_APPEND`` with ``keep_expired`` (a script of its own: ``HOT_APPEND``'s text and
argument layout stay as they were)."""

ARCHIVE_APPEND = LuaScript(
    "archive_append",
    bind_durable
    + DURABLE_PRELUDE
    + """
-- ARGV: 1 now, 2 grace_ms, 3 expires_us|'', 4 first_index|'', 5 idempotency key|'',
--       6 write id|'', 7 n removed, 8 n upserts, then removed kinds, then entity
--       kind/json pairs, then turn templates.
-- Answers 'ok', start | 'index', next index | 'repeat', then the frames the first
-- append stored, as they are now.
local removed, upserts = ARGV[7] + 0, ARGV[8] + 0
local tag, start, count = archive_append(ARGV[1], ARGV[1] + 0, ARGV[2] + 0,
                                         ARGV[3], ARGV[4], ARGV[5], ARGV[6], 9, removed,
                                         upserts, 9 + removed + 2 * upserts)
if tag == 'repeat' then
  local out = {'repeat'}
  for _, raw in ipairs(redis.call('LRANGE', DK[1], start, start + count - 1)) do
    out[#out + 1] = raw
  end
  return out
end
return {tag, start}
""",
)

APPEND_THROUGH = LuaScript(
    "append_through",
    _BIND_BOTH
    + _RECENT_WRITES_LUA
    + _NATIVE_TTL_LUA
    + _SESSION_BEGIN_LUA
    + _ARCHIVE_LUA
    + _HOT_WRITE_LUA
    + """
-- KEYS: 1-4 the durable session (archive, records, dmeta, idem), 5-8 the hot session
-- (meta, turns, entities, state): one session id, one hash tag.
-- ARGV: 1 now, 2 durable grace_ms, 3 durable expires_us|'', 4 first_index|'',
--       5 idempotency key|'', 6 write id, 7 hot expires_us, 8 hot ttl_ms, 9 window,
--       10 epoch, 11 n removed, 12 n upserts, then removed kinds, then entity kind/json
--       pairs, then turn templates.
-- The durable append, then the same turns and entity change on the hot session when it
-- is live at the archive's start index (appended) or absent or expired (started afresh
-- at that index: version 1). The hot half is skipped ('skip') after a recognised retry,
-- or when the live hot session's next index is not the archive's start (it lost a write).
-- Answers 'index', next index (nothing written), or: durable tag ('ok' | 'repeat'),
-- start, count, hot tag ('ok' | 'skip'), hot version, 1 if the hot session started
-- afresh, epoch, then (a repeat only) the archive frames the first append stored.
local removed, upserts, now = ARGV[11] + 0, ARGV[12] + 0, ARGV[1] + 0
local tag, start, turns = archive_append(ARGV[1], now, ARGV[2] + 0, ARGV[3], ARGV[4],
                                         ARGV[5], ARGV[6], 13, removed, upserts,
                                         13 + removed + 2 * upserts)
if tag == 'index' then return {'index', start} end
if tag == 'repeat' then
  local out = {'repeat', start, turns, 'skip', 0, 0, ''}
  for _, raw in ipairs(redis.call('LRANGE', DK[1], start, start + turns - 1)) do
    out[#out + 1] = raw
  end
  return out
end
local live, version, held, epoch, _, deadline, marked = hot_read(now)
if live and held ~= start then return {'ok', start, #turns, 'skip', version, 0, ''} end
if not live then
  hot_begin(false, ARGV[10])
  epoch = ARGV[10]
end
local created = hot_push(turns, ARGV[9] + 0)
local ent_created = hot_entities(13, removed, upserts)
hot_commit(version + 1, not marked or removed + upserts > 0, not marked, ARGV[7], ARGV[8],
           start + #turns, now, live and deadline, fresh_keys(created, ent_created))
return {'ok', start, #turns, 'ok', version + 1, live and 0 or 1, epoch}
""",
)
