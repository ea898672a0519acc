"""The hot tier on Redis: :class:`RedisHotStore`.

One session is four keys under one hash tag (meta, turns, entities, state); every operation
on it is one Lua script, so it is atomic and one round trip: a ``restore`` replaces all four
keys in one script, and ``copy_state`` compares and writes in one. The activity index is
sharded and lives in other slots: see "Activity index" in
:mod:`tiermem.store.backends.redis`, which also lists the round trips of each call.

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
import secrets
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from redis.exceptions import NoScriptError

from tiermem.clock import Clock
from tiermem.errors import ConflictError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionSnapshot,
    StateBlob,
    Turn,
)
from tiermem.store.backends.redis_scripts import (
    BACKEND_NAME,
    Arg,
    Command,
    LuaScript,
    RedisClient,
    RedisKeys,
    RedisStoreBase,
    client_from_url,
    from_us,
    optional_int,
    redis_boundary,
    split_frame,
    to_us,
    turn_template,
)
from tiermem.store.codec import (
    check_append,
    check_kind,
    check_limit,
    check_restore,
    decode_turns,
    encode_data,
    encode_shared,
    encode_turn,
)
from tiermem.store.contract import DEFAULT_GC_GRACE, Capability, HotAppendResult
from tiermem.store.keys import validate_id

__all__ = ["RedisHotStore"]

logger = logging.getLogger(__name__)

_CLAIM_ROUNDS = 8
"""claim_expired gives up after this many candidate rounds, even if it claimed fewer."""


# -- Lua (see the conventions in redis_scripts) -------------------------------------

_HOT_PRELUDE = """
-- KEYS: 1 meta, 2 turns, 3 entities, 4 state (one session, one hash tag)
local function hot_live(now)
  local x = redis.call('HGET', KEYS[1], 'x')
  return x ~= false and tonumber(x) > now
end
local function hot_begin(live)
  -- The write goes ahead: an expired, not yet collected session is dropped first, so the
  -- write starts afresh. (A refused write leaves it, readable with include_expired.)
  if not live then redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) end
end
local function hot_version(live)
  if not live then return 0 end
  return tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
end
local function hot_commit(version, expires, ttl)
  redis.call('HSET', KEYS[1], 'v', string.format('%d', version), 'x', expires)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
"""

HOT_APPEND = LuaScript(
    "hot_append",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 window, 5 expected_version|'', 6 first_index|'',
--       7 metadata json|'', 8.. turn templates
local live = hot_live(tonumber(ARGV[1]))
local version = hot_version(live)
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= version then return {'conflict', version} end
local start = 0
if live then start = tonumber(redis.call('HGET', KEYS[1], 'n') or '0') end
if ARGV[6] ~= '' then
  local first = tonumber(ARGV[6])
  if live and first ~= start then return {'index', start} end
  start = first
end
hot_begin(live)
for i = 8, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i] .. ',"index":' .. string.format('%d', start + i - 8) .. '}')
end
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
redis.call('HSET', KEYS[1], 'n', string.format('%d', start + #ARGV - 7))
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'm', ARGV[7]) end
hot_commit(version + 1, ARGV[2], ARGV[3])
return {'ok', version + 1, start}
""",
)

HOT_LOAD = LuaScript(
    "hot_load",
    """
-- KEYS: meta, turns, entities, state. ARGV: 1 now, 2 grace_us to include an expired session
-- until it is collected (now < expires + grace), or ''. Read-only.
local visible_after = tonumber(ARGV[1])
if ARGV[2] ~= '' then visible_after = visible_after - tonumber(ARGV[2]) end
local m = redis.call('HMGET', KEYS[1], 'v', 'n', 'x', 'm')
if not m[3] or tonumber(m[3]) <= visible_after then return false end
return {m[1] or '0', m[2] or '0', m[3], m[4] or '', redis.call('LRANGE', KEYS[2], 0, -1),
        redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4])}
""",
)

HOT_PUT_METADATA = LuaScript(
    "hot_put_metadata",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 expected_version|'', 5 metadata json
local live = hot_live(tonumber(ARGV[1]))
local version = hot_version(live)
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= version then return {'conflict', version} end
hot_begin(live)
redis.call('HSET', KEYS[1], 'm', ARGV[5])
hot_commit(version + 1, ARGV[2], ARGV[3])
return {'ok', version + 1}
""",
)

HOT_UPDATE_ENTITIES = LuaScript(
    "hot_update_entities",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 n removed, then removed kinds, then kind/json pairs.
-- Entities never start a session: an absent or expired one is left as it is.
if not hot_live(tonumber(ARGV[1])) then return {'absent'} end
local version = hot_version(true)
local removed = tonumber(ARGV[4])
for i = 5, 4 + removed do redis.call('HDEL', KEYS[3], ARGV[i]) end
for i = 5 + removed, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
hot_commit(version + 1, ARGV[2], ARGV[3])
return {'ok', version + 1}
""",
)

