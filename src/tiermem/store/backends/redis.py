"""Redis backend: both storage roles on Redis or Redis Cluster (needs the ``redis`` extra).

:class:`RedisHotStore` is the production hot tier; :class:`RedisDurableStore` keeps the
archive, session records and long-term memory in Redis, durable only as far as the server's
AOF/RDB configuration makes it. The code lives in ``redis_hot`` (hot tier and activity
index), ``redis_durable`` (durable tier), ``redis_append`` (the append scripts, the hot and
the durable one and both in one), ``redis_snapshots`` (the hot store's copy of the sessions
it read, so a read decodes only what changed) and ``redis_scripts`` (key builder, command
runner, error boundary); this module is the public entry point.

Key layout (``tm`` is the ``prefix``; ``<sid>``, ``<uid>``, ``<type>`` are ids escaped with
:func:`~tiermem.store.keys.escape_segment`, so an id containing ``{ } :`` can never leave
its hash tag; keys are built only by :class:`RedisKeys`)::

    tm:
    ├── {s=<sid>}:                      one session = one hash tag = one cluster slot
    │   ├── meta      hash   v version · n next turn index · x expires_us · m metadata json ·
    │   │                    e epoch (a token set when the session starts afresh or is
    │   │                    restored: readers' cached copies key on epoch and version) ·
    │   │                    w write ids of the last 8 hot appends (" id:version:start ...") ·
    │   │                    d the native deadline (µs) the four hot keys were last given ·
    │   │                    ev, sv the versions at which ent and state last changed, and
    │   │                    c the version of the last write that kept them: they say
    │   │                    something only while c = v (scripts that predate them move v
    │   │                    alone); ``load`` sends ent or state only when the reader's
    │   │                    cached marker differs
    │   ├── turns     list   the last `window` turns (Turn json)
    │   ├── ent       hash   kind → ActiveEntity json
    │   ├── state     hash   name → "version|updated_us|data json"
    │   │             (hot keys: native TTL at least expires_at − now + gc_grace and at
    │   │              most 1/8 more, re-set by a write only when that no longer holds:
    │   │              see "Native TTLs")
    │   ├── archive   list   "expires_us|Turn json"; list position = turn index
    │   ├── records   hash   kind → "version|lifetime_us|updated_us|data json" (lifetime_us:
    │   │                    the session's lifetime when the record was written, "" forever)
    │   ├── dmeta     hash   the session header: h lifetime (latest expires_at of any durable
    │   │                    write, "inf" = forever) · o owner user_id · c created_at µs of
    │   │                    the owner's registration · w the write ids of the last 8 appends
    │   │                    (" id:first:count ...", for blind retries) · u=<user_id> for
    │   │                    each user whose list may name the session (read by
    │   │                    delete_session) · t the native deadline (µs) its keys were
    │   │                    last given
    │   └── idem      hash   idempotency key → "first index|count" of the append that used it
    │             (durable keys: native TTL = lifetime − now + gc_grace, up to 1/8 more
    │              after an append, re-set when that no longer holds; none while "inf")
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

Round trips per call (once a script is in the server's cache; a NOSCRIPT costs a SCRIPT
LOAD and a resend: one more round trip for a lone script call on a standalone client,
which sends both together, two otherwise). Counted by
``tests/integration/test_redis_specific.py``:

* 1 (one EVALSHA): hot ``append_turns`` (with its entity change, when it has one),
  ``put_metadata``, ``update_entities``, ``put_state``, ``copy_state``, ``touch``, while the
  session's activity mark is not due (see "Activity index": +1 command in the same round
  trip when it is, and always for ``restore``; +1 round trip when a write that sent no
  mark starts the session afresh, or to undo a mark when the session refuses the write);
  :meth:`RedisHotStore.append_through` -- the durable append and the hot append of a
  turn, idempotency key, write id, lifetime, entity change on both tiers and window trim,
  in one script: **a plain turn of a Redis + Redis deployment is one round trip**, and so
  is one that changes an entity; ``load`` (also with ``include_expired``; it answers only
  what changed since this store's last read or write of the session, see
  ``redis_snapshots``: the entities and the state only when a write changed them since),
  ``get_state``, ``delete``, ``release_expired``; durable
  ``append_turns`` (one EVALSHA: turns, index allocation, idempotency key, write id,
  entity change, lifetime and TTLs; a repeated key or write id is answered by the same
  script), ``next_index``, ``get_turn``, ``get_turns``, ``tail_turns``, ``get_session``,
  ``list_sessions``, ``get_record``, ``put_record``, ``put_memory`` (+1 when a memory
  changes type), ``get_memory``, ``query_memories``; durable ``register_session`` refused
  because another user holds the id.
* 2: durable ``register_session`` (the claim in the session's slot, then the user's list
  in the user's slot), ``redact_turn``, ``delete_session``, ``delete_memory``,
  ``purge_user`` (+2 per retry when the user gains a session or a memory type meanwhile).
* 3 per round: hot ``claim_expired`` (due entries of every shard; the candidates' real
  expiries; the leases), at most 8 rounds.

With ``WAIT`` on (see "Replication and WAIT"), a durable append, ``append_through`` and
``put_record`` stay one round trip: WAIT goes in the same pipeline as the script.

Client CPU. On a standalone client (the ones :func:`client_from_url` builds), every
command, script call and pipeline of the stores and of the Redis search index goes
through :class:`~tiermem.store.backends.redis_scripts.DirectLane`: packed by hiredis in
one piece and sent on a pooled connection kept by the lane, without redis-py's
per-command machinery (about half the client CPU of a call; see the class), its replies
read straight from the connection's hiredis reader. Calls made while another of the
lane's round trips is in flight (many sessions at once) are coalesced: the calls of one
turn of the event loop go in one write on one connection, each still its own unit with
its own replies, handed over as soon as they are read (round trips are counted per call;
commands whose replies do not pair one to one with them, such as SUBSCRIBE, never take
the lane). At 50 sessions this cut the client's
CPU per turn by 27-40% and redis-server's by 23-43%, and at 500 sessions the p99 of
``add_turn`` from ~1 s to ~0.2 s (every call now waits its turn in the queue instead of
some starving for a pooled connection; the median rose from ~35 to ~85 ms). A cluster
client keeps redis-py's own path.

Retried writes. Every durable append (alone or in ``append_through``) carries a write id
the store makes for the call; the script records the last few in the session header and
answers a second arrival of the same id as it answers a repeated idempotency key: nothing
written, the stored turns returned. So a client that resends a script after a lost reply
(redis-py's retries, which the clients built here keep off, or a cluster client's) cannot
append a turn twice. A hot ``append_turns`` does the same with its own write id (meta
``w``). The other hot writes rewrite the same values when resent (their version grows by
one more); the clients built here keep redis-py's automatic retries off all the same.

Redis Cluster. ``TIERMEM_REDIS_CLUSTER=true`` (``cluster=True`` to :func:`client_from_url`
and the stores' ``from_url``) builds a :class:`redis.asyncio.cluster.RedisCluster` from
the startup node(s) in ``TIERMEM_REDIS_URL`` (comma-separated; one reachable node is
enough); :func:`~tiermem.store.backends.redis_scripts.cluster_client_from_url` is the one
place it is built. Every script's keys share one hash tag, so each runs on one slot;
``tiermem doctor`` reports standalone or cluster, the number of masters, and checks with
``CLUSTER KEYSLOT`` that a session's keys and a user's keys each hash to one slot
(:mod:`~tiermem.store.backends.redis_cluster`). Two clients built from the same startup
nodes count as one server, so the one-script turn path applies on a cluster too.

What redis-py's cluster client does by default, and what the client built here does
instead (tested on a real 3-master cluster by ``tests/integration/test_redis_cluster.py``):

* It resends a command after a connection error or a timeout (3 times), and a pipeline
  resends every command that failed or answered a falsy value. Off here (``retry`` with
  0 retries): a failed command surfaces as a retryable
  :class:`~tiermem.errors.BackendUnavailableError` / ``BackendTimeoutError``.
* It routes the first commands of a new client (or of one that just lost a connection)
  before it knows the slot map; each answer is MOVED, and every 5th MOVED makes it close
  *all* its connections, under the commands other tasks have in flight: their commands
  fail with ``Connection closed by server`` or ``AttributeError: 'NoneType' object has no
  attribute 'writelines'`` (the issue's failures; redis-py issues #3835, #4322). Here the
  store has the client learn the slot map before each command (a no-op once known) and
  follows a MOVED by patching that slot (``reinitialize_steps=0``); an AttributeError that
  redis-py's own recovery still causes (a failover) is mapped to
  ``BackendUnavailableError``, never raised raw.
* MOVED and ASK (the command did not run) are followed inside the client. During a slot
  migration redis-py sends ASKING on another pooled connection than the command, so a
  script on the migrating slot bounces until the migration ends and redis-py gives up
  ("TTL exhausted"); that, and a slot not covered, surface as a retryable
  ``BackendUnavailableError`` saying the command did not run.

A resent write (the application retrying after a timeout, or a user-built client with
retries on): a durable or hot append carries a write id (above) and is answered as the
first arrival; ``register_session``, ``redact_turn``, the deletes and ``purge_user`` are
idempotent; an unconditional ``put_record``/``put_memory``/``put_metadata``/
``put_state``/``update_entities``/``touch`` writes the same value again (its version grows
by one more); a compare-and-set one (``expected_version``) that had applied answers
:class:`~tiermem.errors.ConflictError` the second time -- re-reading shows the caller's
own value, nothing is written twice.

Failover: Redis replicates asynchronously, so when a master dies its replica may take
over without the last writes it acknowledged. With SQLite or DynamoDB as the durable tier
only the hot copy is affected (a hot miss reloads from the durable tier); with Redis as
the durable tier those turns are lost, unless ``WAIT`` is on (below). While the dead
master's slots have no master
(``cluster-node-timeout`` plus the replica's election, a few seconds) every command on
them fails fast with a retryable ``BackendUnavailableError``: the service answers those
sessions from the durable tier (write-through) and the hot tier serves them again once
the replica is promoted (``tests/integration/test_redis_failover.py``, 3 masters + 3
replicas, SIGKILL mid-load, 0 acknowledged turns lost on SQLite).

What replication can lose with Redis as the durable tier: every write the master
acknowledged that had not reached the replica when it died -- on loopback a few
milliseconds of writes, across a congested network or a slow replica up to its whole
replication backlog. The lost turns are the session's *last* ones, so its indexes stay
gap-free and the next append reuses their indexes (an idempotency key the client keeps
re-sending is not found and is applied again). Nothing flags the loss unless ``WAIT`` is
on.

Replication and WAIT. ``TIERMEM_REDIS_WAIT_REPLICAS=N`` (``replica_wait=ReplicaWait(N,
timeout_ms)`` on :class:`RedisDurableStore`; off by default) makes every durable turn
append -- alone or in ``append_through`` -- and every ``put_record`` send ``WAIT N
timeout_ms`` right after its script, on the same connection and in the same round trip.
WAIT counts only the writes made on its own connection, hence the same connection:
standalone, one non-transactional pipeline; cluster, one pipeline on one connection to the
master of the session's slot (redis-py's cluster pipeline routes every command by its key
and WAIT has none, so :class:`~tiermem.store.backends.redis_scripts.RedisIO` groups the
commands by node itself, follows MOVED by patching the slot map, and rediscovers the
cluster after a failed connection). With WAIT on, the hot store's activity mark always
rides in the same round trip (on its own node), so a plain turn stays one round trip.

* N replicas acknowledge within the timeout: the call returns as before. Those replicas
  have *received* the write (applied in memory; on disk only as their own AOF/RDB settings
  say -- ``WAITAOF``, Redis 7.2+, is not used).
* Fewer do: the write is applied on the master all the same (WAIT undoes nothing) and the
  call raises :class:`~tiermem.errors.NotReplicatedError` (``required``,
  ``acknowledged``). It is ``retryable`` when repeating the call is harmless: an append
  with an idempotency key (the script answers it as a repeat and writes nothing twice) or
  an unconditional ``put_record``. An append without a key is not: a retry would store the
  turns twice (they are readable on the master). A repeat rewrites the session's lifetime
  field with its own value, a replicated no-op, so that the retry's WAIT covers the first
  arrival even on another connection (Redis 7.0, tested here, moves a connection's WAIT
  offset after every command; a server that moves it only after a replicated write would
  otherwise confirm such a retry at once). A write that raised may survive a failover or
  not.

What WAIT guarantees: a turn acknowledged with WAIT N is on N replicas, so a failover that
promotes one of them keeps it. With one replica per master (the tested layout) and N = 1,
the only replica that can be promoted has every acknowledged turn:
``tests/integration/test_redis_wait.py`` kills -9 the master of a loaded session's slot
(3 rounds, 0 acknowledged turns lost) and, with the replica stalled behind a cut link,
shows the failover losing 3 acknowledged turns without WAIT and none with it (each raised
NotReplicatedError instead). What it does not: WAIT is not strong consistency. With more
replicas per master than N, a failover may promote one that did not acknowledge (Redis
Cluster prefers the replica with the largest replication offset, on a best-effort basis;
``CLUSTER FAILOVER FORCE``/``TAKEOVER`` or an operator can pick any); N = the number of
replicas per master rules that out, at the price that one replica down fails every write
with NotReplicatedError until it is back. The master and the acknowledging replicas lost
together, or a master restarted without persistence that its replicas then resync from
(empty), lose acknowledged turns. A master cut off from the majority keeps accepting
writes until ``cluster-node-timeout``; with WAIT those writes raise instead of being
acknowledged. Not waited for: the hot-only writes (the hot tier is rebuilt from the
durable one), ``register_session``, long-term memories (``put_memory``, in the user's
slot), redactions and deletes -- though a waited write confirms every earlier write of
the same master, the session's registration included. Each waited write holds its
connection until the replicas answer (or the timeout), so the client's ``socket_timeout``,
if set, must exceed ``TIERMEM_REDIS_WAIT_TIMEOUT_MS``.

Expiry. A hot session past ``expires_at`` reads as absent; with ``include_expired`` it is
still returned until ``expires_at + gc_grace``, which is also when its native TTL fires.
The first write that goes ahead on it deletes it inside the write's script and starts
afresh; a refused write leaves it for handoff.

Native TTLs. A native TTL only collects what is logically dead (every read checks the
logical expiry or lifetime itself), so it need not follow every write exactly. An append
(and every hot write) gives a tier's keys a TTL 1/8 longer than they need (expiry or
lifetime − now + gc_grace) and records the deadline (hot ``d``, durable ``t``, by the
store's clock like every time here); a later write re-sets them only when that deadline
no longer covers what the write needs, or exceeds it by more than the 1/8 (an expiry
moved earlier). Otherwise it gives only the keys it may have created (an entities hash,
a state hash, the archive, the idempotency keys) the deadline the others have. A session
written every few seconds so re-sets its TTLs about once per eighth of its lifetime,
not with four ``PEXPIRE`` per tier per turn; a dead session's keys linger at most 1/8
of their TTL past ``expires_at + gc_grace``. The durable scripts other than the append
set the exact TTL, as before (and record it in ``t``).

Durable lifetime. The session header (``dmeta``) holds the lifetime, raised (never
lowered) by the same script as each ``register_session``, ``append_turns`` and
``put_record``; that script also re-sets the native TTL of all four durable keys of the
session to lifetime − now + gc_grace, so every key, whenever it was created and whatever
its own write asked for, lives as long as the session (an append may give them up to 1/8
more, see "Native TTLs"). Turns keep their own logical
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
cluster neither a Lua script nor MULTI may span slots. The entry need not follow every
write: ``claim_expired`` reads each due candidate's real expiry before leasing it and
moves the entry of a session that is in fact live. So a write leaves the index alone
unless a mark is due: the store has not marked the session yet, the expiry moves earlier
than its last mark, or that mark falls due within half the remaining time (with a sliding
30-minute expiry: about one mark per session every 15 minutes). A due mark goes in the
same non-transactional pipeline as the session script (mark score = new expiry, lease
cleared, previous entry returned); if the session refused the write, the mark is put back,
guarded by a token so that a later write's mark is never undone. A write that starts the
session afresh (it had expired, been claimed or been deleted) must clear any lease and
always marks, in a second round trip when the store did not expect it. A lost mark (the
connection drops between the commands) leaves a stale entry that the session's next due
mark or ``claim_expired`` repairs. Caveat: the "last mark" is remembered per process, so
when several processes write one session and one of them moves the expiry earlier than
another's latest mark, the handoff waits for that later mark.
"""

from tiermem.store.backends.redis_durable import RedisDurableStore
from tiermem.store.backends.redis_hot import RedisHotStore
from tiermem.store.backends.redis_scripts import RedisKeys, ReplicaWait, client_from_url

__all__ = ["RedisDurableStore", "RedisHotStore", "RedisKeys", "ReplicaWait", "client_from_url"]
