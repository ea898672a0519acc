"""Redis backend: both storage roles on Redis or Redis Cluster (needs the ``redis`` extra).

:class:`RedisHotStore` is the production hot tier; :class:`RedisDurableStore` keeps the
archive, session records and long-term memory in Redis, durable only as far as the server's
AOF/RDB configuration makes it. The code lives in ``redis_hot`` (hot tier and activity
index), ``redis_durable`` (durable tier) and ``redis_scripts`` (key builder, command
runner, error boundary); this module is the public entry point.

Key layout (``tm`` is the ``prefix``; ``<sid>``, ``<uid>``, ``<type>`` are ids escaped with
:func:`~tiermem.store.keys.escape_segment`, so an id containing ``{ } :`` can never leave
its hash tag; keys are built only by :class:`RedisKeys`)::

    tm:
    ├── {s=<sid>}:                      one session = one hash tag = one cluster slot
    │   ├── meta      hash   v version · n next turn index · x expires_us · m metadata json
    │   ├── turns     list   the last `window` turns (Turn json)
    │   ├── ent       hash   kind → ActiveEntity json
    │   ├── state     hash   name → "version|updated_us|data json"
    │   │             (hot keys: native TTL = expires_at − now + gc_grace, set on every write)
    │   ├── archive   list   "expires_us|Turn json"; list position = turn index
    │   ├── records   hash   kind → "version|lifetime_us|updated_us|data json" (lifetime_us:
    │   │                    the session's lifetime when the record was written, "" forever)
    │   ├── dmeta     hash   the session header: h lifetime (latest expires_at of any durable
    │   │                    write, "inf" = forever) · o owner user_id · c created_at µs of
    │   │                    the owner's registration · u=<user_id> for each user whose list
    │   │                    may name the session (read by delete_session)
    │   └── idem      hash   idempotency key → "first index|count" of the append that used it
    │             (durable keys: native TTL = lifetime − now + gc_grace, re-set on every
    │              durable write; none while "inf")
    ├── {u=<uid>}:                      one user = one hash tag = one cluster slot
    │   ├── sessions       zset  session_id, score created_at µs
    │   ├── session_refs   hash  session_id → SessionRef json
    │   ├── mem            hash  memory_id → "version|expires_us|<type>|MemoryRecord json"
    │   ├── mem:all        zset  memory_id, score created_at µs (every type)
    │   ├── mem:t=<type>   zset  memory_id, score created_at µs (one type)
    │   ├── mem:types      set   <type> of every mem:t= key (so purge can find them)
    │   └── umeta          hash  h horizon of the memory keys, as for dmeta
    ├── shared:<name>                   string "version|expires_us|updated_us|data json": a blob
    │                                   shared by every worker (breakers); one key, any slot
    └── act:{<n>}                       activity shard n = crc32(session_id) % activity_shards
        ├── (itself)  zset   session_id, score = logical expires_us
        ├── :lease    hash   session_id → "until_us|owner"
        └── :mark     hash   session_id → token of the last write that marked it

All times are microseconds since the epoch from the store's injected clock, passed to Lua
as arguments (never the server's TIME), so ``expires_at`` round-trips exactly and a fake
clock governs expiry. No request path uses KEYS or SCAN.

Round trips per call (once a script is in the server's cache; a NOSCRIPT costs one
SCRIPT LOAD and a resend):

* 1: hot ``append_turns``, ``put_metadata``, ``update_entities``, ``put_state``,
  ``restore``, ``copy_state``, ``touch`` (the session script and the activity mark in one
  pipeline; +1 to undo the mark when the session refuses the write: a conflict, or
  ``update_entities``/``copy_state``/``touch`` of an absent session, or ``copy_state`` of
  a version the session holds), ``load`` (also with ``include_expired``), ``get_state``,
  ``delete``, ``release_expired``; durable ``append_turns`` (one EVALSHA: turns, index
  allocation, idempotency key, lifetime and TTLs; a repeated key is answered by the same
  script), ``next_index``, ``get_turn``, ``get_turns``, ``tail_turns``, ``get_session``,
  ``list_sessions``, ``get_record``, ``put_record``, ``put_memory`` (+1 when a memory
  changes type), ``get_memory``, ``query_memories``; durable ``register_session`` refused
  because another user holds the id.
* 2: durable ``register_session`` (the claim in the session's slot, then the user's list
  in the user's slot), ``redact_turn``, ``delete_session``, ``delete_memory``,
  ``purge_user`` (+2 per retry when the user gains a session or a memory type meanwhile).
* 3 per round: hot ``claim_expired`` (due entries of every shard; the candidates' real
  expiries; the leases), at most 8 rounds.

Expiry. A hot session past ``expires_at`` reads as absent; with ``include_expired`` it is
still returned until ``expires_at + gc_grace``, which is also when its native TTL fires.
The first write that goes ahead on it deletes it inside the write's script and starts
afresh; a refused write leaves it for handoff.

Durable lifetime. The session header (``dmeta``) holds the lifetime, raised (never
lowered) by the same script as each ``register_session``, ``append_turns`` and
``put_record``; that script also re-sets the native TTL of all four durable keys of the
session to lifetime − now + gc_grace, so every key, whenever it was created and whatever
its own write asked for, lives as long as the session. Turns keep their own logical
expiry inside the archive. Reads of the owner, records and idempotency keys check the
lifetime; a write to a session whose lifetime has passed first drops what is left of it
(archive, records, keys, owner), so nothing of a dead session reappears and its numbering
starts again at 0 (until then ``next_index`` reads where it was).

Ownership. The owner lives in the session's slot, the user's list in the user's, and no
script may span both. ``register_session`` claims the id in the session's slot (one
script: refuse if another user holds it while it lives, else own it and extend the
lifetime), and only then adds it to the user's list. A crash in between leaves an owned
session missing from its owner's list (``get_session`` still names the owner, and other
users are still refused); both steps are idempotent for the owner, so the owner's next
``register_session`` of the id repairs it. The list
is the user's history: an entry stays after the session dies (``purge_user`` then
deletes the session only if no other user has registered the id since).

Activity index. A session's keys and its activity shard hash to different slots, and in a
cluster neither a Lua script nor MULTI may span slots. A write therefore sends two commands
in one non-transactional pipeline: the session script, which decides, and then the shard's
mark script (score = new expiry, lease cleared, previous entry returned). If the session
refused the write, the mark is put back, guarded by a token so that a later write's mark
is never undone. If the mark is lost (the connection drops between the two), the entry is
stale; ``claim_expired`` reads each candidate session's real expiry before leasing it and
repairs entries whose session is in fact live, and the session's next write rewrites it.
A session whose very first mark is lost is found only after its next write.
"""

from tiermem.store.backends.redis_durable import RedisDurableStore
from tiermem.store.backends.redis_hot import RedisHotStore
from tiermem.store.backends.redis_scripts import RedisKeys, client_from_url

__all__ = ["RedisDurableStore", "RedisHotStore", "RedisKeys", "client_from_url"]