HOT_PUT_STATE = LuaScript(
    "hot_put_state",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 name, 5 expected_version|'', 6 updated_us, 7 data json
-- A state value is framed 'version|updated_us|json'.
local live = hot_live(tonumber(ARGV[1]))
local version = hot_version(live)
local raw = live and redis.call('HGET', KEYS[4], ARGV[4])
local actual = 0
if raw then actual = tonumber(string.match(raw, '^(%d+)|')) end
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= actual then return {'conflict', actual} end
hot_begin(live)
redis.call('HSET', KEYS[4], ARGV[4],
           string.format('%d', actual + 1) .. '|' .. ARGV[6] .. '|' .. ARGV[7])
hot_commit(version + 1, ARGV[2], ARGV[3])
return {'ok', actual + 1}
""",
)

HOT_RESTORE = LuaScript(
    "hot_restore",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 expected_version|'', 5 next_index, 6 metadata json,
--       7 n turns, 8 n entities, then turn jsons (already indexed, the last `window`),
--       then entity kind/json pairs, then state name/'version|updated_us|json' pairs.
-- Replaces the whole session; state blobs keep the versions the caller framed.
local live = hot_live(tonumber(ARGV[1]))
local version = hot_version(live)
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= version then return {'conflict', version} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local turns, entities = tonumber(ARGV[7]), tonumber(ARGV[8])
local first_entity = 9 + turns
local first_state = first_entity + 2 * entities
for i = 9, first_entity - 1 do redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = first_entity, first_state - 1, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
for i = first_state, #ARGV, 2 do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'n', ARGV[5], 'm', ARGV[6])
hot_commit(version + 1, ARGV[2], ARGV[3])
return {'ok', version + 1}
""",
)

