"""The recall index's upsert script against its version at 437cd81 (issue #8: fewer
instructions per script on redis-server). Same arguments, random sequences of upserts
(several documents per call sharing terms, replaced and expired documents, every kind,
collection) and removals on the real test Redis: every reply and every key of the user's
index must match what the former script gives, byte for byte.

What changed, and why it may not change an outcome: ``add_many`` gathers each posting
list's numbers and values per kind letter, keyed by the term, where it keyed them by
``letter .. term`` and took that key apart again per list (two ``string.sub`` and a
concatenation per list, a concatenation per posting). The lists, their order of first
appearance and the bytes appended to each are the same. The former ``add_many`` and its
comment are kept below verbatim; put back into today's script they give the script Redis
ran at 437cd81 (its SHA1 is checked, so the copy cannot drift).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import pytest
import redis

from tests.integration._redis_private import private_db
from tests.integration.test_s11_redis_index_upsert_equivalence import index_state
from tiermem.longterm.index_redis_scripts import INDEX_REMOVE, INDEX_UPSERT
from tiermem.store.backends.redis_scripts import LuaScript

_OLD_ADD_MANY = (
    "-- Index the documents `docs` under new numbers, in order: each {doc_id, kind, length,\n"
    "-- expires_at or false, where its terms start in ARGV, how many, its terms space-separated,\n"
    "-- their packed values (u64 `length * 2^20 + tf` each, in term order, built by the\n"
    "-- client)}, given the statistics as they are now: `top` (the last number given), `n`\n"
    "-- and `len`. What `add` does for one, batched: the numbers follow `top`, a list that\n"
    "-- several of the documents share gets their postings in one APPEND (numbers ascending),\n"
    "-- and each hash, the statistics included, is written in one command. Why the client\n"
    "-- packs the values and joins the terms: per term, `tonumber` + `struct.pack` and a table\n"
    "-- per list cost Redis more than the APPENDs themselves (measured: ~1/3 of the script's\n"
    "-- time, bench/redis_commandstats.py).\n"
    "local function add_many(docs, top, n, len)\n"
    "  if #docs == 0 then return end\n"
    "  local num = top\n"
    "  local nacc, vacc, order = {}, {}, {}\n"
    "  local dfields, tfields, ifields, zargs, total = {}, {}, {}, {}, 0\n"
    "  for _, d in ipairs(docs) do\n"
    "    num = num + 1\n"
    "    local id, kind, len = d[1], d[2], d[3]\n"
    "    local k = string.sub(kind, 1, 1)\n"
    "    local packed = struct.pack('<I4', num)\n"
    "    local from, values = d[5], d[8]\n"
    "    for j = 0, d[6] - 1 do\n"
    "      local key = k .. ARGV[from + j]\n"
    "      local value = string.sub(values, 8 * j + 1, 8 * j + 8)\n"
    "      local held = nacc[key]\n"
    "      if held then\n"
    "        nacc[key] = held .. packed\n"
    "        vacc[key] = vacc[key] .. value\n"
    "      else\n"
    "        nacc[key] = packed\n"
    "        vacc[key] = value\n"
    "        order[#order + 1] = key\n"
    "      end\n"
    "    end\n"
    "    local number = string.format('%d', num)\n"
    "    dfields[#dfields + 1] = id\n"
    "    dfields[#dfields + 1] = kind .. '|' .. string.format('%d', len) .. '|' .. number\n"
    "    tfields[#tfields + 1] = id\n"
    "    tfields[#tfields + 1] = d[7]\n"
    "    ifields[#ifields + 1] = number\n"
    "    ifields[#ifields + 1] = k .. id\n"
    "    if d[4] then\n"
    "      zargs[#zargs + 1] = d[4]\n"
    "      zargs[#zargs + 1] = id\n"
    "    end\n"
    "    total = total + len\n"
    "  end\n"
    "  for _, key in ipairs(order) do\n"
    "    local prefix, term = base .. string.sub(key, 1, 1), string.sub(key, 2)\n"
    "    redis.call('APPEND', prefix .. ':n=' .. term, nacc[key])\n"
    "    redis.call('APPEND', prefix .. ':v=' .. term, vacc[key])\n"
    "  end\n"
    "  chunked('HSET', KEYS[1], dfields)\n"
    "  chunked('HSET', KEYS[2], tfields)\n"
    "  chunked('HSET', IDS, ifields)\n"
    "  if #zargs > 0 then chunked('ZADD', KEYS[4], zargs) end\n"
    "  redis.call('HSET', KEYS[3], 'next', string.format('%d', num), 'n',\n"
    "             string.format('%d', n + #docs), 'len', string.format('%d', len + total))\n"
    "end\n"
    "\n"
)

_START = "-- Index the documents `docs` under new numbers"
_END = "-- A user with no document keeps no statistics"


_NUMBER_READS = (
    ("local now = ARGV[1] + 0", "local now = tonumber(ARGV[1])"),
    (
        "local n, exp = ARGV[i + 4] + 0, ARGV[i + 3]",
        "local n, exp = tonumber(ARGV[i + 4]), ARGV[i + 3]",
    ),
    ("if exp == '' or exp + 0 > now then", "if exp == '' or tonumber(exp) > now then"),
    ("ARGV[i + 1], ARGV[i + 2] + 0,", "ARGV[i + 1], tonumber(ARGV[i + 2]),"),
    ("local top = (stats[1] or '0') + 0", "local top = tonumber(stats[1] or '0')"),
    (
        "add_many(docs, top, (stats[2] or '0') - removed, (stats[3] or '0') - total)",
        "add_many(docs, top, tonumber(stats[2] or '0') - removed, "
        "tonumber(stats[3] or '0') - total)",
    ),
    ("collect(ARGV[1], ARGV[2] + 0)", "collect(ARGV[1], tonumber(ARGV[2]))"),
)
"""Today's number reads (``s + 0``, since session 24) and the ``tonumber`` calls they
replaced: the same values, parsed once instead of twice."""


def _former_upsert() -> str:
    source = INDEX_UPSERT.source
    for today, former in _NUMBER_READS:
        assert source.count(today) == 1, today
        source = source.replace(today, former)
    start, end = source.index(_START), source.index(_END)
    return source[:start] + _OLD_ADD_MANY + source[end:]


_OLD_UPSERT_SHA = "b7d40a0f31ebdce33e10a3bca236222f77b61651"
"""``INDEX_UPSERT.sha`` at 437cd81."""

SECOND_US = 1_000_000
SHIFT = 1 << 20
# Terms that a Lua table or pattern could mistake for something else, CJK, and plain ones.
VOCABULARY = ["w0", "w1", "w2", "w3", "12", "1", "n", "v", "__index", "ルは", "東京", "tw1"]
KINDS = ["memory", "turn", "chunk"]

PRIVATE_DB = 10
"""The test server's logical database these tests keep their keys in (comparing states
SCANs the keyspace; database 9 is test_s11's)."""


