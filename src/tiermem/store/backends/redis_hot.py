"""The hot tier on Redis: :class:`RedisHotStore`.

One session is four keys under one hash tag (meta, turns, entities, state); every operation
on it is one Lua script, so it is atomic and one round trip: a ``restore`` replaces all four
keys in one script, and ``copy_state`` compares and writes in one. The activity index is
sharded and lives in other slots: see "Activity index" in
:mod:`tiermem.store.backends.redis`, which also lists the round trips of each call.

The store also implements :class:`~tiermem.store.contract.CombinedAppend`: with a
:class:`~tiermem.store.backends.redis_durable.RedisDurableStore` on the same server and
prefix (a session's hot and durable keys share its hash tag), :meth:`RedisHotStore.
append_through` archives a turn and appends it to the hot session in one script. Reads
decode only what changed since the store last saw the session
(:mod:`~tiermem.store.backends.redis_snapshots`), and are sent the entities and the state
only when a write changed them since: every write script keeps part markers in the meta
hash (``hot_commit``), the load script compares them with the reader's. A write other
than an append (metadata, entities, state) leaves the store's copy where it was, so the
next read fetches only the part it changed.

The shared keyspace (blobs of no session, such as circuit breakers) is one string key per
name, ``<prefix>:shared:<escaped name>``, holding ``version|expires_us|updated_us|data
json`` (``expires_us`` empty: forever). A single key is one cluster slot, and no session
or activity key has that shape. Each call is one round trip: ``get_shared`` a GET (the
logical expiry is checked against the store's clock in Python), ``put_shared`` one script
(read, compare the version, SET with PX = the remaining logical time + gc_grace, or no
TTL when the blob has no expiry), ``delete_shared`` one script (GET + DEL, answering
whether a live blob was there). Nothing touches the activity index: shared blobs are not
sessions and are never handed off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from redis.exceptions import NoScriptError

from tiermem.clock import Clock
from tiermem.errors import ConflictError, ValidationError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionRecord,
    SessionSnapshot,
    StateBlob,
    Turn,
)
from tiermem.store.backends.redis_append import (
    APPEND_THROUGH,
    HOT_APPEND,
    HOT_APPEND_KEEP_EXPIRED,
    HOT_PRELUDE,
    bind_hot,
    turn_templates,
)
from tiermem.store.backends.redis_durable import RedisDurableStore, decode_record, live_turns
from tiermem.store.backends.redis_scripts import (
    BACKEND_NAME,
    Arg,
    Command,
    LuaScript,
    RedisClient,
    RedisKeys,
    RedisStoreBase,
    ReplicaWait,
    client_from_url,
    entity_args,
    from_us,
    new_write_id,
    optional_int,
    optional_us,
    redis_boundary,
    same_server,
    split_frame,
    to_us,
)
from tiermem.store.backends.redis_snapshots import SnapshotCache, decode_state
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_idempotency_key,
    check_kind,
    check_limit,
    check_restore,
    encode_data,
    encode_shared,
    encode_turn,
    held_expired,
)
from tiermem.store.contract import (
    DEFAULT_GC_GRACE,
    Capability,
    DurableStore,
    EntityChange,
    HotAppendResult,
)
from tiermem.store.keys import validate_id

__all__ = ["RedisHotStore"]

logger = logging.getLogger(__name__)

_CLAIM_ROUNDS = 8
"""claim_expired gives up after this many candidate rounds, even if it claimed fewer."""
_MARKS_KEPT = 65_536
"""Sessions whose last activity mark a store remembers (see ``_mark_due``)."""


# -- Lua (see the conventions in redis_scripts; the append script is in redis_append) ----

_HOT = bind_hot + HOT_PRELUDE

HOT_LOAD = LuaScript(
    "hot_load",
    """
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
local visible_after = ARGV[1] + 0
if ARGV[2] ~= '' then visible_after = visible_after - tonumber(ARGV[2]) end
-- The usual answer (the caller's copy is current) needs four fields: the metadata (often
-- the largest field: a string read into Lua costs redis-server by its size) and the part
-- markers are read only for the answer that sends them, ~9k instructions a load less.
local m = redis.call('HMGET', KEYS[1], 'v', 'n', 'x', 'e')
if not m[3] or m[3] + 0 <= visible_after then return false end
local version, next_index, epoch = m[1] or '0', m[2] or '0', m[4] or ''
local same_epoch = ARGV[3] ~= '' and ARGV[3] == epoch
if same_epoch and ARGV[4] == version then return {version, next_index, m[3], epoch} end
local n = tonumber(next_index)
local first = n - redis.call('LLEN', KEYS[2])
local from = first
if same_epoch then
  local have = tonumber(ARGV[5])
  if have >= first and have <= n then from = have end
