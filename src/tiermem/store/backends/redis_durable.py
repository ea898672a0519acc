"""The durable tier on Redis: :class:`RedisDurableStore`.

A session's archive, records, header (owner, lifetime) and idempotency keys share the
session's hash tag; a user's session list and long-term memories share the user's hash
tag. Every conditional write is one Lua script (allocation of turn indexes, idempotency
keys, compare-and-set on versions, the session's lifetime and native TTLs), and no script
touches a key outside the tag of the keys it declares. The key layout, the lifetime rules
and the round trips of each call are in :mod:`tiermem.store.backends.redis`.

Durability is the server's: this store declares ``PERSISTENT``, which holds only when the
Redis server persists its data (AOF with ``appendfsync everysec`` or ``always``, or RDB
snapshots, with the loss window each implies). A server run with ``--save ''
--appendonly no`` keeps nothing across a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from tiermem.clock import Clock
from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.models import (
    JsonValue,
    MemoryRecord,
    NewTurn,
    SessionRecord,
    SessionRef,
    Turn,
)
from tiermem.store.backends.redis_append import (
    ARCHIVE_APPEND,
    DURABLE_PRELUDE,
    HORIZON_PRELUDE,
    RECORD_PRELUDE,
    bind_durable,
    turn_templates,
)
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
    split_frame,
    to_us,
)
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_idempotency_key,
    check_index,
    check_kind,
    check_limit,
    check_memory_ids,
    check_memory_version,
    check_range,
    decode_memory,
    decode_turn,
    decode_turns,
    encode_data,
    encode_memory,
    encode_turn,
)
from tiermem.store.contract import DEFAULT_GC_GRACE, Capability, EntityChange
from tiermem.store.keys import escape_segment, unescape_segment, validate_id

__all__ = ["RedisDurableStore", "decode_record"]

_ATTEMPTS = 5
"""How often an optimistic multi-step operation (redaction, retyping, purge) is retried."""


# -- Lua (see the conventions in redis_scripts) -------------------------------------

# Durable session scripts. KEYS: 1 archive (list of 'expires_us|turn json', list position =
# turn index), 2 records (kind -> 'version|lifetime_us|updated_us|data json'), 3 dmeta
# (h lifetime, o owner, c created_us, w recent write ids, u=<user> notes), 4 idem
# (key -> 'first|count'). The append script lives in redis_append, beside the hot one.
_SESSION_PRELUDE = bind_durable + DURABLE_PRELUDE

ARCHIVE_TAIL = LuaScript(
    "archive_tail",
    """
