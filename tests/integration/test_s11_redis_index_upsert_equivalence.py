"""The recall index's upsert script against its version at 34e61b4 (issue #8: fewer
commands per script on redis-server). Same arguments, random sequences of upserts (new,
replaced and expired documents, collection) and removals on the real test Redis: every
reply and every key of the user's index must match what the former scripts give.

What changed, and why it may not change an outcome: ``index_upsert`` reads the user's
statistics with one ``HMGET`` (``next``, ``n``, ``len``, ``epoch``) and writes them with one
``HSET`` (absolute values: the script is atomic, so nothing else changed them meanwhile)
where it ran ``HGET``, ``HSETNX`` and three ``HINCRBY``; it sets the epoch only when the
user has none (what ``HSETNX`` did); and it skips ``tidy`` when it indexed documents (they
have not expired, so the collection after them cannot leave the user empty). The former
scripts are kept below verbatim (their SHA1 is checked, so the copy cannot drift).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import pytest
import redis

from tests.integration._redis_private import private_db
from tiermem.longterm.index_redis_scripts import INDEX_REMOVE, INDEX_UPSERT
from tiermem.store.backends.redis_scripts import LuaScript

_OLD_PRELUDE = """
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
-- many were in this layout. One HMGET finds them, and each hash is cleaned in one command.
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
  return removed
end