end
local rest = redis.call('HMGET', KEYS[1], 'm', 'c', 'ev', 'sv')
local entities_mark, state_mark = '', ''
if m[1] and rest[2] == m[1] then entities_mark, state_mark = rest[3] or '', rest[4] or '' end
local entities, state = false, false
if not (same_epoch and entities_mark ~= '' and ARGV[6] == entities_mark) then
  entities = redis.call('HGETALL', KEYS[3])
end
if not (same_epoch and state_mark ~= '' and ARGV[7] == state_mark) then
  state = redis.call('HGETALL', KEYS[4])
end
return {version, next_index, m[3], epoch, rest[1] or '', first, from,
        redis.call('LRANGE', KEYS[2], from - first, -1), entities, state, entities_mark,
        state_mark}
""",
)

HOT_PUT_METADATA = LuaScript(
    "hot_put_metadata",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 expected_version|'', 5 metadata json, 6 epoch.
-- Answers 'ok', version, 1 if it started the session afresh else 0.
local live = hot_live(tonumber(ARGV[1]))
local version, marked = hot_version(live)
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= version then return {'conflict', version} end
local deadline = hot_deadline(live)
hot_begin(live, ARGV[6])
redis.call('HSET', KEYS[1], 'm', ARGV[5])
hot_commit(version + 1, not marked, not marked, ARGV[2], ARGV[3], nil, tonumber(ARGV[1]),
           deadline)
return {'ok', version + 1, live and 0 or 1}
""",
)

HOT_UPDATE_ENTITIES = LuaScript(
    "hot_update_entities",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 n removed, 5 n upserts, then removed kinds, then
-- kind/json pairs. Entities never start a session: an absent or expired one is left as
-- it is.
if not hot_live(tonumber(ARGV[1])) then return {'absent'} end
local version, marked = hot_version(true)
hot_entities(6, tonumber(ARGV[4]), tonumber(ARGV[5]))
hot_commit(version + 1, true, not marked, ARGV[2], ARGV[3], nil, tonumber(ARGV[1]),
           hot_deadline(true), 3)
return {'ok', version + 1}
""",
)

HOT_PUT_STATE = LuaScript(
    "hot_put_state",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 name, 5 expected_version|'', 6 updated_us, 7 data json,
-- 8 epoch. A state value is framed 'version|updated_us|json'. Answers 'ok', the blob's
-- version, 1 if it started the session afresh else 0.
local live = hot_live(tonumber(ARGV[1]))
local version, marked = hot_version(live)
local raw = live and redis.call('HGET', KEYS[4], ARGV[4])
local actual = 0
if raw then actual = tonumber(string.match(raw, '^(%d+)|')) end
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= actual then return {'conflict', actual} end
local deadline = hot_deadline(live)
hot_begin(live, ARGV[8])
redis.call('HSET', KEYS[4], ARGV[4],
           string.format('%d', actual + 1) .. '|' .. ARGV[6] .. '|' .. ARGV[7])
hot_commit(version + 1, not marked, true, ARGV[2], ARGV[3], nil, tonumber(ARGV[1]), deadline,
           4)
return {'ok', actual + 1, live and 0 or 1}
""",
)

HOT_RESTORE = LuaScript(
    "hot_restore",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 expected_version|'', 5 next_index, 6 metadata json,
--       7 n turns, 8 n entities, 9 epoch, then turn jsons (already indexed, the last
--       `window`), then entity kind/json pairs, then state name/'version|updated_us|json'
--       pairs.
-- Replaces the whole session, under a new epoch; state blobs keep the versions the
-- caller framed.
local live = hot_live(tonumber(ARGV[1]))
local version = hot_version(live)
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= version then return {'conflict', version} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local turns, entities = tonumber(ARGV[7]), tonumber(ARGV[8])
local first_entity = 10 + turns
local first_state = first_entity + 2 * entities
for i = 10, first_entity - 1 do redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = first_entity, first_state - 1, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
for i = first_state, #ARGV, 2 do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'n', ARGV[5], 'm', ARGV[6], 'e', ARGV[9])
hot_commit(version + 1, true, true, ARGV[2], ARGV[3], nil, tonumber(ARGV[1]), false)
return {'ok', version + 1}
""",
)

HOT_COPY_STATE = LuaScript(
    "hot_copy_state",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 name, 5 blob version, 6 framed blob
-- ('version|updated_us|json'). Writes unless the live session holds the blob at that
-- version or a newer one; an absent or expired session is left as it is.
if not hot_live(tonumber(ARGV[1])) then return {'absent'} end
local raw = redis.call('HGET', KEYS[4], ARGV[4])
if raw and tonumber(string.match(raw, '^(%d+)|')) >= tonumber(ARGV[5]) then
  return {'held'}
end
local version, marked = hot_version(true)
redis.call('HSET', KEYS[4], ARGV[4], ARGV[6])
hot_commit(version + 1, not marked, true, ARGV[2], ARGV[3], nil, tonumber(ARGV[1]),
           hot_deadline(true), 4)
return {'ok', version + 1}
""",
)