-- KEYS: 1 archive. ARGV: 1 now, 2 count. Read-only: the last live turns, newest first.
local now, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local stop = redis.call('LLEN', KEYS[1]) - 1
while stop >= 0 and #out < want do
  local start = math.max(0, stop - (want - #out) + 1)
  local page = redis.call('LRANGE', KEYS[1], start, stop)
  for i = #page, 1, -1 do
    local e = string.match(page[i], '^(%d*)|')
    if e == '' or tonumber(e) > now then
      out[#out + 1] = page[i]
      if #out >= want then break end
    end
  end
  stop = start - 1
end
return out
""",
)

ARCHIVE_REPLACE = LuaScript(
    "archive_replace",
    """
-- KEYS: 1 archive. ARGV: 1 index, 2 sha1 of the value read, 3 new value.
local current = redis.call('LINDEX', KEYS[1], ARGV[1])
if not current or redis.sha1hex(current) ~= ARGV[2] then return 0 end
redis.call('LSET', KEYS[1], ARGV[1], ARGV[3])
return 1
""",
)

RECORD_PUT = LuaScript(
    "record_put",
    bind_durable
    + RECORD_PRELUDE
    + """
-- ARGV: 1 now, 2 grace_ms, 3 kind, 4 expected_version|'', 5 expires_us|'', 6 updated_us,
--       7 data json. A record lives as long as its session: in a dead one it is absent.
-- The session's lifetime rises to the record's expiry (never falls) and every key's
-- native TTL is set to it + grace, as extend_horizon does, with one read of the header.
local now = tonumber(ARGV[1])
local h = redis.call('HGET', DK[3], 'h')
local live = h == 'inf' or (h ~= false and tonumber(h) > now)
local raw = live and redis.call('HGET', DK[2], ARGV[3])
local actual = 0
if raw then actual = tonumber(string.match(raw, '^(%d+)|')) end
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= actual then return {'conflict', actual} end
if not live then
  session_begin(false)
  h = false
end
local lifetime
if h == 'inf' or ARGV[5] == '' then lifetime = 'inf'
elseif h and tonumber(h) > tonumber(ARGV[5]) then lifetime = h
else lifetime = ARGV[5] end
local stored = lifetime
if lifetime == 'inf' then stored = '' end
redis.call('HSET', DK[2], ARGV[3], string.format('%d', actual + 1) .. '|' .. stored .. '|'
           .. ARGV[6] .. '|' .. ARGV[7])
if h == 'inf' then return {'ok', actual + 1, stored} end
if lifetime == 'inf' then
  redis.call('HSET', DK[3], 'h', 'inf')
  for _, k in ipairs(DK) do redis.call('PERSIST', k) end
  return {'ok', actual + 1, stored}
end
local ttl = math.ceil((tonumber(lifetime) - now) / 1000) + tonumber(ARGV[2])
if ttl < 1 then ttl = 1 end
redis.call('HSET', DK[3], 'h', lifetime, 't', string.format('%d', now + ttl * 1000))
local ms = string.format('%d', ttl)
for _, k in ipairs(DK) do redis.call('PEXPIRE', k, ms) end
return {'ok', actual + 1, stored}
""",
)

RECORD_GET = LuaScript(
    "record_get",
    """
-- KEYS: 1 records, 2 dmeta. ARGV: 1 now, 2 kind. Read-only: the record while the session
-- lives.
local h = redis.call('HGET', KEYS[2], 'h')
if h ~= 'inf' and (not h or tonumber(h) <= tonumber(ARGV[1])) then return false end
return redis.call('HGET', KEYS[1], ARGV[2])
""",
)

SESSION_CLAIM = LuaScript(
    "session_claim",
    _SESSION_PRELUDE
    + """
-- ARGV: 1 now, 2 grace_ms, 3 expires_us|'', 4 user_id, 5 created_us. The session's side
-- of register_session: claim the id unless another user holds it while it lives, and
-- note the user (delete_session reads the notes to find the lists that name the session).
local now = tonumber(ARGV[1])
local live = session_live(now)
local owner = live and redis.call('HGET', KEYS[3], 'o')
if owner and owner ~= ARGV[4] then
  return {'held', owner, redis.call('HGET', KEYS[3], 'c')}
end
session_begin(live)
if not owner then redis.call('HSET', KEYS[3], 'o', ARGV[4], 'c', ARGV[5]) end
redis.call('HSET', KEYS[3], 'u=' .. ARGV[4], '1')
session_extend(now, tonumber(ARGV[2]), ARGV[3])
return {'ok', ARGV[4], redis.call('HGET', KEYS[3], 'c')}
""",
)

SESSION_PURGE = LuaScript(
    "session_purge",
    """
-- KEYS: 1 archive, 2 records, 3 dmeta, 4 idem. ARGV: 1 now, 2 user_id. A purge of the user
-- deletes the session unless another user holds it now (the id was registered again after
-- the user's session died); the note of the user goes either way. Every header field goes,
-- the native deadline 't' too (the header, named after the session, must not outlive it).
local h = redis.call('HGET', KEYS[3], 'h')
local live = h == 'inf' or (h ~= false and tonumber(h) > tonumber(ARGV[1]))
local owner = redis.call('HGET', KEYS[3], 'o')
redis.call('HDEL', KEYS[3], 'u=' .. ARGV[2])
if live and owner and owner ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
redis.call('HDEL', KEYS[3], 'h', 'o', 'c', 'w', 't')
return 1
""",
)

# User scripts. KEYS share the user's hash tag.

SESSION_REGISTER = LuaScript(
    "session_register",
    """
-- KEYS: 1 sessions zset (score created_us), 2 refs hash. ARGV: 1 sid, 2 created_us, 3 ref.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
""",
)

SESSION_LIST = LuaScript(
    "session_list",
    """
-- KEYS: 1 sessions zset, 2 refs hash. ARGV: 1 limit. Newest first; equal scores come in
-- reverse byte order of the id, which is the reference's (created_at, session_id) order.
local out = {}
for _, sid in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local ref = redis.call('HGET', KEYS[2], sid)
  if ref then out[#out + 1] = ref end
end
return out
""",
)

SESSION_UNREGISTER = LuaScript(
    "session_unregister",
    """
-- KEYS: 1 sessions zset, 2 refs hash. ARGV: 1 sid.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
""",
)

MEMORY_PUT = LuaScript(
    "memory_put",
    HORIZON_PRELUDE
    + """
-- KEYS: 1 mem hash (id -> 'version|expires_us|type|json'), 2 all-types zset, 3 types set,
--       4 umeta, 5 zset of the record's type, [6 zset of the stored record's type]
-- ARGV: 1 now, 2 grace_ms, 3 id, 4 expected_version|'', 5 expires_us|'', 6 type (escaped),
--       7 created_us, 8 framed value, 9 stored type the caller declared in KEYS[6]|''
local now = tonumber(ARGV[1])
local raw = redis.call('HGET', KEYS[1], ARGV[3])
local actual, stored_type = 0, false
if raw then
  local v, e, t = string.match(raw, '^(%d+)|(%d*)|([^|]*)|')
  stored_type = t
  if e == '' or tonumber(e) > now then actual = tonumber(v) end
end
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= actual then return {'conflict', actual} end
if stored_type and stored_type ~= ARGV[6] then
  -- The type changed: the old type's index must be declared too; ask for it.
  if stored_type ~= ARGV[9] then return {'retype', stored_type} end
  redis.call('ZREM', KEYS[6], ARGV[3])
end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[8])
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[6])
extend_horizon(KEYS[4], {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, now,
               tonumber(ARGV[2]), ARGV[5])
return {'ok'}
""",
)

MEMORY_DELETE = LuaScript(
    "memory_delete",
    """
-- KEYS: 1 mem hash, 2 all-types zset, 3 zset of the record's type. ARGV: 1 id, 2 type.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'absent'} end
local t = string.match(raw, '^%d+|%d*|([^|]*)|')
if t ~= ARGV[2] then return {'retype', t} end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {'ok'}
""",
)

MEMORY_QUERY = LuaScript(
    "memory_query",
    """
-- KEYS: 1 mem hash, 2.. zsets to read (all types, or one per asked type)
-- ARGV: 1 now, 2 min score, 3 max score, 4 limit, 5 '1' to include expired. Read-only:
-- up to limit framed records from each zset, newest first; the caller merges them.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[4])
local out = {}
for k = 2, #KEYS do
  local got, offset = 0, 0
  while got < limit do
    local page = redis.call('ZREVRANGEBYSCORE', KEYS[k], ARGV[3], ARGV[2], 'LIMIT', offset, 128)
    if #page == 0 then break end
    for _, id in ipairs(page) do
      local raw = redis.call('HGET', KEYS[1], id)
      if raw then
        local e = string.match(raw, '^%d+|(%d*)|')
        if ARGV[5] == '1' or e == '' or tonumber(e) > now then
          out[#out + 1] = raw
          got = got + 1
          if got >= limit then break end
        end
      end
    end
    offset = offset + #page
  end
end
return out
""",
)

USER_PURGE = LuaScript(
    "user_purge",
    """
-- KEYS: 1 sessions zset, 2 refs, 3 mem, 4 all-types zset, 5 types set, 6 umeta, 7.. type
-- zsets. ARGV: 1 number of sessions the caller deleted, 2.. the types it declared.
-- Refuses ('retry') if a session or a memory type was added since the caller looked.
local known = {}
for i = 2, #ARGV do known[ARGV[i]] = true end
for _, t in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  if not known[t] then return {'retry'} end
end
if redis.call('ZCARD', KEYS[1]) ~= tonumber(ARGV[1]) then return {'retry'} end
local memories = redis.call('HLEN', KEYS[3])
redis.call('DEL', unpack(KEYS))
return {'ok', memories}
""",
)


def decode_record(kind: str, raw: bytes | None) -> SessionRecord | None:
    """A record as the record read script answered it (None: absent or expired)."""
    if raw is None:
        return None
    # The frame's expiry is the session's lifetime when the record was written.
    version, expires_us, updated_us, data = split_frame(raw, 3)
    return SessionRecord(
        kind=kind,
        data=json.loads(data),
        version=int(version),
        updated_at=from_us(updated_us),
        expires_at=from_us(expires_us) if expires_us else None,
    )


class RedisDurableStore(RedisStoreBase):
    """Durable tier in Redis or Redis Cluster. See :class:`tiermem.store.contract.DurableStore`.

    ``client`` must be an asyncio client with ``decode_responses=False``; it is shared, not
    owned: :meth:`aclose` leaves it open. :meth:`from_url` builds a client the store owns
    and closes. ``PERSISTENT`` depends on the server's AOF/RDB configuration (see the
    module docstring).

    Every method raises what :class:`~tiermem.store.contract.DurableStore` documents, and
    :class:`~tiermem.errors.BackendUnavailableError` (server unreachable, loading, failing
    over; retryable), :class:`~tiermem.errors.BackendTimeoutError` (retryable; a write may
    have been applied) or :class:`~tiermem.errors.BackendError` (rejected command or
    credentials; not retryable) for failures of Redis itself, chained to redis-py's error.

    ``replica_wait`` (``TIERMEM_REDIS_WAIT_REPLICAS``): turn appends and record writes
    return only once that many replicas acknowledged them (Redis ``WAIT``, in the same
    round trip), else raise :class:`~tiermem.errors.NotReplicatedError` -- the write is
    stored on the master all the same. See "Replication and WAIT" in
    :mod:`tiermem.store.backends.redis` for what that does and does not guarantee.
    """

    name = BACKEND_NAME
    capabilities = frozenset(
        {
            Capability.PERSISTENT,
            Capability.NATIVE_TTL,
            Capability.CLUSTER_SAFE,
            Capability.ENTITIES_IN_APPEND,
        }
    )

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        super().__init__(client, clock=clock, keys=RedisKeys(prefix), gc_grace=gc_grace)
        self._wait = replica_wait
        self._decoded = DecodedTurns()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        prefix: str = "tm",
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        replica_wait: ReplicaWait | None = None,
        **client_options: Any,
    ) -> Self:
        """A store on a new client for ``url`` (see :func:`client_from_url`); it owns it."""
        store = cls(
            client_from_url(url, **client_options),
            clock=clock,
            prefix=prefix,
            gc_grace=gc_grace,
            replica_wait=replica_wait,
        )
        return store._own_client()

    @property
    def replica_wait(self) -> ReplicaWait | None:
        """How many replicas must confirm a turn append or a record write before it
        returns (Redis ``WAIT``), or None: the writes return once the master applied them.
        :meth:`RedisHotStore.append_through
        <tiermem.store.backends.redis_hot.RedisHotStore.append_through>` honours it too."""
        return self._wait

    def append_wait(self, session_id: str, count: int, key: str | None) -> ReplicaWait | None:
        """:attr:`replica_wait` for one append of ``count`` turns (``key``: its idempotency
        key): only a keyed append can be repeated harmlessly by its caller."""
        if self._wait is None:
            return None
        return self._wait.of(
            f"the append of {count} turn(s) to session {session_id!r}",
            unsafe_retry=""
            if key
            else "it carried no idempotency key, so a retry would store the turn(s) a second "
            "time; read the session's last turns to see them (pass an idempotency key to "
            "make such a retry safe)",
        )

    # -- turn archive ---------------------------------------------------------------------

    @redis_boundary
    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
    ) -> list[Turn]:
        """One EVALSHA: index allocation, the idempotency key, the entity change, the
        session's lifetime and the native TTLs in one script; a repeated key (or a blind
        resend of this very call, recognised by its write id) is answered by the same
        script and writes nothing. With :attr:`replica_wait`, WAIT follows the script in
        the same round trip (a pipeline on its connection).

        Raises:
            NotReplicatedError: (with :attr:`replica_wait`) the turns are stored on the
                master but too few replicas confirmed them; ``retryable`` when the call
                carried an idempotency key (a retry writes nothing and waits again).
        """
        check_append(session_id, turns, first_index=first_index)
        key = check_idempotency_key(idempotency_key)
        templates = turn_templates(turns)
        now_us = self._now_us()
        keys = self._keys.durable_session(session_id)
        args = [
            now_us,
            self._grace_ms,
            optional_us(expires_at),
            optional_int(first_index),
            key or "",
            new_write_id(),
            *entity_args(entities),
            *templates,
        ]
        wait = self.append_wait(session_id, len(turns), key)
        if wait is None:
            reply = await self._io.call(ARCHIVE_APPEND, keys, args)
        else:
            reply = await self._io.call_waited(ARCHIVE_APPEND, keys, args, wait)
        if reply[0] == b"repeat":
            return live_turns(reply[1:], now_us, session_id)
        if reply[0] == b"index":
            actual = int(reply[1])
            raise ConflictError(
                f"session {session_id!r}: next archived turn index is {actual}, not {first_index}",
                expected=first_index,
                actual=actual,
            )
        start = int(reply[1])
        return [turn.with_index(start + i) for i, turn in enumerate(turns)]

    @redis_boundary
    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        return int(await self._io.execute("LLEN", self._keys.archive(session_id)))

    @redis_boundary
    async def get_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)
        raw = await self._io.execute("LINDEX", self._keys.archive(session_id), index)
        turn = None if raw is None else _live_turn(raw, self._now_us())
        if turn is None:
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return turn

    @redis_boundary
    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        if end is not None and end <= start:
            return []  # LRANGE would read stop -1 as "to the last"
        raws = await self._io.execute(
            "LRANGE", self._keys.archive(session_id), start, -1 if end is None else end - 1
        )
        return live_turns(raws, self._now_us(), session_id, self._decoded)

    @redis_boundary
    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        validate_id(session_id, what="session_id")
        if count < 0:
            raise ValidationError(f"count must be >= 0, got {count}")
        if count == 0:
            return []
        raws = await self._io.call(
            ARCHIVE_TAIL, [self._keys.archive(session_id)], [self._now_us(), count]
        )
        return self._decoded.decode(
            (split_frame(raw, 1)[1] for raw in reversed(raws)), session_id=session_id
        )

    @redis_boundary
    async def redact_turn(self, session_id: str, index: int) -> Turn:
        """Read the turn, redact it, and write it back only if the slot did not change."""
        validate_id(session_id, what="session_id")
        check_index(index)
        archive = self._keys.archive(session_id)
        for _ in range(_ATTEMPTS):
            raw = await self._io.execute("LINDEX", archive, index)
            turn = None if raw is None else _live_turn(raw, self._now_us())
            if turn is None:
                raise NotFoundError(f"session {session_id!r} has no turn {index}")
            redacted = turn.redact()
            expires = split_frame(raw, 1)[0]
            digest = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
            new = expires + b"|" + encode_turn(redacted).encode()
            if await self._io.call(ARCHIVE_REPLACE, [archive], [index, digest, new]) == 1:
                self._decoded.clear()  # the turn as it was leaves no decoded copy
                return redacted
        raise ConflictError(
            f"turn {index} of session {session_id!r} kept changing while being redacted; retry"
        )

    # -- sessions -------------------------------------------------------------------------

    @redis_boundary
    async def register_session(
        self, ref: SessionRef, *, expires_at: datetime | None = None
    ) -> SessionRef:
        """Two round trips: the claim in the session's slot, then the user's list.

        The user's list lives in the user's slot, which no script of the session may
        touch, and only a successful claim may add to it. A crash between the two leaves
        the session owned but missing from its owner's list; registering it again (by the
        owner) repairs that, since both steps are idempotent for the holder.
        """
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        check_aware(expires_at, what="expires_at")
        reply = await self._io.call(
            SESSION_CLAIM,
            self._keys.durable_session(ref.session_id),
            [
                self._now_us(),
                self._grace_ms,
                optional_us(expires_at),
                ref.user_id,
                to_us(ref.created_at, what="created_at"),
            ],
        )
        holder = SessionRef(
            session_id=ref.session_id, user_id=reply[1].decode(), created_at=from_us(reply[2])
        )
        if reply[0] == b"ok":
            await self._io.call(
                SESSION_REGISTER,
                self._keys.user_sessions(holder.user_id),
                [holder.session_id, to_us(holder.created_at), holder.model_dump_json()],
            )
        return holder

    @redis_boundary
    async def get_session(self, session_id: str) -> SessionRef | None:
        validate_id(session_id, what="session_id")
        lifetime, owner, created_us = await self._io.execute(
            "HMGET", self._keys.durable_meta(session_id), "h", "o", "c"
        )
        if owner is None or created_us is None or not _lives(lifetime, self._now_us()):
            return None
        return SessionRef(
            session_id=session_id, user_id=owner.decode(), created_at=from_us(created_us)
        )

    @redis_boundary
    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        validate_id(user_id, what="user_id")
        check_limit(limit)
        raws = await self._io.call(SESSION_LIST, self._keys.user_sessions(user_id), [limit])
        return [SessionRef.model_validate_json(raw) for raw in raws]

    @redis_boundary
    async def get_record(self, session_id: str, kind: str) -> SessionRecord | None:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        keys = [self._keys.records(session_id), self._keys.durable_meta(session_id)]
        return decode_record(kind, await self._io.call(RECORD_GET, keys, [self._now_us(), kind]))

    def record_command(self, session_id: str, kind: str) -> Command:
        """:meth:`get_record`'s read as a command (answer: :func:`decode_record`), for a
        pipeline of reads on this server (``RedisHotStore.load_with_records``)."""
        validate_id(session_id, what="session_id")
        check_kind(kind)
        keys = [self._keys.records(session_id), self._keys.durable_meta(session_id)]
        return RECORD_GET.command(keys, [self._now_us(), kind])

    @redis_boundary
    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> SessionRecord:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        check_aware(expires_at, what="expires_at")
        payload = encode_data(data, what=f"record {kind!r}")
        now = self._clock.now()
        wait = None
        if self._wait is not None:
            wait = self._wait.of(
                f"record {kind!r} of session {session_id!r}",
                unsafe_retry=""
                if expected_version is None
                else "it was a compare-and-set, so a retry answers ConflictError; re-read "
                "the record, which holds this write's value",
            )
        keys = self._keys.durable_session(session_id)
        args: list[Arg] = [
            to_us(now),
            self._grace_ms,
            kind,
            optional_int(expected_version),
            optional_us(expires_at),
            to_us(now),
            payload,
        ]
        if wait is None:
            reply = await self._io.call(RECORD_PUT, keys, args)
        else:
            reply = await self._io.call_waited(RECORD_PUT, keys, args, wait)
        if reply[0] == b"conflict":
            actual = int(reply[1])
            raise ConflictError(
                f"record {kind!r} of session {session_id!r} is at version {actual}, "
                f"not {expected_version}; re-read it and retry",
                expected=expected_version,
                actual=actual,
            )
        return SessionRecord(
            kind=kind,
            data=json.loads(payload),
            version=int(reply[1]),
            updated_at=now,
            expires_at=from_us(reply[2]) if reply[2] else None,
        )

    @redis_boundary
    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        fields = await self._io.execute("HKEYS", self._keys.durable_meta(session_id))
        users = [field[2:].decode() for field in fields if field.startswith(b"u=")]
        await self._io.batch(
            [
                Command(("DEL", *self._keys.durable_session(session_id))),
                *(
                    SESSION_UNREGISTER.command(self._keys.user_sessions(user), [session_id])
                    for user in users
                ),
            ]
        )
        self._decoded.clear()  # rare: no need to pick out the session's turns

    # -- long-term memory -----------------------------------------------------------------

    def _memory_keys(self, user_id: str) -> list[str]:
        """mem, all-types zset, types set, umeta: the user's memory keys, in script order."""
        keys = self._keys
        return [
            keys.memories(user_id),
            keys.memories_by_time(user_id),
            keys.memory_types(user_id),
            keys.user_meta(user_id),
        ]

    def _type_index(self, user_id: str, escaped_type: str) -> str:
        return self._keys.memories_of_type(user_id, unescape_segment(escaped_type))

    @redis_boundary
    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        payload = encode_memory(record)
        check_memory_version(record, expected_version)
        memory_type = escape_segment(record.memory_type)
        expires = optional_us(record.expires_at)
        keys = [
            *self._memory_keys(record.user_id),
            self._keys.memories_of_type(record.user_id, record.memory_type),
        ]
        args: list[Arg] = [
            self._now_us(),
            self._grace_ms,
            record.memory_id,
            optional_int(expected_version),
            expires,
            memory_type,
            to_us(record.created_at),
            f"{record.version}|{expires}|{memory_type}|{payload}",
            "",
        ]
        for _ in range(_ATTEMPTS):
            reply = await self._io.call(MEMORY_PUT, keys, args)
            if reply[0] == b"retype":
                # The stored record has another type: declare that type's index and retry.
                stored = reply[1].decode()
                keys = [*keys[:5], self._type_index(record.user_id, stored)]
                args[-1] = stored
                continue
            if reply[0] == b"conflict":
                actual = int(reply[1])
                raise ConflictError(
                    f"memory {record.memory_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            return record
        raise ConflictError(
            f"memory {record.memory_id!r} kept changing type while being written; retry"
        )

    @redis_boundary
    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        raw = await self._io.execute("HGET", self._keys.memories(user_id), memory_id)
        return None if raw is None else _live_memory(raw, self._now_us())

    @redis_boundary
    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        """One HMGET on the user's memory hash."""
        ids = check_memory_ids(user_id, memory_ids)
        if not ids:
            return {}
        raws = await self._io.execute("HMGET", self._keys.memories(user_id), *ids)
        now_us = self._now_us()
        return {
            memory_id: record
            for memory_id, raw in zip(ids, raws, strict=True)
            if raw is not None and (record := _live_memory(raw, now_us)) is not None
        }

    @redis_boundary
    async def query_memories(
        self,
        user_id: str,
        *,
        memory_types: Collection[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        include_expired: bool = False,
    ) -> list[MemoryRecord]:
        validate_id(user_id, what="user_id")
        check_limit(limit)
        check_aware(since, what="since")
        check_aware(until, what="until")
        if memory_types is None:
            indexes = [self._keys.memories_by_time(user_id)]
        else:
            # A type that is not a valid id cannot have been stored: it matches nothing.
            wanted = sorted({t for t in memory_types if _is_valid_id(t)})
            indexes = [self._keys.memories_of_type(user_id, t) for t in wanted]
            if not indexes:
                return []
        raws = await self._io.call(
            MEMORY_QUERY,
            [self._keys.memories(user_id), *indexes],
            [
                self._now_us(),
                "-inf" if since is None else to_us(since),
                "+inf" if until is None else f"({to_us(until)}",
                limit,
                "1" if include_expired else "0",
            ],
        )
        records = [decode_memory(split_frame(raw, 3)[3]) for raw in raws]
        records.sort(key=lambda r: (r.created_at, r.memory_id), reverse=True)
        return records[:limit]

    @redis_boundary
    async def delete_memory(self, user_id: str, memory_id: str) -> bool:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        for _ in range(_ATTEMPTS):
            raw = await self._io.execute("HGET", self._keys.memories(user_id), memory_id)
            if raw is None:
                return False
            memory_type = split_frame(raw, 3)[2].decode()
            reply = await self._io.call(
                MEMORY_DELETE,
                [
                    self._keys.memories(user_id),
                    self._keys.memories_by_time(user_id),
                    self._type_index(user_id, memory_type),
                ],
                [memory_id, memory_type],
            )
            if reply[0] != b"retype":
                return bool(reply[0] == b"ok")
        raise ConflictError(f"memory {memory_id!r} kept changing type while being deleted; retry")

    def _purge_session(self, session_id: str, user_id: str, now_us: int) -> Command:
        """Delete a session for a purge of ``user_id``, unless another user holds it now.

        The session's notes of its *other* users stay, so that a later ``delete_session``
        still takes it out of their lists.
        """
        return SESSION_PURGE.command(self._keys.durable_session(session_id), [now_us, user_id])

    @redis_boundary
    async def purge_user(self, user_id: str) -> int:
        """Delete the user's sessions (durable keys) and memories: two round trips.

        The first reads the session list and the memory types; the second deletes each
        session's keys and, in one script, the user's keys — which refuses, and the purge
        starts over, if a session or a memory type was added in between.
        """
        validate_id(user_id, what="user_id")
        user_keys = [*self._keys.user_sessions(user_id), *self._memory_keys(user_id)]
        for _ in range(_ATTEMPTS):
            sessions, types = await self._io.batch(
                [
                    Command(("ZRANGE", user_keys[0], 0, -1)),
                    Command(("SMEMBERS", self._keys.memory_types(user_id))),
                ]
            )
            session_ids = [sid.decode() for sid in sessions]
            memory_types = sorted(t.decode() for t in types)
            results = await self._io.batch(
                [
                    *(self._purge_session(sid, user_id, self._now_us()) for sid in session_ids),
                    USER_PURGE.command(
                        [*user_keys, *(self._type_index(user_id, t) for t in memory_types)],
                        [len(session_ids), *memory_types],
                    ),
                ]
            )
            self._decoded.clear()  # the deleted sessions' turns leave no decoded copy
            reply = results[-1]
            if reply[0] == b"ok":
                return len(session_ids) + int(reply[1])
        raise ConflictError(
            f"user {user_id!r} kept getting new sessions or memories while being purged; "
            "stop writes for the user and retry"
        )


DECODED_TURNS_MAX_BYTES = 8 * 1024 * 1024
"""Payload bytes a durable store's :class:`DecodedTurns` keeps at most (the decoded turns
take about as much again)."""
DECODED_TURNS_SIZE = 1_024
"""Decoded turns a durable store's :class:`DecodedTurns` keeps at most."""


class DecodedTurns:
    """The turns decoded from recently read archive payloads, by payload (a bounded LRU).

    Why: the summaries re-read a session's recent turns from the archive on most turns
    (``get_turns``), and validating each stored JSON turn again was the largest decoding
    cost of a Redis durable tier's turn path. A payload is the stored JSON itself, so the
    same bytes always decode to the same turn; a redacted or rewritten turn has other bytes
    and is decoded afresh. Turns are frozen models, shared as the hot store's snapshots
    share theirs. Expiry is checked on the frame before the cache is asked.

    Bounded by count and by payload bytes (a turn may be 1 MiB, so 1024 of them alone could
    hold 1 GiB, plus their decoded copies); a payload larger than a sixteenth of
    ``max_bytes`` is decoded every time and never kept. The count is what the summaries
    re-read (a few tens of turns per session, for a few tens of sessions at once): each
    kept turn is a handful of objects the garbage collector walks on every full
    collection. :meth:`clear` empties it when the store erases a turn.
    """

    def __init__(
        self, size: int = DECODED_TURNS_SIZE, *, max_bytes: int = DECODED_TURNS_MAX_BYTES
    ) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._largest = max_bytes // 16
        self._held = 0
        self._turns: OrderedDict[bytes, Turn] = OrderedDict()

    def clear(self) -> None:
        """Forget every decoded turn (after an erasure: no copy is left behind)."""
        self._turns.clear()
        self._held = 0

    @property
    def held_bytes(self) -> int:
        """Payload bytes the cache holds now (for tests and metrics)."""
        return self._held

    def decode(self, payloads: Iterable[bytes], *, session_id: str) -> list[Turn]:
        """As :func:`~tiermem.store.codec.decode_turns` (an undecodable payload is skipped
        and logged), answering the payloads seen lately from the cache."""
        turns: list[Turn] = []
        cache = self._turns
        for payload in payloads:
            turn = cache.get(payload)
            if turn is not None:
                cache.move_to_end(payload)
                turns.append(turn)
                continue
            decoded = decode_turns((payload,), session_id=session_id)
            if decoded:
                if len(payload) <= self._largest:
                    cache[payload] = decoded[0]
                    self._held += len(payload)
                    while len(cache) > self._size or self._held > self._max_bytes:
                        self._held -= len(cache.popitem(last=False)[0])
                turns.append(decoded[0])
        return turns


def live_turns(
    raws: Sequence[bytes], now_us: int, session_id: str, decoded: DecodedTurns | None = None
) -> list[Turn]:
    """The live turns of archive frames; an undecodable one is skipped and logged."""
    frames = [split_frame(raw, 1) for raw in raws]
    payloads = (
        payload for expires_us, payload in frames if not expires_us or int(expires_us) > now_us
    )
    if decoded is not None:
        return decoded.decode(payloads, session_id=session_id)
    return decode_turns(payloads, session_id=session_id)


def _live_turn(raw: bytes, now_us: int) -> Turn | None:
    expires_us, payload = split_frame(raw, 1)
    if expires_us and int(expires_us) <= now_us:
        return None
    return decode_turn(payload)


def _lives(lifetime: bytes | None, now_us: int) -> bool:
    """Whether a session whose horizon field is ``lifetime`` lives at ``now_us``."""
    return lifetime == b"inf" or (lifetime is not None and int(lifetime) > now_us)


def _live_memory(raw: bytes, now_us: int) -> MemoryRecord | None:
    """A memory hash value ('version|expires_us|type|json'), or None once it has expired."""
    _, expires_us, _, payload = split_frame(raw, 3)
    if expires_us and int(expires_us) <= now_us:
        return None
    return decode_memory(payload)


def _is_valid_id(value: object) -> bool:
    try:
        validate_id(value, what="memory type")
    except ValidationError:
        return False
    return True