-- Fail, before any write, when `adds` more numbers would not fit in a u32 (struct.pack
-- would wrap them: lists out of order, numbers naming two documents).
local function check_numbers(adds)
  local top = tonumber(redis.call('HGET', KEYS[3], 'next') or '0')
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
-- client)}. What `add` does for one, batched: one HINCRBY gives every number, a list that
-- several of the documents share gets their postings in one APPEND (numbers ascending),
-- and each hash is written in one command. Why the client packs the values and joins the
-- terms: per term, `tonumber` + `struct.pack` and a table per list cost Redis more than
-- the APPENDs themselves (measured: ~1/3 of the script's time, bench/redis_commandstats.py).
local function add_many(docs)
  if #docs == 0 then return end
  local num = redis.call('HINCRBY', KEYS[3], 'next', #docs) - #docs
  local nacc, vacc, order = {}, {}, {}
  local dfields, tfields, ifields, zargs, total = {}, {}, {}, {}, 0
  for _, d in ipairs(docs) do
    num = num + 1
    local id, kind, len = d[1], d[2], d[3]
    local k = string.sub(kind, 1, 1)
    local packed = struct.pack('<I4', num)
    local from, values = d[5], d[8]
    for j = 0, d[6] - 1 do
      local key = k .. ARGV[from + j]
      local value = string.sub(values, 8 * j + 1, 8 * j + 8)
      local held = nacc[key]
      if held then
        nacc[key] = held .. packed
        vacc[key] = vacc[key] .. value
      else
        nacc[key] = packed
        vacc[key] = value
        order[#order + 1] = key
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
  for _, key in ipairs(order) do
    local prefix, term = base .. string.sub(key, 1, 1), string.sub(key, 2)
    redis.call('APPEND', prefix .. ':n=' .. term, nacc[key])
    redis.call('APPEND', prefix .. ':v=' .. term, vacc[key])
  end
  chunked('HSET', KEYS[1], dfields)
  chunked('HSET', KEYS[2], tfields)
  chunked('HSET', IDS, ifields)
  if #zargs > 0 then chunked('ZADD', KEYS[4], zargs) end
  redis.call('HINCRBY', KEYS[3], 'n', #docs)
  redis.call('HINCRBY', KEYS[3], 'len', total)
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

_OLD_UPSERT_BODY = """
-- ARGV: 1 now, 2 how many expired documents to collect, 3 an epoch token (kept if the user
-- has one); then per document (each id once): doc_id, kind, length, expires_at us ('' never),
-- number of terms n, the terms space-separated, their values packed (n u64 little-endian,
-- `length * 2^20 + tf`), then the n terms. A document whose expiry has passed only drops
-- its old version.
local now = tonumber(ARGV[1])
local ids, docs, i, last = {}, {}, 4, #ARGV
while i <= last do
  local n, exp = tonumber(ARGV[i + 4]), ARGV[i + 3]
  ids[#ids + 1] = ARGV[i]
  if exp == '' or tonumber(exp) > now then
    docs[#docs + 1] = {ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), exp ~= '' and exp, i + 7, n,
                       ARGV[i + 5], ARGV[i + 6]}
  end
  i = i + 7 + n
end
check_numbers(#docs)
redis.call('HSETNX', KEYS[3], 'epoch', ARGV[3])
unindex(ids)
add_many(docs)
collect(ARGV[1], tonumber(ARGV[2]))
tidy()
return 'ok'
"""

_OLD_REMOVE_BODY = """
-- ARGV: doc ids. Answers how many were indexed (in this layout).
local removed = unindex(ARGV)
tidy()
return removed
"""

OLD = {
    "index_upsert": _OLD_PRELUDE + _OLD_UPSERT_BODY,
    "index_remove": _OLD_PRELUDE + _OLD_REMOVE_BODY,
}
NEW = {"index_upsert": INDEX_UPSERT, "index_remove": INDEX_REMOVE}
_OLD_SHAS = {
    "index_upsert": "f77a6c4a6cede13d86ebd508381c00e58f42acee",
    "index_remove": "efb1dc0ccf6c91aaf5789f14e98c3434004173cc",
}

SECOND_US = 1_000_000
SHIFT = 1 << 20
VOCABULARY = [f"w{i}" for i in range(14)]
KINDS = ["memory", "turn", "chunk"]
MAX_NUMBER = 2**32 - 1


def test_the_former_scripts_are_the_ones_redis_ran() -> None:
    for name, source in OLD.items():
        assert LuaScript(name, source).sha == _OLD_SHAS[name], name
    assert NEW["index_upsert"].sha != _OLD_SHAS["index_upsert"]


PRIVATE_DB = 9
"""The test server's logical database these tests keep their keys in: comparing states
SCANs the keyspace, and database 0 holds every other test's keys (the SCAN of a late test
in the suite walked them all, 200 times per seed: 50-100 s a seed)."""


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    with private_db(PRIVATE_DB) as client:
        yield client


def index_state(admin: redis.Redis, prefix: str) -> dict[str, object]:
    """Every key under ``prefix`` (named without it) and its value: strings, hashes and
    sorted sets, as the index keeps them; two pipelined round trips (types, then values)
    instead of two per key. Shared with test_s17_redis_index_upsert_equivalence."""
    match = f"{prefix}*".replace("{", "\\{").replace("}", "\\}")
    keys = list(admin.scan_iter(match=match, count=1000))
    types = admin.pipeline(transaction=False)
    for key in keys:
        types.type(key)
    reads = admin.pipeline(transaction=False)
    for key, kind in zip(keys, types.execute(), strict=True):
        if kind == b"string":
            reads.get(key)
        elif kind == b"hash":
            reads.hgetall(key)
        elif kind == b"zset":
            reads.zrange(key, 0, -1, withscores=True)
        else:  # pragma: no cover - the index keeps no other type
            raise AssertionError(f"unexpected {kind!r} key {key!r}")
    names = [key.decode()[len(prefix) :] for key in keys]
    return dict(zip(names, reads.execute(), strict=True))


class Pair:
    """One user's index under two prefixes: the former scripts write one, the new the other."""

    def __init__(self, admin: redis.Redis, rng: random.Random) -> None:
        self.admin, self.rng = admin, rng
        tag = f"{rng.getrandbits(48):x}"
        self.prefix = {side: f"eq{side}{tag}:{{u=x}}:" for side in ("old", "new")}
        self.keys = {
            side: [f"{p}ix2:{k}" for k in ("docs", "terms", "stats", "exp")]
            for side, p in self.prefix.items()
        }
        self.old_sha = {name: admin.script_load(source) for name, source in OLD.items()}
        for script in NEW.values():
            admin.script_load(script.source)
        self.now = 1_800_000_000 * SECOND_US
        self.ids = [f"d{i}" for i in range(12)]

    def run(self, name: str, args: list[str | bytes | int]) -> None:
        replies = []
        for side in ("old", "new"):
            keys = self.keys[side]
            sha = self.old_sha[name] if side == "old" else NEW[name].sha
            try:
                replies.append(self.admin.evalsha(sha, len(keys), *keys, *args))
            except redis.ResponseError as error:  # the same error, the same state
                replies.append(("error", str(error).split(" script: ")[0]))
        assert replies[0] == replies[1], (name, args, replies)
        self.compare()

    def _state(self, side: str) -> dict[str, object]:
        return index_state(self.admin, self.prefix[side])

    def compare(self) -> None:
        old, new = self._state("old"), self._state("new")
        assert old == new

    def upsert(self) -> None:
        rng = self.rng
        args: list[str | bytes | int] = [
            str(self.now),
            str(rng.choice((0, 1, 3, 50))),
            f"tok{rng.getrandbits(32):x}",
        ]
        for doc_id in rng.sample(self.ids, rng.randint(1, 5)):
            expires = rng.choice(("", "", str(self.now + rng.randint(-5, 40) * SECOND_US)))
            live = expires == "" or int(expires) > self.now
            terms = rng.sample(VOCABULARY, rng.randint(1, 6)) if live else []
            tfs = [rng.randint(1, 3) for _ in terms]
            length = sum(tfs)
            values = struct.pack(f"<{len(tfs)}Q", *[length * SHIFT + tf for tf in tfs])
            args += [doc_id, rng.choice(KINDS), str(length), expires, str(len(terms)),
                     " ".join(terms), values, *terms]  # fmt: skip
        self.run("index_upsert", args)

    def remove(self) -> None:
        self.run("index_remove", self.rng.sample(self.ids, self.rng.randint(1, 4)))

    def close(self) -> None:
        for side in ("old", "new"):
            prefix = self.prefix[side].replace("{", "\\{").replace("}", "\\}")
            for key in self.admin.scan_iter(match=f"{prefix}*"):
                self.admin.delete(key)


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_give_the_same_replies_and_keys(admin: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(admin, rng)
    try:
        for _ in range(200):
            pair.now += rng.choice((0, 1, 3, 10)) * SECOND_US
            pair.upsert() if rng.random() < 0.8 else pair.remove()
    finally:
        pair.close()


def test_numbers_used_up_fail_alike_before_any_write(admin: redis.Redis) -> None:
    rng = random.Random(7)
    pair = Pair(admin, rng)
    try:
        pair.upsert()
        for side in ("old", "new"):
            admin.hset(pair.keys[side][2], "next", str(MAX_NUMBER - 1))
        for _ in range(5):
            pair.now += SECOND_US
            pair.upsert()  # one document fits, more fail alike
    finally:
        pair.close()


def test_a_user_without_statistics_or_epoch_gets_them_alike(admin: redis.Redis) -> None:
    """A user emptied, then written again; and statistics that lost their epoch (written
    by an older version): the epoch is set only when absent, as HSETNX did."""
    rng = random.Random(11)
    pair = Pair(admin, rng)
    try:
        pair.upsert()
        pair.run("index_remove", pair.ids)
        pair.upsert()
        for side in ("old", "new"):
            admin.hdel(pair.keys[side][2], "epoch")
        pair.upsert()
        pair.run("index_upsert", [str(pair.now), "0", "tokx", "d1", "turn", "0",
                                  str(pair.now - 1), "0", "", b""])  # fmt: skip
    finally:
        pair.close()