HOT_GET_STATE = LuaScript(
    "hot_get_state",
    """
-- KEYS: 1 meta, 2 state. ARGV: 1 now, 2 name. Read-only.
local x = redis.call('HGET', KEYS[1], 'x')
if not x or tonumber(x) <= tonumber(ARGV[1]) then return false end
return redis.call('HGET', KEYS[2], ARGV[2])
""",
)

HOT_TOUCH = LuaScript(
    "hot_touch",
    _HOT
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms. Moves the expiry; the version stays. An expired
-- session is left as it is, for handoff.
local now = tonumber(ARGV[1])
if not hot_live(now) then return {'absent'} end
local set, until_us = native_ttl(hot_deadline(true), now, tonumber(ARGV[3]))
if set then
  redis.call('HSET', KEYS[1], 'x', ARGV[2], 'd', string.format('%d', until_us))
  local ms = string.format('%d', set)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ms) end
else
  redis.call('HSET', KEYS[1], 'x', ARGV[2])
end
return {'ok'}
""",
)

# Activity index shard. KEYS: 1 zset (score = expires_us), 2 lease hash (sid ->
# 'until_us|owner'), 3 mark hash (sid -> token of the last write that marked it).
_LEASE_PRELUDE = """
local function leased(sid, now)
  local lease = redis.call('HGET', KEYS[2], sid)
  return lease and tonumber(string.match(lease, '^(%d+)|')) > now
end
"""

ACTIVITY_MARK = LuaScript(
    "activity_mark",
    """
-- ARGV: 1 sid, 2 expires_us, 3 token. A write marks its session active and clears any
-- lease; the previous entry is returned so a refused write can put it back.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1]) or ''
local lease = redis.call('HGET', KEYS[2], ARGV[1]) or ''
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
return {score, lease}
""",
)

ACTIVITY_RESTORE = LuaScript(
    "activity_restore",
    """
-- ARGV: 1 sid, 2 token, 3 previous score|'', 4 previous lease|''. Undo a mark, unless a
-- later write has marked the session since.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('ZREM', KEYS[1], ARGV[1])
else redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]) end
if ARGV[4] == '' then redis.call('HDEL', KEYS[2], ARGV[1])
else redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
""",
)

ACTIVITY_REMOVE = LuaScript(
    "activity_remove",
    """
-- ARGV: 1 sid.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
""",
)

ACTIVITY_CANDIDATES = LuaScript(
    "activity_candidates",
    _LEASE_PRELUDE
    + """
