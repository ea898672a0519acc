"""The hot load script against its version at 07fccef (issue #8: redis-server's
instructions per ``history()``).

What changed, and why it may not change an outcome: ``hot_load``'s first ``HMGET`` reads
the four fields every answer needs ('v', 'n', 'x', 'e'); the metadata (meta field 'm',
often the largest) and the part markers ('c', 'ev', 'sv') are read by a second ``HMGET``
only on the branch whose answer carries them, where the first read all eight on every
call, the usual answer (the caller's copy is current: four small fields) included. The
script is read-only, so when a field is read does not change what it is.

How it is checked: random hot sessions written field by field on the real test Redis
(every meta field present or absent, 'c' equal to 'v' or not, markers set or not, turns,
entities and state of random sizes, expired or not), each loaded by both scripts with
random caller copies (epoch, version, next index and markers each the session's or not,
with and without the grace): every reply must be equal. The former script is kept below
verbatim (its SHA1 is checked, so the copy cannot drift).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis

from tests.integration._redis_private import private_db
from tiermem.store.backends.redis_hot import HOT_LOAD
from tiermem.store.backends.redis_scripts import LuaScript

_FORMER_HOT_LOAD = """
-- KEYS: meta, turns, entities, state. ARGV: 1 now, 2 grace_us to include an expired session
-- until it is collected (now < expires + grace), or '', 3 epoch the caller has cached|'',
-- 4 its version, 5 its next index, 6 its entities marker|'', 7 its state marker|''.
-- Read-only.
-- Answers false (absent), or version, next index, expires, epoch -- and nothing more when
-- the caller's copy is current -- then metadata, the index of the first turn held, the
-- index of the first turn sent (the caller holds those before it when its epoch is the
-- session's), the turns from there, entities and state (flat field/value lists; false
-- when the caller's marker for the part is the session's: it holds them), and the
-- entities and state markers ('' when the session's say nothing: see hot_commit).
local visible_after = tonumber(ARGV[1])
if ARGV[2] ~= '' then visible_after = visible_after - tonumber(ARGV[2]) end
local m = redis.call('HMGET', KEYS[1], 'v', 'n', 'x', 'm', 'e', 'c', 'ev', 'sv')
if not m[3] or tonumber(m[3]) <= visible_after then return false end
local version, next_index, epoch = m[1] or '0', m[2] or '0', m[5] or ''
local same_epoch = ARGV[3] ~= '' and ARGV[3] == epoch
if same_epoch and ARGV[4] == version then return {version, next_index, m[3], epoch} end
local n = tonumber(next_index)
local first = n - redis.call('LLEN', KEYS[2])
local from = first
if same_epoch then
  local have = tonumber(ARGV[5])
  if have >= first and have <= n then from = have end
end
local entities_mark, state_mark = '', ''
if m[1] and m[6] == m[1] then entities_mark, state_mark = m[7] or '', m[8] or '' end
local entities, state = false, false
if not (same_epoch and entities_mark ~= '' and ARGV[6] == entities_mark) then
  entities = redis.call('HGETALL', KEYS[3])
end
if not (same_epoch and state_mark ~= '' and ARGV[7] == state_mark) then
  state = redis.call('HGETALL', KEYS[4])
end
return {version, next_index, m[3], epoch, m[4] or '', first, from,
        redis.call('LRANGE', KEYS[2], from - first, -1), entities, state, entities_mark,
        state_mark}
"""
_FORMER_SHA = "207101de0286545fb5c9fcfc942e6b7056f46b26"
"""``HOT_LOAD.sha`` at 07fccef."""

PRIVATE_DB = 12
"""The test server's logical database these tests keep their keys in."""
NOW = 1_800_000_000_000_000
GRACE = 60_000_000


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    with private_db(PRIVATE_DB) as client:
        yield client


def test_the_former_script_is_the_one_of_07fccef() -> None:
    assert LuaScript("hot_load", _FORMER_HOT_LOAD).sha == _FORMER_SHA
    assert HOT_LOAD.sha != _FORMER_SHA


def write_session(admin: redis.Redis, keys: list[str], rng: random.Random) -> dict[str, str]:
    """A random hot session under ``keys``; answers its meta fields."""
    admin.delete(*keys)
    version = rng.randint(1, 40)
    length = rng.randint(0, 6)
    next_index = length + rng.randint(0, 30)
    meta = {
        "v": str(version),
        "n": str(next_index),
        "x": str(NOW + rng.choice((-2 * GRACE, -GRACE // 2, -1, 0, 1, GRACE))),
        "m": '{"user_id":"u","attributes":{"k":"' + "m" * rng.randint(0, 400) + '"}}',
        "e": f"ep{rng.randint(0, 2)}",
        "c": str(version if rng.random() < 0.7 else version - 1),
        "ev": str(rng.randint(1, version)),
        "sv": str(rng.randint(1, version)),
        "w": " w1:1:0",
        "d": str(NOW + GRACE),
    }
    for field in list(meta):
        if rng.random() < 0.12:  # any field may be missing (an older writer, a bad state)
            del meta[field]
    if meta:
        admin.hset(keys[0], mapping=meta)
    if length:
        admin.rpush(keys[1], *[f'{{"index":{next_index - length + i}}}' for i in range(length)])
    for key, prefix in ((keys[2], "kind"), (keys[3], "state")):
        fields = {f"{prefix}{i}": f"{i}|{rng.random()}" for i in range(rng.randint(0, 3))}
        if fields:
            admin.hset(key, mapping=fields)
    return meta


def caller_args(meta: dict[str, str], rng: random.Random) -> list[str]:
    """A caller's copy: each part the session's, another, or none."""

    def pick(field: str, other: str) -> str:
        return rng.choice((meta.get(field, other), other, ""))

    args = [str(NOW), rng.choice(("", str(GRACE)))]
    epoch = pick("e", "ep9")
    if epoch == "":
        return [*args, "", "0", "0", "", ""]
    have = str(rng.randint(-2, int(meta.get("n", "0")) + 2))
    return [*args, epoch, pick("v", "99"), have, pick("ev", "98"), pick("sv", "97")]


@pytest.mark.parametrize("seed", range(6))
def test_random_sessions_and_copies_get_the_same_replies(admin: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    former = admin.script_load(_FORMER_HOT_LOAD)
    admin.script_load(HOT_LOAD.source)
    keys = [f"s18hl{seed}:{{s=x}}:{part}" for part in ("meta", "turns", "ent", "state")]
    answered = set()
    try:
        for _ in range(150):
            meta = write_session(admin, keys, rng)
            for _ in range(6):
                args = caller_args(meta, rng)
                old = admin.evalsha(former, 4, *keys, *args)
                new = admin.evalsha(HOT_LOAD.sha, 4, *keys, *args)
                assert old == new, (meta, args)
                answered.add(0 if old is None else len(old))
    finally:
        admin.delete(*keys)
    assert answered == {0, 4, 12}  # absent, current, sent whole: every branch ran