def test_the_former_script_is_the_one_redis_ran() -> None:
    assert LuaScript("index_upsert", _former_upsert()).sha == _OLD_UPSERT_SHA
    assert INDEX_UPSERT.sha != _OLD_UPSERT_SHA


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    with private_db(PRIVATE_DB) as client:
        yield client


class Pair:
    """One user's index under two prefixes: the former script writes one, the new the other
    (removals and collection run today's scripts on both)."""

    def __init__(self, admin: redis.Redis, rng: random.Random) -> None:
        self.admin, self.rng = admin, rng
        tag = f"{rng.getrandbits(48):x}"
        self.prefix = {side: f"s17{side}{tag}:{{u=x}}:" for side in ("old", "new")}
        self.keys = {
            side: [f"{p}ix2:{k}" for k in ("docs", "terms", "stats", "exp")]
            for side, p in self.prefix.items()
        }
        self.old_sha = admin.script_load(_former_upsert())
        for script in (INDEX_UPSERT, INDEX_REMOVE):
            admin.script_load(script.source)
        self.now = 1_800_000_000 * SECOND_US
        self.ids = [f"d{i}" for i in range(16)]

    def run(self, sha: dict[str, str], args: list[str | bytes | int]) -> None:
        replies = []
        for side in ("old", "new"):
            keys = self.keys[side]
            try:
                replies.append(self.admin.evalsha(sha[side], len(keys), *keys, *args))
            except redis.ResponseError as error:  # the same error, the same state
                replies.append(("error", str(error).split(" script: ")[0]))
        assert replies[0] == replies[1], (args, replies)
        assert self._state("old") == self._state("new"), args

    def _state(self, side: str) -> dict[str, object]:
        return index_state(self.admin, self.prefix[side])

    def upsert(self) -> None:
        rng = self.rng
        args: list[str | bytes | int] = [
            str(self.now),
            str(rng.choice((0, 1, 3, 50))),
            f"tok{rng.getrandbits(32):x}",
        ]
        # Several documents per call, drawing from a few terms: lists shared in one call.
        shared = rng.sample(VOCABULARY, rng.randint(1, len(VOCABULARY)))
        for doc_id in rng.sample(self.ids, rng.randint(1, 8)):
            expires = rng.choice(("", "", str(self.now + rng.randint(-5, 40) * SECOND_US)))
            live = expires == "" or int(expires) > self.now
            terms = rng.sample(shared, rng.randint(1, len(shared))) if live else []
            tfs = [rng.randint(1, 3) for _ in terms]
            length = sum(tfs)
            values = struct.pack(f"<{len(tfs)}Q", *[length * SHIFT + tf for tf in tfs])
            args += [doc_id, rng.choice(KINDS), str(length), expires, str(len(terms)),
                     " ".join(terms), values, *terms]  # fmt: skip
        self.run({"old": self.old_sha, "new": INDEX_UPSERT.sha}, args)

    def remove(self) -> None:
        args = self.rng.sample(self.ids, self.rng.randint(1, 4))
        self.run({"old": INDEX_REMOVE.sha, "new": INDEX_REMOVE.sha}, list(args))

    def close(self) -> None:
        for side in ("old", "new"):
            prefix = self.prefix[side].replace("{", "\\{").replace("}", "\\}")
            for key in self.admin.scan_iter(match=f"{prefix}*"):
                self.admin.delete(key)


@pytest.mark.parametrize("seed", range(8))
def test_random_sequences_give_the_same_replies_and_keys(admin: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(admin, rng)
    try:
        for _ in range(150):
            pair.now += rng.choice((0, 1, 3, 10)) * SECOND_US
            pair.upsert() if rng.random() < 0.85 else pair.remove()
    finally:
        pair.close()