-- ARGV: 1 now, 2 how many. Read-only: due sessions without a running lease, oldest
-- first, as sid, score pairs.
local now, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, offset = {}, 0
while #out < 2 * want do
  local page = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES',
                          'LIMIT', offset, 256)
  if #page == 0 then break end
  for i = 1, #page, 2 do
    if not leased(page[i], now) then
      out[#out + 1] = page[i]
      out[#out + 1] = page[i + 1]
      if #out >= 2 * want then break end
    end
  end
  offset = offset + 256
end
return out
""",
)

ACTIVITY_CLAIM = LuaScript(
    "activity_claim",
    _LEASE_PRELUDE
    + """
-- ARGV: 1 now, 2 lease until_us, 3 owner, then (sid, score seen, session's real expires_us
-- or '' when its keys are gone) triples. An entry that moved since it was seen is skipped;
-- one whose session is in fact live was left behind by a lost index update: repair it.
local now = tonumber(ARGV[1])
local claimed = {}
for i = 4, #ARGV, 3 do
  local sid, seen, real = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local score = redis.call('ZSCORE', KEYS[1], sid)
  if score and tonumber(score) == tonumber(seen) then
    if real ~= '' and tonumber(real) > now then
      redis.call('ZADD', KEYS[1], real, sid)
      redis.call('HDEL', KEYS[2], sid)
    elseif not leased(sid, now) then
      redis.call('HSET', KEYS[2], sid, ARGV[2] .. '|' .. ARGV[3])
      claimed[#claimed + 1] = sid
    end
  end
end
return claimed
""",
)

ACTIVITY_RELEASE = LuaScript(
    "activity_release",
    """
-- ARGV: 1 sid, 2 owner. Only the lease holder may drop the entry.
local lease = redis.call('HGET', KEYS[2], ARGV[1])
if not lease or string.match(lease, '^%d+|(.*)$') ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
""",
)


SHARED_PUT = LuaScript(
    "shared_put",
    """
-- KEYS: 1 the blob. ARGV: 1 now, 2 expected_version|'', 3 expires_us|'' (forever),
-- 4 ttl_ms|'', 5 data json. The value is framed 'version|expires_us|updated_us|json'.
local raw = redis.call('GET', KEYS[1])
local actual = 0
if raw then
  local version, expires = string.match(raw, '^(%d+)|(-?%d*)|')
  if expires == '' or tonumber(expires) > tonumber(ARGV[1]) then actual = tonumber(version) end
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= actual then return {'conflict', actual} end
local value = string.format('%d', actual + 1) .. '|' .. ARGV[3] .. '|' .. ARGV[1] .. '|' .. ARGV[5]
if ARGV[4] == '' then redis.call('SET', KEYS[1], value)
else redis.call('SET', KEYS[1], value, 'PX', ARGV[4]) end
return {'ok', actual + 1}
""",
)

SHARED_DELETE = LuaScript(
    "shared_delete",
    """
-- KEYS: 1 the blob. ARGV: 1 now. Deletes it; answers 1 if it was live.
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
redis.call('DEL', KEYS[1])
local expires = string.match(raw, '^%d+|(-?%d*)|')
if expires == '' or tonumber(expires) > tonumber(ARGV[1]) then return 1 end
return 0
""",
)


class RedisHotStore(RedisStoreBase):
    """Hot tier in Redis or Redis Cluster. See :class:`tiermem.store.contract.HotStore`.

    ``client`` must be an asyncio client with ``decode_responses=False``; it is shared, not
    owned: :meth:`aclose` leaves it open. :meth:`from_url` builds a client the store owns
    and closes. ``activity_shards`` must stay the same for the life of the data (a session's
    shard is ``crc32(session_id) % activity_shards``).

    Every method raises what :class:`~tiermem.store.contract.HotStore` documents, and
    :class:`~tiermem.errors.BackendUnavailableError` (server unreachable, loading, failing
    over; retryable), :class:`~tiermem.errors.BackendTimeoutError` (retryable; a write may
    have been applied) or :class:`~tiermem.errors.BackendError` (rejected command or
    credentials; not retryable) for failures of Redis itself, chained to redis-py's error.
    """

    name = BACKEND_NAME
    capabilities = frozenset(
        {
            Capability.NATIVE_TTL,
            Capability.CLUSTER_SAFE,
            Capability.ENTITIES_IN_APPEND,
            Capability.KEEP_EXPIRED,
        }
    )

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        activity_shards: int = 16,
        snapshot_cache: int = 1024,
    ) -> None:
        super().__init__(
            client,
            clock=clock,
            keys=RedisKeys(prefix, activity_shards=activity_shards),
            gc_grace=gc_grace,
        )
        self._grace_us = gc_grace // timedelta(microseconds=1)
        self._snapshots = SnapshotCache(snapshot_cache)
        self._marks: dict[str, int] = {}
        """Session → the expiry this process last wrote to its activity entry."""
        self._through: DurableStore | None = None
        """The last durable store :meth:`can_append_through` accepted (a store's client
        and prefix never change, so the answer for it is kept: asked twice a turn)."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        activity_shards: int = 16,
        snapshot_cache: int = 1024,
        **client_options: Any,
    ) -> Self:
        """A store on a new client for ``url`` (see :func:`client_from_url`); it owns it.

        ``snapshot_cache``: how many sessions' last-read snapshots to keep so that a read
        decodes only what changed (0: none; see :mod:`redis_snapshots
        <tiermem.store.backends.redis_snapshots>`)."""
        store = cls(
            client_from_url(url, **client_options),
            clock=clock,
            prefix=prefix,
            gc_grace=gc_grace,
            activity_shards=activity_shards,
            snapshot_cache=snapshot_cache,
        )
        return store._own_client()

    def _ttl_ms(self, now_us: int, expires_us: int) -> int:
        """Native TTL: the logical remaining time, rounded up, plus the grace period."""
        return max(1, -((now_us - expires_us) // 1000) + self._grace_ms)

    def _mark_due(self, session_id: str, now_us: int, expires_us: int) -> bool:
        """Whether a write should also move the session's activity entry.

        The entry need not follow every write: :meth:`claim_expired` re-reads the real
        expiry of a due entry and moves it on when the session is in fact live. So a write
        marks when this process has not marked the session yet, when the expiry moves
        earlier than the mark, or when the mark would fall due within half the remaining
        time; a write that starts the session afresh always marks (it must clear a lease).
        """
        marked = self._marks.get(session_id)
        return marked is None or expires_us < marked or 2 * (marked - now_us) < expires_us - now_us

    def _marked(self, session_id: str, expires_us: int) -> None:
        if len(self._marks) >= _MARKS_KEPT:
            self._marks.clear()  # forgetting only costs a few extra marks
        self._marks[session_id] = expires_us

    async def _write_session(
        self,
        session_id: str,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        expires_us: int,
        *,
        now_us: int,
        fresh_at: int | None,
        always_mark: bool = False,
        wrote_at: int = 0,
        wait: ReplicaWait | None = None,
    ) -> list[Any]:
        """Run a session write script, marking the session active when it is due.

        A script's reply says at ``wrote_at`` whether it wrote the hot session (``ok``)
        and at ``fresh_at`` whether it started the session afresh (1). When no mark is due
        (:meth:`_mark_due`) this is one EVALSHA, followed by a mark, a second round trip,
        only when the script started the session afresh. Otherwise the session's keys and
        its activity shard, which are in different slots (no script or MULTI may span them
        in a cluster), go as two commands in one non-transactional pipeline, session first.
        When the session refuses the write (conflict, touch of an absent session, a skipped
        hot half of ``append_through``), the mark is undone with a second round trip; a lost
        mark (the shard failed) is logged and repaired by a later write or by
        :meth:`claim_expired`'s re-check. ``wait``: WAIT follows the session script on its
        connection in the same round trip (:meth:`RedisIO.send_waited
        <tiermem.store.backends.redis_scripts.RedisIO.send_waited>`), and the mark always rides
        along, so that a write that raises NotReplicatedError has been marked all the same.
        """
        if wait is None and not always_mark and not self._mark_due(session_id, now_us, expires_us):
            answer = list(await self._io.call(script, keys, args))
            wrote = len(answer) > wrote_at and answer[wrote_at] == b"ok"
            if wrote and fresh_at is not None and answer[fresh_at] == 1:
                await self._io.call(
                    ACTIVITY_MARK,
                    self._keys.activity_of(session_id),
                    [session_id, expires_us, new_write_id()],
                )
                self._marked(session_id, expires_us)
            return answer
        session = script.command(keys, args)
        shard = self._keys.activity_of(session_id)
        for _ in range(3):
            token = new_write_id()
            mark = ACTIVITY_MARK.command(shard, [session_id, expires_us, token])
            if wait is None:
                reply, marked = await self._io.send([session, mark])
            else:
                reply, marked = await self._io.send_waited([session, mark], wait)
            wrote = isinstance(reply, list) and len(reply) > wrote_at and reply[wrote_at] == b"ok"
            if not wrote and not isinstance(marked, Exception):
                await self._io.call(
                    ACTIVITY_RESTORE, shard, [session_id, token, marked[0], marked[1]]
                )
            if isinstance(reply, NoScriptError):
                # Nothing was written: load what is missing and send both again.
                missing = [script] + ([ACTIVITY_MARK] if isinstance(marked, NoScriptError) else [])
                await self._io.load(*missing)
                continue
            if isinstance(reply, Exception):
                raise reply
            if wrote and isinstance(marked, NoScriptError):
                await self._io.call(ACTIVITY_MARK, shard, [session_id, expires_us, token])
                self._marked(session_id, expires_us)
            elif wrote and isinstance(marked, Exception):
                logger.warning(
                    "redis hot store: session %r was written but its activity-index update "
                    "failed (%s); a later write repairs the index",
                    session_id,
                    marked,
                )
            elif wrote:
                self._marked(session_id, expires_us)
            return list(reply)
        raise reply

    @staticmethod
    def _version_conflict(session_id: str, expected: int | None, actual: int) -> ConflictError:
        return ConflictError(
            f"session {session_id!r} is at version {actual}, not {expected}; reload it and retry",
            expected=expected,
            actual=actual,
        )

    # -- HotStore ---------------------------------------------------------------------------

    @redis_boundary
    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        expires_at: datetime,
        first_index: int | None = None,
        metadata: SessionMetadata | None = None,
        expected_version: int | None = None,
        entities: EntityChange | None = None,
        keep_expired: bool = False,
    ) -> HotAppendResult:
        """One EVALSHA (see :meth:`_write_session` for when the activity mark rides along)."""
        check_append(session_id, turns, window=window, first_index=first_index)
        templates = turn_templates(turns)
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        metadata_json = "" if metadata is None else metadata.model_dump_json()
        reply = await self._write_session(
            session_id,
            HOT_APPEND_KEEP_EXPIRED if keep_expired else HOT_APPEND,
            self._keys.hot_keys(session_id),
            [
                *((self._grace_us,) if keep_expired else ()),
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                window,
                optional_int(expected_version),
                optional_int(first_index),
                metadata_json,
                new_write_id(),
                *entity_args(entities),
                *templates,
            ],
            expires_us,
            now_us=now_us,
            fresh_at=3,
        )
        if reply[0] == b"conflict":
            raise self._version_conflict(session_id, expected_version, int(reply[1]))
        if reply[0] == b"expired":
            raise held_expired(session_id, int(reply[1]))
        if reply[0] == b"index":
            actual = int(reply[1])
            raise ConflictError(
                f"session {session_id!r}: next turn index is {actual}, not {first_index}",
                expected=first_index,
                actual=actual,
            )
        version, start = int(reply[1]), int(reply[2])
        stored = tuple(turn.with_index(start + i) for i, turn in enumerate(turns))
        self._snapshots.appended(
            session_id,
            epoch=reply[4],
            version=version,
            fresh=reply[3] == 1,
            turns=stored,
            window=window,
            expires_us=expires_us,
            metadata=None if metadata is None else (metadata_json, metadata),
            change=entities,
        )
        return HotAppendResult.trusted(
            {"turns": stored, "version": version, "next_index": start + len(turns)}
        )

    # -- CombinedAppend ---------------------------------------------------------------------

    def can_append_through(self, durable: DurableStore) -> bool:
        """True for a :class:`RedisDurableStore` on the same server and key prefix (so a
        session's hot and durable keys share one hash tag, hence one cluster slot)."""
        if durable is self._through:
            return True
        if (
            isinstance(durable, RedisDurableStore)
            and durable.keys.prefix == self._keys.prefix
            and same_server(durable.client, self.client)
        ):
            self._through = durable
            return True
        return False

    @redis_boundary
    async def append_through(
        self,
        durable: DurableStore,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        hot_expires_at: datetime,
        durable_expires_at: datetime | None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
        first_index: int | None = None,
    ) -> tuple[list[Turn], HotAppendResult | None]:
        """One EVALSHA for both tiers (see :data:`~tiermem.store.backends.redis_append.
        APPEND_THROUGH`); the activity mark rides along as in :meth:`_write_session`.

        Raises:
            ValidationError: as either tier's ``append_turns``, or ``durable`` is not one
                :meth:`can_append_through` accepts.
            ConflictError: ``first_index`` is not the archive's next index; nothing was
                written.
            NotReplicatedError: the durable store has a ``replica_wait`` and too few
                replicas confirmed the turns; they are stored on the master (WAIT rides in
                the same round trip).
        """
        if not self.can_append_through(durable):
            raise ValidationError(
                "append_through needs a RedisDurableStore on the same Redis server and key "
                "prefix as the hot store; check can_append_through first"
            )
        assert isinstance(durable, RedisDurableStore)
        check_append(session_id, turns, window=window, first_index=first_index)
        key = check_idempotency_key(idempotency_key)
        check_aware(durable_expires_at, what="durable_expires_at")
        templates = turn_templates(turns)
        now_us, expires_us = self._now_us(), to_us(hot_expires_at, what="hot_expires_at")
        reply = await self._write_session(
            session_id,
            APPEND_THROUGH,
            self._keys.through_keys(session_id),
            [
                now_us,
                durable.grace_ms,
                optional_us(durable_expires_at),
                optional_int(first_index),
                key or "",
                new_write_id(),
                expires_us,
                self._ttl_ms(now_us, expires_us),
                window,
                new_write_id(),
                *entity_args(entities),
                *templates,
            ],
            expires_us,
            now_us=now_us,
            fresh_at=5,
            wrote_at=3,
            wait=durable.append_wait(session_id, len(turns), key),
        )
        if reply[0] == b"index":
            actual = int(reply[1])
            raise ConflictError(
                f"session {session_id!r}: next archived turn index is {actual}, not {first_index}",
                expected=first_index,
                actual=actual,
            )
        if reply[0] == b"repeat":
            return live_turns(reply[7:], now_us, session_id), None
        start = int(reply[1])
        stored = tuple(turn.with_index(start + i) for i, turn in enumerate(turns))
        if reply[3] != b"ok":
            self._snapshots.drop(session_id)
            return list(stored), None
        version = int(reply[4])
        self._snapshots.appended(
            session_id,
            epoch=reply[6],
            version=version,
            fresh=reply[5] == 1,
            turns=stored,
            window=window,
            expires_us=expires_us,
            metadata=None,
            change=entities,
        )
        result = HotAppendResult.trusted(
            {"turns": stored, "version": version, "next_index": start + len(turns)}
        )
        return list(stored), result

    @redis_boundary
    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        """One EVALSHA; it sends back only what changed since this store last saw the
        session (module :mod:`~tiermem.store.backends.redis_snapshots`)."""
        validate_id(session_id, what="session_id")
        cached = self._snapshots.get(session_id)
        reply = await self._io.call(
            HOT_LOAD,
            self._keys.hot_keys(session_id),
            [
                self._now_us(),
                self._grace_us if include_expired else "",
                *self._snapshots.load_args(cached),
            ],
        )
        return self._snapshots.loaded(session_id, cached, reply)

    @redis_boundary
    async def load_with_records(
        self, durable: DurableStore, session_id: str, kinds: Sequence[str]
    ) -> tuple[SessionSnapshot | None, list[SessionRecord | None]]:
        """:meth:`load` and ``durable``'s records ``kinds`` of the session, in one pipeline
        (one round trip): the read path of ``Session.context``. ``durable`` must be one
        :meth:`can_append_through` accepts (same server and key prefix).

        Raises:
            ValidationError: ``durable`` is not such a store, or a bad id or kind.
        """
        if not isinstance(durable, RedisDurableStore) or not self.can_append_through(durable):
            raise ValidationError(
                "load_with_records needs a RedisDurableStore on the same Redis server and "
                "key prefix as the hot store; check can_append_through first"
            )
        validate_id(session_id, what="session_id")
        cached = self._snapshots.get(session_id)
        load = HOT_LOAD.command(
            self._keys.hot_session(session_id),
            [self._now_us(), "", *self._snapshots.load_args(cached)],
        )
        reads = [durable.record_command(session_id, kind) for kind in kinds]
        replies = await self._io.batch([load, *reads])
        snapshot = self._snapshots.loaded(session_id, cached, replies[0])
        return snapshot, [decode_record(k, r) for k, r in zip(kinds, replies[1:], strict=True)]

    @redis_boundary
    async def put_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        validate_id(session_id, what="session_id")
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_PUT_METADATA,
            self._keys.hot_session(session_id),
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                optional_int(expected_version),
                metadata.model_dump_json(),
                new_write_id(),
            ],
            expires_us,
            now_us=now_us,
            fresh_at=2,
        )
        if reply[0] == b"conflict":
            raise self._version_conflict(session_id, expected_version, int(reply[1]))
        return int(reply[1])

    @redis_boundary
    async def update_entities(
        self,
        session_id: str,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        expires_at: datetime,
    ) -> int | None:
        validate_id(session_id, what="session_id")
        change = EntityChange.trusted({"upsert": dict(upsert), "remove": tuple(remove)})
        args = entity_args(change)
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_UPDATE_ENTITIES,
            self._keys.hot_session(session_id),
            [now_us, expires_us, self._ttl_ms(now_us, expires_us), *args],
            expires_us,
            now_us=now_us,
            fresh_at=None,
        )
        return None if reply[0] == b"absent" else int(reply[1])

    @redis_boundary
    async def restore(
        self,
        session_id: str,
        *,
        turns: Sequence[Turn],
        next_index: int,
        metadata: SessionMetadata,
        entities: Mapping[str, ActiveEntity],
        state: Mapping[str, StateBlob],
        window: int,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        check_restore(session_id, turns, next_index=next_index, window=window)
        for kind in entities:
            check_kind(kind, what="entity kind")
        framed_state = [
            part for name, blob in state.items() for part in (name, _frame_state(name, blob))
        ]
        # Only the window is sent; every turn is still size-checked, as on the other backends.
        encoded = [encode_turn(turn) for turn in turns][-window:]
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        self._snapshots.drop(session_id)
        reply = await self._write_session(
            session_id,
            HOT_RESTORE,
            self._keys.hot_session(session_id),
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                optional_int(expected_version),
                next_index,
                metadata.model_dump_json(),
                len(encoded),
                len(entities),
                new_write_id(),
                *encoded,
                *(part for kind, e in entities.items() for part in (kind, e.model_dump_json())),
                *framed_state,
            ],
            expires_us,
            now_us=now_us,
            fresh_at=None,
            always_mark=True,
        )
        if reply[0] == b"conflict":
            raise self._version_conflict(session_id, expected_version, int(reply[1]))
        return int(reply[1])

    @redis_boundary
    async def copy_state(self, session_id: str, blob: StateBlob, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        framed = _frame_state(blob.name, blob)
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_COPY_STATE,
            self._keys.hot_session(session_id),
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                blob.name,
                blob.version,
                framed,
            ],
            expires_us,
            now_us=now_us,
            fresh_at=None,
        )
        return bool(reply[0] == b"ok")

    @redis_boundary
    async def get_state(self, session_id: str, name: str) -> StateBlob | None:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        raw = await self._io.call(
            HOT_GET_STATE,
            [self._keys.hot_meta(session_id), self._keys.hot_state(session_id)],
            [self._now_us(), name],
        )
        return None if raw is None else decode_state(name, raw)

    @redis_boundary
    async def put_state(
        self,
        session_id: str,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> StateBlob:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        payload = encode_data(data, what=f"state {name!r}")
        now = self._clock.now()
        now_us, expires_us = to_us(now), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_PUT_STATE,
            self._keys.hot_session(session_id),
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                name,
                optional_int(expected_version),
                now_us,
                payload,
                new_write_id(),
            ],
            expires_us,
            now_us=now_us,
            fresh_at=2,
        )
        if reply[0] == b"conflict":
            actual = int(reply[1])
            raise ConflictError(
                f"state {name!r} of session {session_id!r} is at version {actual}, "
                f"not {expected_version}; re-read it and retry",
                expected=expected_version,
                actual=actual,
            )
        return StateBlob(name=name, data=json.loads(payload), version=int(reply[1]), updated_at=now)

    @redis_boundary
    async def touch(self, session_id: str, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_TOUCH,
            self._keys.hot_session(session_id),
            [now_us, expires_us, self._ttl_ms(now_us, expires_us)],
            expires_us,
            now_us=now_us,
            fresh_at=None,
        )
        return bool(reply[0] == b"ok")

    @redis_boundary
    async def delete(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        self._snapshots.drop(session_id)
        self._marks.pop(session_id, None)
        await self._io.batch(
            [
                Command(("DEL", *self._keys.hot_session(session_id))),
                ACTIVITY_REMOVE.command(self._keys.activity_of(session_id), [session_id]),
            ]
        )

    @redis_boundary
    async def claim_expired(self, *, owner: str, lease: timedelta, limit: int = 100) -> list[str]:
        """Claim expired sessions, oldest expiry first, across all activity shards.

        Each round is three round trips: the due, unleased entries of every shard; the real
        expiry of each candidate session (the index may be stale, see
        :meth:`_write_session`); then a lease per shard, atomically re-checked.
        """
        validate_id(owner, what="owner")
        check_limit(limit)
        now = self._clock.now()
        now_us, until_us = to_us(now), to_us(now + lease)
        claimed: list[str] = []
        for _ in range(_CLAIM_ROUNDS):
            want = limit - len(claimed)
            if want <= 0:
                break
            pages = await self._io.batch(
                [
                    ACTIVITY_CANDIDATES.command(self._keys.activity(shard), [now_us, want])
                    for shard in range(self._keys.activity_shards)
                ]
            )
            due = sorted(
                (float(score), sid, score)
                for page in pages
                for sid, score in zip(page[::2], page[1::2], strict=True)
            )[:want]
            if not due:
                break
            expiries = await self._io.batch(
                [Command(("HGET", self._keys.hot_meta(sid.decode()), "x")) for _, sid, _ in due]
            )
            by_shard: dict[int, list[Arg]] = {}
            for (_, sid, score), real in zip(due, expiries, strict=True):
                shard = self._keys.activity_shard(sid.decode())
                by_shard.setdefault(shard, []).extend([sid, score, real or b""])
            results = await self._io.batch(
                [
                    ACTIVITY_CLAIM.command(
                        self._keys.activity(shard), [now_us, until_us, owner, *triples]
                    )
                    for shard, triples in by_shard.items()
                ]
            )
            won = {sid for result in results for sid in result}
            claimed.extend(sid.decode() for _, sid, _ in due if sid in won)
        return claimed

    @redis_boundary
    async def release_expired(self, session_id: str, *, owner: str) -> bool:
        validate_id(session_id, what="session_id")
        released = await self._io.call(
            ACTIVITY_RELEASE, self._keys.activity_of(session_id), [session_id, owner]
        )
        return bool(released == 1)

    # -- shared keyspace ----------------------------------------------------------------

    @redis_boundary
    async def get_shared(self, name: str) -> StateBlob | None:
        check_kind(name, what="shared name")
        raw = await self._io.execute("GET", self._keys.shared(name))
        if raw is None:
            return None
        version, expires_us, updated_us, data = split_frame(raw, 3)
        if expires_us and not self._now_us() < int(expires_us):  # as codec.is_live
            return None
        return StateBlob(
            name=name, data=json.loads(data), version=int(version), updated_at=from_us(updated_us)
        )

    @redis_boundary
    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        check_kind(name, what="shared name")
        payload = encode_shared(name, data)
        now = self._clock.now()
        now_us = to_us(now)
        expires_us = None if expires_at is None else to_us(expires_at, what="expires_at")
        reply = await self._io.call(
            SHARED_PUT,
            [self._keys.shared(name)],
            [
                now_us,
                optional_int(expected_version),
                optional_int(expires_us),
                "" if expires_us is None else self._ttl_ms(now_us, expires_us),
                payload,
            ],
        )
        if reply[0] == b"conflict":
            actual = int(reply[1])
            raise ConflictError(
                f"shared blob {name!r} is at version {actual}, not {expected_version}; "
                "re-read it and retry",
                expected=expected_version,
                actual=actual,
            )
        return StateBlob(name=name, data=json.loads(payload), version=int(reply[1]), updated_at=now)

    @redis_boundary
    async def delete_shared(self, name: str) -> bool:
        check_kind(name, what="shared name")
        deleted = await self._io.call(SHARED_DELETE, [self._keys.shared(name)], [self._now_us()])
        return bool(deleted == 1)


def _frame_state(name: str, blob: StateBlob) -> str:
    """A blob another tier versioned, framed as stored: 'version|updated_us|json'.

    Raises:
        ValidationError: a bad name, a blob over the size limit, or a naive ``updated_at``.
    """
    check_kind(name, what="state name")
    payload = encode_data(blob.data, what=f"state {name!r}")
    return f"{blob.version}|{to_us(blob.updated_at, what='updated_at')}|{payload}"