HOT_COPY_STATE = LuaScript(
    "hot_copy_state",
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms, 4 name, 5 blob version, 6 framed blob
-- ('version|updated_us|json'). Writes unless the live session holds the blob at that
-- version or a newer one; an absent or expired session is left as it is.
if not hot_live(tonumber(ARGV[1])) then return {'absent'} end
local raw = redis.call('HGET', KEYS[4], ARGV[4])
if raw and tonumber(string.match(raw, '^(%d+)|')) >= tonumber(ARGV[5]) then
  return {'held'}
end
local version = hot_version(true)
redis.call('HSET', KEYS[4], ARGV[4], ARGV[6])
hot_commit(version + 1, ARGV[2], ARGV[3])
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
    _HOT_PRELUDE
    + """
-- ARGV: 1 now, 2 expires, 3 ttl_ms. Moves the expiry; the version stays. An expired
-- session is left as it is, for handoff.
if not hot_live(tonumber(ARGV[1])) then return {'absent'} end
redis.call('HSET', KEYS[1], 'x', ARGV[2])
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
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
    capabilities = frozenset({Capability.NATIVE_TTL, Capability.CLUSTER_SAFE})

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        activity_shards: int = 16,
    ) -> None:
        super().__init__(
            client,
            clock=clock,
            keys=RedisKeys(prefix, activity_shards=activity_shards),
            gc_grace=gc_grace,
        )
        self._grace_us = gc_grace // timedelta(microseconds=1)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        activity_shards: int = 16,
        **client_options: Any,
    ) -> Self:
        """A store on a new client for ``url`` (see :func:`client_from_url`); it owns it."""
        store = cls(
            client_from_url(url, **client_options),
            clock=clock,
            prefix=prefix,
            gc_grace=gc_grace,
            activity_shards=activity_shards,
        )
        return store._own_client()

    def _ttl_ms(self, now_us: int, expires_us: int) -> int:
        """Native TTL: the logical remaining time, rounded up, plus the grace period."""
        return max(1, -((now_us - expires_us) // 1000) + self._grace_ms)

    async def _write_session(
        self, session_id: str, script: LuaScript, args: Sequence[Arg], expires_us: int
    ) -> list[Any]:
        """Run a session write script and mark the session active, in one round trip.

        The session's keys and its activity shard are in different slots, so they cannot
        share a script or a MULTI in a cluster. The two commands go in one non-transactional
        pipeline, session first. When the session refuses the write (conflict, touch of an
        absent session), the mark is undone with a second round trip; a lost mark (the
        shard failed) is logged and repaired by the session's next write or by
        :meth:`claim_expired`'s re-check.
        """
        session = script.command(self._keys.hot_session(session_id), args)
        shard = self._keys.activity_of(session_id)
        for _ in range(3):
            token = secrets.token_hex(8)
            mark = ACTIVITY_MARK.command(shard, [session_id, expires_us, token])
            reply, marked = await self._io.send([session, mark])
            wrote = isinstance(reply, list) and reply[0] == b"ok"
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
            elif wrote and isinstance(marked, Exception):
                logger.warning(
                    "redis hot store: session %r was written but its activity-index update "
                    "failed (%s); its next write repairs the index",
                    session_id,
                    marked,
                )
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
    ) -> HotAppendResult:
        check_append(session_id, turns, window=window, first_index=first_index)
        templates = [turn_template(turn) for turn in turns]
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        reply = await self._write_session(
            session_id,
            HOT_APPEND,
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                window,
                optional_int(expected_version),
                optional_int(first_index),
                "" if metadata is None else metadata.model_dump_json(),
                *templates,
            ],
            expires_us,
        )
        if reply[0] == b"conflict":
            raise self._version_conflict(session_id, expected_version, int(reply[1]))
        if reply[0] == b"index":
            actual = int(reply[1])
            raise ConflictError(
                f"session {session_id!r}: next turn index is {actual}, not {first_index}",
                expected=first_index,
                actual=actual,
            )
        version, start = int(reply[1]), int(reply[2])
        return HotAppendResult(
            turns=tuple(turn.with_index(start + i) for i, turn in enumerate(turns)),
            version=version,
            next_index=start + len(turns),
        )

    @redis_boundary
    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        validate_id(session_id, what="session_id")
        reply = await self._io.call(
            HOT_LOAD,
            self._keys.hot_session(session_id),
            [self._now_us(), self._grace_us if include_expired else ""],
        )
        if reply is None:
            return None
        version, next_index, expires_us, metadata, turns, entities, state = reply
        return SessionSnapshot(
            session_id=session_id,
            turns=tuple(decode_turns(turns, session_id=session_id)),
            metadata=SessionMetadata.model_validate_json(metadata) if metadata else None,
            entities={
                kind.decode(): ActiveEntity.model_validate_json(raw)
                for kind, raw in zip(entities[::2], entities[1::2], strict=True)
            },
            state={
                name.decode(): _decode_state(name.decode(), raw)
                for name, raw in zip(state[::2], state[1::2], strict=True)
            },
            version=int(version),
            next_index=int(next_index),
            expires_at=from_us(expires_us),
        )

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
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                optional_int(expected_version),
                metadata.model_dump_json(),
            ],
            expires_us,
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
        for kind in [*upsert, *remove]:
            check_kind(kind, what="entity kind")
        now_us, expires_us = self._now_us(), to_us(expires_at, what="expires_at")
        pairs = [part for kind, e in upsert.items() for part in (kind, e.model_dump_json())]
        reply = await self._write_session(
            session_id,
            HOT_UPDATE_ENTITIES,
            [now_us, expires_us, self._ttl_ms(now_us, expires_us), len(remove), *remove, *pairs],
            expires_us,
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
        reply = await self._write_session(
            session_id,
            HOT_RESTORE,
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                optional_int(expected_version),
                next_index,
                metadata.model_dump_json(),
                len(encoded),
                len(entities),
                *encoded,
                *(part for kind, e in entities.items() for part in (kind, e.model_dump_json())),
                *framed_state,
            ],
            expires_us,
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
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                blob.name,
                blob.version,
                framed,
            ],
            expires_us,
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
        return None if raw is None else _decode_state(name, raw)

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
            [
                now_us,
                expires_us,
                self._ttl_ms(now_us, expires_us),
                name,
                optional_int(expected_version),
                now_us,
                payload,
            ],
            expires_us,
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
            [now_us, expires_us, self._ttl_ms(now_us, expires_us)],
            expires_us,
        )
        return bool(reply[0] == b"ok")

    @redis_boundary
    async def delete(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
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


def _decode_state(name: str, raw: bytes) -> StateBlob:
    version, updated_us, data = split_frame(raw, 2)
    return StateBlob(
        name=name, data=json.loads(data), version=int(version), updated_at=from_us(updated_us)
    )
