"""Redis plumbing shared by :mod:`~tiermem.store.backends.redis_hot` and
:mod:`~tiermem.store.backends.redis_durable`: the key builder, value framing, how Lua
scripts are addressed and run (each store keeps its own scripts beside the code that calls
them), the one door through which every command goes (with ``WAIT`` on the write's own
connection when a durable write must reach replicas: :class:`ReplicaWait`), and the error
boundary.

The key layout and the design are drawn in :mod:`tiermem.store.backends.redis`.

Limits of the cluster ``WAIT`` path (:meth:`RedisIO.send_waited`): it drives redis-py's
per-node pipeline (``ClusterNode.execute_pipeline``) and slot map (``NodesManager``)
directly, as redis-py 8.1 has them (it returns the connection to the pool on every error
and closes one whose replies were not all read); it follows at most
:data:`_MOVED_FOLLOWED` MOVED answers per call and no ASK (a slot being migrated answers
a retryable error). A node whose connection failed -- when sending, or while its replies
were read -- makes the client rediscover the cluster before the error is raised.

Lua scripts never read the server's clock: the store passes ``now`` (microseconds since
the epoch, from its injected clock) as an argument, so a test's fake clock governs logical
expiry on the server exactly as it does in the reference backend. Every script declares
all the keys it touches, and all of them share one hash tag, so each runs on one slot of
a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import time
import traceback
import zlib
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, ParamSpec, Self, TypeVar, cast, overload
from urllib.parse import urlsplit

import hiredis
import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis._parsers.hiredis import _AsyncHiredisParser
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tiermem.clock import Clock, SystemClock
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    NotReplicatedError,
    ValidationError,
)
from tiermem.models import NewTurn
from tiermem.store.codec import check_aware, check_kind, encode_turn
from tiermem.store.contract import EntityChange
from tiermem.store.keys import escape_segment

__all__ = [
    "BACKEND_NAME",
    "Arg",
    "CancelGuard",
    "Command",
    "DirectLane",
    "LuaScript",
    "RedisClient",
    "RedisIO",
    "RedisKeys",
    "RedisStoreBase",
    "ReplicaWait",
    "client_from_url",
    "closed_under_command",
    "cluster_client_from_url",
    "entity_args",
    "from_us",
    "grace_ms",
    "map_redis_error",
    "new_write_id",
    "optional_int",
    "optional_us",
    "redis_boundary",
    "same_server",
    "split_frame",
    "to_us",
    "turn_template",
]

BACKEND_NAME = "redis"

logger = logging.getLogger(__name__)

RedisClient = Redis | RedisCluster
"""A standalone or cluster asyncio client; the stores use only what both offer."""

Arg = str | bytes | int
"""One argument of a Redis command, as redis-py encodes it."""


# -- keys ---------------------------------------------------------------------------------

_TAGS_KEPT = 4096
"""Sessions whose escaped hash tag a :class:`RedisKeys` remembers."""
_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class RedisKeys:
    """Every key the Redis backend uses, built from labelled, escaped segments.

    Ids pass through :func:`~tiermem.store.keys.escape_segment`, which percent-encodes
    ``{ } :`` and the other reserved characters, so an id can never close the hash tag it
    sits in or imitate another key. The tree is drawn in :mod:`tiermem.store.backends.redis`.
    """

    def __init__(self, prefix: str, *, activity_shards: int = 16) -> None:
        if not prefix or not set(prefix) <= _PREFIX_CHARS:
            raise ValidationError(
                f"Redis key prefix {prefix!r} must be non-empty and use only letters, digits, "
                "'_', '.' and '-' (it may not contain hash-tag braces or ':')"
            )
        if activity_shards < 1:
            raise ValidationError(f"activity_shards must be at least 1, got {activity_shards}")
        self.prefix = prefix
        self.activity_shards = activity_shards
        self._session_tags: dict[str, str] = {}
        self._user_tags: dict[str, str] = {}
        self._turn_keys: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        """Session → (hot keys, durable + hot keys): see :meth:`hot_keys`."""

    def _session(self, session_id: str, part: str) -> str:
        tag = self._session_tags.get(session_id)
        return (tag or self._tag(self._session_tags, "s", session_id)) + part

    def _user(self, user_id: str, part: str) -> str:
        tag = self._user_tags.get(user_id)
        return (tag or self._tag(self._user_tags, "u", user_id)) + part

    def _tag(self, tags: dict[str, str], kind: str, ident: str) -> str:
        """``"<prefix>:{<kind>=<escaped id>}:"``, remembered in ``tags`` (bounded): escaping
        walks the id character by character, and a turn builds a session's keys several
        times, the index a user's keys for every write of each user."""
        if len(tags) >= _TAGS_KEPT:
            tags.clear()
        tag = tags[ident] = f"{self.prefix}:{{{kind}={escape_segment(ident)}}}:"
        return tag

    # hot tier: one session
    def hot_session(self, session_id: str) -> list[str]:
        """meta, turns, entities, state: the keys every hot session script declares, in order."""
        tag = self._session(session_id, "")
        return [tag + "meta", tag + "turns", tag + "ent", tag + "state"]

    def hot_meta(self, session_id: str) -> str:
        return self._session(session_id, "meta")

    def hot_state(self, session_id: str) -> str:
        return self._session(session_id, "state")

    def hot_keys(self, session_id: str) -> tuple[str, ...]:
        """:meth:`hot_session` as a tuple remembered per session (bounded), for the calls
        of every turn: the same key objects each time, so neither the keys nor their
        hashes (the packed script heads of :meth:`RedisIO._packed_call` are looked up by
        them) are built again."""
        return (self._turn_keys.get(session_id) or self._remember_keys(session_id))[0]

    def through_keys(self, session_id: str) -> tuple[str, ...]:
        """:meth:`durable_session` then :meth:`hot_session` (the keys of an append to both
        tiers), remembered as :meth:`hot_keys` is."""
        return (self._turn_keys.get(session_id) or self._remember_keys(session_id))[1]

    def _remember_keys(self, session_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if len(self._turn_keys) >= _TAGS_KEPT:
            self._turn_keys.clear()
        hot = tuple(self.hot_session(session_id))
        both = self._turn_keys[session_id] = (hot, (*self.durable_session(session_id), *hot))
        return both

    # durable tier: one session
    def durable_session(self, session_id: str) -> list[str]:
        """archive, records, dmeta, idem: the keys every durable session script declares,
        in order."""
        tag = self._session(session_id, "")
        return [tag + "archive", tag + "records", tag + "dmeta", tag + "idem"]

    def archive(self, session_id: str) -> str:
        return self._session(session_id, "archive")

    def records(self, session_id: str) -> str:
        return self._session(session_id, "records")

    def durable_meta(self, session_id: str) -> str:
        return self._session(session_id, "dmeta")

    def idempotency_keys(self, session_id: str) -> str:
        return self._session(session_id, "idem")

    # durable tier: one user
    def user_sessions(self, user_id: str) -> list[str]:
        """The user's session list: sorted set by created_at, and the refs' payloads."""
        return [self._user(user_id, "sessions"), self._user(user_id, "session_refs")]

    def memories(self, user_id: str) -> str:
        return self._user(user_id, "mem")

    def memories_by_time(self, user_id: str) -> str:
        return self._user(user_id, "mem:all")

    def memory_types(self, user_id: str) -> str:
        return self._user(user_id, "mem:types")

    def user_meta(self, user_id: str) -> str:
        return self._user(user_id, "umeta")

    def memories_of_type(self, user_id: str, memory_type: str) -> str:
        return self._user(user_id, f"mem:t={escape_segment(memory_type)}")

    # hot tier: the shared keyspace (no session)
    def shared(self, name: str) -> str:
        """One shared blob: a single key, so any script on it runs on one cluster slot. The
        escaped name holds no ``:`` or braces, so it can never imitate a session's key."""
        return f"{self.prefix}:shared:{escape_segment(name)}"

    # activity index
    def activity_shard(self, session_id: str) -> int:
        """Which shard of the activity index holds a session (stable across processes)."""
        return zlib.crc32(session_id.encode()) % self.activity_shards

    def activity(self, shard: int) -> list[str]:
        """The shard's sorted set (score = logical expiry), lease hash and mark hash."""
        base = f"{self.prefix}:act:{{{shard}}}"
        return [base, f"{base}:lease", f"{base}:mark"]

    def activity_of(self, session_id: str) -> list[str]:
        return self.activity(self.activity_shard(session_id))


# -- time and framing ---------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(value: datetime, *, what: str = "timestamp") -> int:
    """Microseconds since the epoch: exact, so an ``expires_at`` round-trips unchanged.

    A datetime in UTC (what the library's clocks give) is counted from its timedelta's
    fields, without the checks and the timedelta division (~4k instructions against ~7k).

    Raises:
        ValidationError: ``value`` is naive.
    """
    if type(value) is datetime and value.tzinfo is UTC:
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    check_aware(value, what=what)
    return (value - _EPOCH) // _MICROSECOND


def from_us(value: int | bytes | str) -> datetime:
    # timedelta * int, not timedelta(microseconds=...): the same exact value, at half the
    # cost of the keyword constructor (read on every session load).
    return _EPOCH + _MICROSECOND * int(value)


def optional_us(value: datetime | None) -> str:
    """An optional expiry as a script argument: '' means never."""
    return "" if value is None else str(to_us(value, what="expires_at"))


def optional_int(value: int | None) -> Arg:
    """An optional number as a script argument: '' means not given."""
    return "" if value is None else value


def grace_ms(gc_grace: timedelta) -> int:
    """The grace period of native TTLs in milliseconds.

    Raises:
        ValidationError: it is negative.
    """
    if gc_grace < timedelta(0):
        raise ValidationError(f"gc_grace must not be negative, got {gc_grace}")
    return gc_grace // timedelta(milliseconds=1)


def split_frame(raw: bytes, fields: int) -> list[bytes]:
    """Split a framed value ``f1|f2|...|payload`` into ``fields`` header fields + payload."""
    return raw.split(b"|", fields)


_INDEX_TAIL = ',"index":0}'


def turn_template(turn: NewTurn) -> str:
    """A turn's JSON without its closing index field, for a script to finish.

    Indexes are allocated inside Lua, so the script appends ``,"index":N}``. pydantic
    writes fields in declaration order and ``index`` is :class:`~tiermem.models.Turn`'s
    last field. The shared size check runs here, before any I/O.
    """
    payload = encode_turn(turn.with_index(0))
    if not payload.endswith(_INDEX_TAIL):  # pragma: no cover - guards a model change
        raise RuntimeError("Turn JSON no longer ends with its index field; fix turn_template")
    return payload[: -len(_INDEX_TAIL)]


def entity_args(change: EntityChange | None) -> list[Arg]:
    """An append's entity change as script arguments: n removed, n upserts, the removed
    kinds, then kind/json pairs (what the scripts in ``redis_append`` read).

    Raises:
        ValidationError: a kind is not a valid id.
    """
    if change is None:
        return [0, 0]
    for kind in [*change.upsert, *change.remove]:
        check_kind(kind, what="entity kind")
    pairs = [part for kind, e in change.upsert.items() for part in (kind, e.model_dump_json())]
    return [len(change.remove), len(change.upsert), *change.remove, *pairs]


_WRITE_IDS = itertools.count()
_PROCESS_TAG = os.urandom(6).hex()


def _new_process_tag() -> None:
    global _PROCESS_TAG  # a forked child must not reuse its parent's ids
    _PROCESS_TAG = os.urandom(6).hex()


os.register_at_fork(after_in_child=_new_process_tag)


def new_write_id() -> str:
    """A token unique to this call among every process's (a random per-process prefix and
    a counter: cheaper than a random token per call). Hex only: the scripts match it with
    Lua patterns. Used as a durable append's write id and as a hot session's epoch."""
    return f"{_PROCESS_TAG}{next(_WRITE_IDS):x}"


# -- scripts and commands -----------------------------------------------------------------
#
# Conventions of every script: ARGV[1] is ``now`` in microseconds from the store's clock.
# Numbers are written with string.format('%d') because Lua's tostring() rounds to 14
# digits. Framed values start with decimal header fields separated by '|'. Write scripts
# answer a table whose first element is 'ok' when they wrote, or else a reason
# ('conflict', 'index', 'absent', 'retype', 'retry'), and then they changed nothing.
# On the turn path a number is read from a string the scripts know to be a decimal
# (an argument, a field they wrote) as ``s + 0``, not ``tonumber(s)``: Lua 5.1's tonumber
# parses the string twice (lua_isnumber, then lua_tonumber), each a strtod of ~600
# instructions for a microsecond timestamp, and a turn ran ~21 of them
# (bench/redis_server_profile.py). ``tonumber`` stays where a value may be false or nil.


class LuaScript:
    """A Lua script addressed by its SHA1; loaded into the server's cache on first NOSCRIPT."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def command(self, keys: Sequence[str], args: Sequence[Arg]) -> Command:
        return Command(("EVALSHA", self.sha, len(keys), *keys, *args), self)

    def __repr__(self) -> str:
        return f"LuaScript({self.name!r})"


@dataclass(frozen=True)
class Command:
    """One command of a pipeline; ``script`` is set when it is an EVALSHA."""

    args: tuple[Arg, ...]
    script: LuaScript | None = None

    @property
    def first_key(self) -> Arg:
        """The key that routes the command in a cluster (every key of a command shares
        its hash tag): an EVALSHA's first declared key, else the first argument."""
        return self.args[3] if self.script is not None else self.args[1]


MAX_WAIT_TIMEOUT_MS = 60_000
"""The longest a write may wait for its replicas (WAIT's timeout; 0 would block forever)."""


@dataclass(frozen=True)
class ReplicaWait:
    """Confirm a durable write on ``replicas`` replicas before it returns: Redis ``WAIT
    replicas timeout_ms``, sent on the write's own connection right after it (WAIT counts
    only the writes of its connection). See "Replication and WAIT" in
    :mod:`tiermem.store.backends.redis`.

    ``what`` names the write in the error, and ``unsafe_retry`` says why repeating the call
    would not be harmless ('' when it is: the error is then ``retryable``).

    Raises:
        ValidationError: ``replicas`` < 1, or ``timeout_ms`` outside 1..60000.
    """

    replicas: int
    timeout_ms: int
    what: str = "the write"
    unsafe_retry: str = ""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValidationError(
                f"WAIT needs at least 1 replica, got {self.replicas}; to write without "
                "waiting for replicas set TIERMEM_REDIS_WAIT_REPLICAS=0 (no ReplicaWait)"
            )
        if not 1 <= self.timeout_ms <= MAX_WAIT_TIMEOUT_MS:
            raise ValidationError(
                f"the WAIT timeout must be 1..{MAX_WAIT_TIMEOUT_MS} ms, got {self.timeout_ms}"
                " (0 would block the write forever when a replica is down)"
            )

    def of(self, what: str, *, unsafe_retry: str = "") -> ReplicaWait:
        """The same wait, for one call."""
        return dataclasses.replace(self, what=what, unsafe_retry=unsafe_retry)

    def command(self) -> Command:
        return Command(("WAIT", self.replicas, self.timeout_ms))

    def check(self, reply: Any, acknowledged: Any) -> None:
        """Raise when ``reply`` (a write script's answer) says the write is stored --
        first element ``ok``, or ``repeat`` (an earlier arrival of it is) -- and fewer than
        ``replicas`` replicas acknowledged it.

        Raises:
            NotReplicatedError: it is stored, but not confirmed on enough replicas.
            redis.exceptions.RedisError: WAIT itself failed (mapped at the boundary).
        """
        if not isinstance(reply, list) or not reply or reply[0] not in (b"ok", b"repeat"):
            return  # nothing written ('conflict', 'index', ...): nothing to confirm
        if isinstance(acknowledged, Exception):
            raise acknowledged
        count = int(acknowledged)
        if count >= self.replicas:
            return
        if self.unsafe_retry:
            advice = f"Do not retry the call blindly: {self.unsafe_retry}."
        else:
            advice = (
                "Retrying the same call is harmless (an append with its idempotency key is "
                "recognised and writes nothing twice; a record write stores the same value "
                "again) and waits for the replicas again."
            )
        raise NotReplicatedError(
            f"{self.what} is stored on the Redis master, but only {count} of the "
            f"{self.replicas} replica(s) required (TIERMEM_REDIS_WAIT_REPLICAS) confirmed "
            f"it within {self.timeout_ms} ms: a failover now could lose it. {advice} If "
            "this persists, check the replicas (INFO replication: a replica down, lagging "
            "or unreachable) or raise TIERMEM_REDIS_WAIT_TIMEOUT_MS.",
            backend=BACKEND_NAME,
            required=self.replicas,
            acknowledged=count,
            retryable=not self.unsafe_retry,
        )


@overload
def client_from_url(url: str, *, cluster: Literal[False] = False, **options: Any) -> Redis: ...
@overload
def client_from_url(url: str, *, cluster: bool, **options: Any) -> RedisClient: ...
def client_from_url(url: str, *, cluster: bool = False, **options: Any) -> RedisClient:
    """An asyncio client for a ``redis://``, ``rediss://`` or ``unix://`` URL; with
    ``cluster``, a :class:`~redis.asyncio.cluster.RedisCluster` whose startup nodes are the
    comma-separated URLs (see :func:`cluster_client_from_url`).

    Responses stay bytes (``decode_responses=False``: payloads are UTF-8 JSON and ids are
    decoded where needed). redis-py's automatic retries are off unless ``retry`` is passed:
    a retried EVALSHA whose first attempt reached the server would append the same turns
    twice. Failures surface as retryable :class:`~tiermem.errors.BackendError` instead,
    and callers retry with a version check, which is safe.

    Raises:
        ValidationError: several URLs without ``cluster``, or a URL a cluster cannot use.
    """
    if cluster:
        return cluster_client_from_url(url, **options)
    if "," in url:
        raise ValidationError(
            "the Redis URL lists several servers; that is a Redis Cluster's startup nodes: "
            "set TIERMEM_REDIS_CLUSTER=true (or pass cluster=True), or give one URL"
        )
    options.setdefault("retry", Retry(NoBackoff(), 0))
    options["decode_responses"] = False
    # redis-py's default pool raises MaxConnectionsError once 100 commands are in flight
    # (500 sessions at once did); a blocking pool makes the 101st wait for a free
    # connection instead, so a burst queues in the client rather than failing.
    options.setdefault("max_connections", DEFAULT_MAX_CONNECTIONS)
    options.setdefault("timeout", DEFAULT_POOL_TIMEOUT_S)
    return Redis.from_pool(BlockingConnectionPool.from_url(url, **options))


DEFAULT_MAX_CONNECTIONS = 100
"""Connections per client built by ``from_url`` (redis-py's own default size). A service's
standalone Redis parts share one client whose pool is this times the parts sharing it
(see composition)."""
DEFAULT_POOL_TIMEOUT_S = 20.0
"""Seconds a command waits for a free pooled connection before failing (retryable)."""


def cluster_client_from_url(urls: str | Sequence[str], **options: Any) -> RedisCluster:
    """A :class:`~redis.asyncio.cluster.RedisCluster` discovering the cluster from its
    startup nodes: ``urls`` is one URL, a comma-separated list or a sequence of them (the
    first URL's credentials and TLS apply to every node). Any one reachable node is enough.

    Retries: a cluster client by default resends a command after a connection error or a
    timeout, and a pipeline resends every command that failed or answered nothing, after
    closing every connection of the client (under the feet of the other tasks using it).
    A resent durable or hot append is harmless (its write id, see
    :mod:`tiermem.store.backends.redis`), but the other write scripts are not all
    idempotent, so retries are off here (``retry`` with 0 retries): a failed command
    surfaces as a retryable :class:`~tiermem.errors.BackendError`, and the client
    rediscovers the slots on its next command. MOVED and ASK redirections (the command
    was not run) are still followed inside the client, each by patching the client's
    slot map (``reinitialize_steps=0``: the default rebuilds it every 5th MOVED by
    closing every connection, failing the commands other tasks have in flight).

    Raises:
        ValidationError: no URL, a ``unix://`` URL, a database other than 0, or URLs
            with different schemes.
    """
    listed = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
    listed = [u for u in listed if u]
    if not listed:
        raise ValidationError("a Redis Cluster needs at least one startup node URL")
    nodes: list[ClusterNode] = []
    scheme = urlsplit(listed[0]).scheme
    for url in listed:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValidationError(
                f"Redis Cluster startup node {url!r} must be a redis:// or rediss:// URL "
                "(a cluster cannot be reached over a unix socket)"
            )
        if parts.scheme != scheme:
            raise ValidationError(
                f"Redis Cluster startup nodes mix {scheme}:// and {parts.scheme}://; "
                "use one scheme for every node"
            )
        if parts.path.strip("/") not in ("", "0"):
            raise ValidationError(
                f"Redis Cluster startup node {url!r} names database {parts.path.strip('/')!r};"
                " a cluster has only database 0"
            )
        if not parts.hostname:
            raise ValidationError(f"Redis Cluster startup node {url!r} has no host")
        nodes.append(ClusterNode(parts.hostname, parts.port or 6379))
    options.setdefault("retry", Retry(NoBackoff(), 0))
    # Follow each MOVED by patching that slot, never by closing every connection of the
    # client (which fails the commands other tasks have in flight).
    options.setdefault("reinitialize_steps", 0)
    options["decode_responses"] = False
    if len(nodes) > 1:
        options["startup_nodes"] = nodes[1:]
    try:
        return RedisCluster.from_url(listed[0], **options)
    except (RedisClusterException, ValueError) as exc:
        raise ValidationError(f"cannot build a Redis Cluster client: {exc}") from exc


_SERVER_FIELDS = ("host", "port", "path", "db", "username")


def same_server(a: RedisClient, b: RedisClient) -> bool:
    """Whether two clients reach the same server and database: the same client, two
    standalone clients built with the same address, socket path, database and user, or two
    cluster clients built with the same startup nodes and user (the hot and the durable
    store of one deployment, each built from the same settings)."""
    if a is b:
        return True
    if isinstance(a, RedisCluster) and isinstance(b, RedisCluster):
        return {n.name for n in a.startup_nodes} == {n.name for n in b.startup_nodes} and (
            a.connection_kwargs.get("username") == b.connection_kwargs.get("username")
        )
    if isinstance(a, RedisCluster) or isinstance(b, RedisCluster):
        return False
    ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    return all(ka.get(f) == kb.get(f) for f in _SERVER_FIELDS)


_Queued = tuple[bytes, int, "asyncio.Future[list[Any]]"]
"""A call waiting to be coalesced: its packed commands, how many, where its replies go."""

_IDLE_KEPT = 8
"""Idle connections a :class:`DirectLane` keeps at most (and at most an eighth of its
pool's ``max_connections``)."""


class DirectLane:
    """One round trip on a standalone client's pooled connection, without redis-py's
    per-command machinery: the command(s) packed by hiredis in C, written at once, and
    each reply read by the connection's own parser (hiredis).

    Why: on the 2-core bench machine ``Redis.execute_command`` cost ~85 µs of client CPU
    per call (pool condition and timeout, retry wrapper, observability hooks, Python
    packing of every argument) against ~40 µs here, and a turn makes ~3 calls.

    What is kept of redis-py: its connections (connect, AUTH, TLS, ``socket_timeout``; a
    connection whose send or read fails or is cancelled is disconnected by redis-py and
    reconnects on its next use), its pool and its error classes (an error reply comes back
    as its result, ``NoScriptError`` included). A lane keeps a few idle connections out of
    the pool between calls (checked as the pool checks them before reuse), at most
    :data:`_IDLE_KEPT` and an eighth of the pool, and none while one of its own callers
    waits for the pool: the rest of the pool keeps circulating, so a burst larger than the
    pool still queues there and nobody starves. One lane per pool (:meth:`for_client`),
    shared by every store on that client.

    Only commands that redis-py answers unchanged (no response callback) take the lane, so
    replies are the same bytes and lists :meth:`Redis.execute_command` would give; and
    only clients that redis-py would not retry (the ones built here) and that are not
    single-connection clients. Round trips are counted at :meth:`roundtrip`
    (:class:`~tiermem.testing.round_trips.RoundTrips`), one per call.

    Coalescing. A call made while another of the lane's round trips is in flight (many
    sessions at once) does not take a connection of its own: it joins the calls made in
    the same turn of the event loop, and they go as one write on one connection, their
    replies read in order and handed back to each caller (at most :data:`_BATCH_MOST`
    calls and :data:`_BATCH_BYTES` a write). Why: a round trip costs the client ~30 µs of
    event-loop work and redis-server ~20 µs of networking whatever it carries; at 50
    sessions coalescing cut the client's CPU per turn by 27-40% and redis-server's by
    23-43% (``bench/results/turns_redis_coalescing.json``). A lone call
    (nothing in flight, as for one session) is sent at once, as before. Each call's
    commands stay contiguous and in order, so what one call sends (a script and its
    activity mark) is still one unit, and each caller gets its replies as soon as they
    are read (the first caller of a write does not wait for the others'), no reply waited
    for longer than ``socket_timeout``. What differs from a call of its own: a failed
    connection fails every call of the write still unanswered (each may or may not have
    run, as for a lone call whose reply is lost), and a caller cancelled before the write
    leaves (even one whose write waits for a pooled connection) is left out of it; one
    cancelled after has its replies read and dropped. Blocking commands and WAIT go alone
    (``coalesce=False``, :func:`blocks`): they hold their connection, and the calls written
    after them would wait too. Commands whose replies do not pair one to one with the
    commands (subscribe, MONITOR, CLIENT, HELLO: :data:`_UNPAIRED`) never take the lane:
    a reply too many or too few would go to another caller.
    """

    def __init__(self, pool: ConnectionPool, callbacks: Collection[str | bytes]) -> None:
        self._pool = pool
        self._callbacks = {str(name).upper() for name in callbacks}
        self._idle: list[AbstractConnection] = []
        self._keep = min(_IDLE_KEPT, pool.max_connections // 8)
        self._waiting = 0
        self._in_flight = 0
        self._queued: list[_Queued] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self._deadlines: _Deadlines | None = None
        self.writes = 0
        """Writes to the server so far (calls coalesced into one count once), for the
        benchmark and tests."""

    @classmethod
    def for_client(cls, client: RedisClient) -> DirectLane | None:
        """The lane of a standalone client redis-py would not retry, else None."""
        if not isinstance(client, Redis) or client.single_connection_client:
            return None
        retry = client.get_retry()
        if retry is not None and retry.get_retries() > 0:
            return None
        pool = client.connection_pool
        lane = getattr(pool, _LANE_ATTRIBUTE, None)
        if not isinstance(lane, DirectLane):
            lane = cls(pool, client.response_callbacks)
            # Kept on the pool, not in a module-level registry: the lane's idle connections
            # reference the pool (redis-py's maintenance handler), so a registry keyed by
            # the pool, even weakly, kept every pool ever built and their sockets alive.
            # pool <-> lane is a cycle the garbage collector frees with the client.
            setattr(pool, _LANE_ATTRIBUTE, lane)
        return lane

    @property
    def idle(self) -> int:
        """Connections kept idle by this lane now (for tests and metrics)."""
        return len(self._idle)

    def takes(self, name: Arg) -> bool:
        """Whether redis-py would return the reply of command ``name`` unchanged, and
        would send it as the lane does: redis-py splits a name such as ``"OBJECT
        ENCODING"`` into two arguments, hiredis would send it as one (an unknown command)."""
        if not isinstance(name, str):
            return False  # tiermem names commands with str; anything else: redis-py's path
        upper = name.upper()
        return " " not in name and upper not in self._callbacks and upper not in _UNPAIRED

    async def roundtrip(self, packed: bytes, count: int, *, coalesce: bool = True) -> list[Any]:
        """Send ``count`` packed commands at once and read their replies (an error reply
        is its command's result; a failed connection raises). With ``coalesce``, while
        another round trip is in flight, in one write with the other calls of this turn
        of the event loop (see the class)."""
        if not coalesce or not self._in_flight:
            self._in_flight += 1
            try:
                return await self._exchange(packed, count)
            finally:
                self._in_flight -= 1
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush)
        self._queued.append((packed, count, future))
        return await future

    def _flush(self) -> None:
        """Start a write of the calls queued in this turn of the loop, a task per
        :data:`_BATCH_MOST` calls or :data:`_BATCH_BYTES` (callers already cancelled are
        left out)."""
        queued, self._queued = self._queued, []
        batch: list[_Queued] = []
        size = 0
        for call in queued:
            if call[2].done():
                continue
            if batch and (len(batch) >= _BATCH_MOST or size + len(call[0]) > _BATCH_BYTES):
                self._start(batch)
                batch, size = [], 0
            batch.append(call)
            size += len(call[0])
        if batch:
            self._start(batch)

    def _start(self, batch: list[_Queued]) -> None:
        """Write ``batch`` now on an idle connection when one is ready (else its task
        acquires one): the write leaves in this turn of the loop, not in the next."""
        self._in_flight += 1
        written = None
        if self._idle:
            conn = self._idle.pop()
            if _reads_directly(conn) and _clean(conn):
                packed, total = _joined(batch)
                if _write_now(conn, packed):
                    written = (conn, packed, total)
            if written is None:
                self._idle.append(conn)  # the task's _acquire checks and reconnects it
        task = asyncio.get_running_loop().create_task(self._write_batch(batch, written))
        self._flushing.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._flushing.discard)

    async def _write_batch(
        self,
        batch: list[_Queued],
        written: tuple[AbstractConnection, bytes, int] | None,
    ) -> None:
        """Write ``batch`` on one connection (``written``: the connection it was already
        handed to, the packed write and its number of commands); each caller gets its
        replies as soon as they are read, or the error. A batch that had to wait for a
        connection leaves out the callers cancelled meanwhile."""
        try:
            if written is None:
                conn = await self._acquire()
                batch = [call for call in batch if not call[2].done()]
                if not batch:
                    await self._put_back(conn)
                    return
                packed, total = _joined(batch)
                await self._exchange(packed, total, conn, calls=batch)
            else:
                conn, packed, total = written
                await self._exchange(packed, total, conn, sent=True, calls=batch)
        except BaseException as exc:
            failure = exc
            if not isinstance(exc, Exception):  # the task cancelled (the loop closing)
                failure = RedisConnectionError("the coalesced Redis write was cancelled")
            for _, _, future in batch:
                if not future.done():  # the callers whose replies were read keep them
                    future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1

    async def _exchange(
        self,
        packed: bytes,
        count: int,
        conn: AbstractConnection | None = None,
        *,
        sent: bool = False,
        calls: Sequence[_Queued] = (),
    ) -> list[Any]:
        """One write of ``packed`` on a connection (``conn``, else one acquired; ``sent``:
        already handed to ``conn``) and the ``count`` replies to it; ``calls``: the
        coalesced calls they answer, each given its own as soon as they are read."""
        self.writes += 1
        if conn is None:
            # The idle connection ready at once, without a coroutine for it (each await of
            # one costs a few thousand instructions, on every round trip).
            conn = self._ready_idle()
            if conn is None:
                conn = await self._acquire()
        try:
            if sent:
                if _unsent(conn):
                    await _drain(conn)
            elif not _write_now(conn, packed):
                await _send(conn, packed)
            elif _unsent(conn):
                await _drain(conn)
            if _reads_directly(conn):
                replies = await _read_replies(conn, count, calls, self._deadlines_now())
            else:
                replies = []
                handout = _Handout(calls)
                handout.read(replies)
                for _ in range(count):
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:  # a whole error reply: the connection is fine
                        replies.append(exc)
                    handout.read(replies)
        except BaseException:
            # redis-py disconnected it if the send or a read failed or was cancelled.
            await self._pool.release(conn)
            raise
        if len(self._idle) < self._keep and not self._waiting:
            self._idle.append(conn)  # what _put_back does, without its coroutine
        else:
            await self._pool.release(conn)
        return replies

    def _deadlines_now(self) -> _Deadlines:
        """The deadlines of this lane's reads on the running loop."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = _Deadlines(loop)
        return deadlines

    async def _put_back(self, conn: AbstractConnection) -> None:
        """Keep ``conn`` idle for the next call, or give it back to the pool."""
        if len(self._idle) < self._keep and not self._waiting:
            self._idle.append(conn)
        else:
            await self._pool.release(conn)

    def _ready_idle(self) -> AbstractConnection | None:
        """The last idle connection, taken, when it is ready as it is (what
        :meth:`_acquire` checks first), else None, taking nothing."""
        if self._idle:
            conn = self._idle[-1]
            if _reads_directly(conn) and _clean(conn):
                return self._idle.pop()
        return None

    async def _acquire(self) -> AbstractConnection:
        """An idle connection, checked (reconnected if need be), else one of the pool. A
        cancel request redis-py swallowed on the way (:func:`_swallowed`) gives the
        connection back and raises."""
        if self._idle:
            conn = self._idle.pop()
            if _reads_directly(conn) and _clean(conn):
                return conn
            before = _cancelling()
            try:
                await self._pool.ensure_connection(conn)
            except BaseException:
                await self._pool.release(conn)
                raise
        else:
            before = _cancelling()
            self._waiting += 1
            try:
                # redis-py's deprecated-args decorator leaves get_connection untyped.
                conn = cast(AbstractConnection, await self._pool.get_connection())  # type: ignore[no-untyped-call]
            finally:
                self._waiting -= 1
        if _swallowed(before):
            await self._pool.release(conn)  # connected and in step: the connect completed
            raise asyncio.CancelledError
        return conn


_BATCH_MOST = 64
"""Calls a :class:`DirectLane` coalesces into one write at most."""
_BATCH_BYTES = 1 << 20
"""Bytes a coalesced write carries at most (a larger call still goes, alone)."""


def _joined(batch: Sequence[_Queued]) -> tuple[bytes, int]:
    """The packed commands of a coalesced write and how many they are."""
    if len(batch) == 1:
        return batch[0][0], batch[0][1]
    return b"".join(c[0] for c in batch), sum(c[1] for c in batch)


class _Handout:
    """Hands each coalesced call its replies as soon as the last of them is read, so the
    first caller of a write waits for its own replies, not for the whole write's (and a
    connection lost later fails only the calls still unanswered)."""

    __slots__ = ("_at", "_calls", "_next")

    def __init__(self, calls: Sequence[_Queued]) -> None:
        self._calls = calls
        self._next = 0  # the next call to answer
        self._at = 0  # where its replies start

    def read(self, replies: list[Any]) -> None:
        """Answer the calls whose replies are all in ``replies`` now (called before the
        first reply and after each)."""
        calls, have = self._calls, len(replies)
        while self._next < len(calls):
            _, count, future = calls[self._next]
            end = self._at + count
            if end > have:
                return
            if not future.done():  # a caller cancelled meanwhile drops its replies
                future.set_result(replies[self._at : end])
            self._next += 1
            self._at = end


_UNPAIRED = frozenset(
    {
        "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE",
        "SUNSUBSCRIBE", "MONITOR", "CLIENT", "HELLO", "SYNC", "PSYNC", "QUIT",
    }
)  # fmt: skip
"""Commands the lane never takes: their replies do not pair one to one with the commands
sent (a (un)subscribe answers once per channel, in RESP3 as push messages; MONITOR
streams; ``CLIENT REPLY OFF|SKIP`` silences replies), or they change how the connection
answers what follows (HELLO, QUIT). In a coalesced write, a reply too many or too few
would go to another caller."""


_BLOCKING = frozenset(
    {
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX",
        "BZMPOP", "WAIT", "WAITAOF", "XREAD", "XREADGROUP",
    }
)  # fmt: skip


def blocks(name: Arg) -> bool:
    """Whether command ``name`` may hold its connection (a blocking pop, WAIT, XREAD):
    such a call is never coalesced, or the calls written after it would wait with it."""
    return isinstance(name, str) and name.upper() in _BLOCKING


_LANE_ATTRIBUTE = "_tiermem_direct_lane"
"""The attribute of a redis-py pool that holds its :class:`DirectLane`."""


_STOCK_SEND = AbstractConnection.send_packed_command


def _write_now(conn: AbstractConnection, packed: bytes) -> bool:
    """Hand ``packed`` to ``conn``'s transport at once (a stock connection whose buffer
    is empty); False, having written nothing, where it may not: then redis-py's
    ``send_packed_command`` sends it. redis-py wraps every send in ``asyncio.wait_for`` (a
    task per command when ``socket_timeout`` is set, as by default); a write the kernel
    takes at once needs no wait, so it goes to the stream's transport directly (redis-py
    8.1's ``_writer``), and only a write left buffered (:func:`_unsent`, :func:`_drain`),
    a connection with health checks, or a connection class that overrides
    ``send_packed_command`` (a caller's instrumentation) takes redis-py's timed path."""
    writer = getattr(conn, "_writer", None)
    if (
        type(conn).send_packed_command is not _STOCK_SEND
        or not isinstance(writer, asyncio.StreamWriter)
        or writer.transport.get_write_buffer_size()
        or getattr(conn, "health_check_interval", 0)
    ):
        return False
    writer.write(packed)
    return True


def _unsent(conn: AbstractConnection) -> bool:
    """Whether :func:`_write_now` left bytes in ``conn``'s transport (:func:`_drain` waits
    for them)."""
    writer = getattr(conn, "_writer", None)
    return isinstance(writer, asyncio.StreamWriter) and bool(
        writer.transport.get_write_buffer_size()
    )


async def _drain(conn: AbstractConnection) -> None:
    """Wait for what :func:`_write_now` left in the transport's buffer, if anything."""
    writer = getattr(conn, "_writer", None)
    if isinstance(writer, asyncio.StreamWriter) and writer.transport.get_write_buffer_size():
        # Not all taken: drain it under redis-py's timeout and error mapping (an empty
        # send waits for the buffer; on failure the connection is disconnected). No
        # health check here: its PING would read this command's reply.
        await _send(conn, b"", check_health=False)


def _cancelling() -> int:
    """The running task's pending cancel requests (0 outside a task)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _swallowed(before: int) -> bool:
    """Whether an await into redis-py that returned normally swallowed a cancel request
    made while it ran (the running task had ``before`` pending when it began). Python
    3.11's ``asyncio.wait_for``, around every redis-py send and the handshake of a new
    connection, returns the awaited result when the task is cancelled in the turn the
    awaited operation completes: the request stays counted in ``Task.cancelling()`` but
    no ``CancelledError`` is raised, and the task would go on as if never cancelled
    (``asyncio.timeout`` and ``TaskGroup`` above it rely on the cancellation reaching
    them). A request counted but not raised can only have been swallowed: one made
    while the task waits is raised at its resumption, and redis-py's own timeouts undo
    theirs."""
    return _cancelling() > before


class CancelGuard:
    """Raise, as its block ends, a cancel request that redis-py swallowed inside it
    (:func:`_swallowed`), so that the cancellation reaches the caller: a user's
    ``asyncio.timeout`` around ``add_turn`` or ``recall``, a ``TaskGroup`` or a server's
    request cancellation above relies on it. Every await into redis-py outside the direct
    lane runs in one (the lane guards its own: :meth:`DirectLane._acquire`, :func:`_send`).

    A block that ends normally after a swallowed request raises ``CancelledError`` in
    place of its result; one that ends with an error raises ``CancelledError`` from that
    error (the task was cancelled either way). The redis-py call did complete: a write
    may have been applied though its caller sees a cancellation, the ordinary race of a
    cancel with a completion, which the writes survive (appends carry write ids, records
    versions: a retried write is recognized). Cost: two reads of ``Task.cancelling()``,
    inlined (~6k instructions a block under callgrind, against ~420k for one ``SET``
    through redis-py's ``execute_command``).
    """

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        task = asyncio.current_task()
        self._before = 0 if task is None else task.cancelling()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if kind is None or issubclass(kind, Exception):
            task = asyncio.current_task()
            if task is not None and task.cancelling() > self._before:
                raise asyncio.CancelledError from exc


async def _send(conn: AbstractConnection, packed: bytes, *, check_health: bool = True) -> None:
    """``conn.send_packed_command(packed)``, raising the cancellation it may swallow
    (:func:`_swallowed`): then ``conn`` is disconnected, as for a send cancelled, since
    its replies will not be read."""
    before = _cancelling()
    await conn.send_packed_command(packed, check_health=check_health)
    if _swallowed(before):
        await conn.disconnect(nowait=True)
        raise asyncio.CancelledError


_STOCK_READ = AbstractConnection.read_response
_PUSH: type | None = getattr(hiredis, "PushNotification", None)
"""hiredis's type for RESP3 push messages (hiredis >= 3.2)."""


def _reads_directly(conn: AbstractConnection) -> bool:
    """Whether the lane may read ``conn``'s replies from its hiredis reader itself: a
    stock connection with redis-py's hiredis parser, no health checks and
    ``read_response`` not overridden (a caller's instrumentation keeps it)."""
    return (
        type(conn).read_response is _STOCK_READ
        and type(conn._parser) is _AsyncHiredisParser
        and not getattr(conn, "health_check_interval", 0)
    )


def _clean(conn: AbstractConnection) -> bool:
    """What :meth:`ConnectionPool.ensure_connection` checks before reusing a connection,
    without its retry wrapper: connected, nothing unread, not closed by the server (a
    connection that fails this goes through ``ensure_connection``, which reconnects)."""
    parser = cast(Any, conn._parser)
    reader, stream = parser._reader, getattr(parser, "_stream", None)
    return (
        conn.is_connected
        and reader is not None
        and stream is not None
        and not reader.has_data()
        and not stream.at_eof()
        and not stream._buffer
    )


class _Read:
    """One read of the lane in progress: its task, when it must end (loop time), and
    whether :class:`_Deadlines` cancelled it for passing that time."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.expired = False
        self.cancelling = task.cancelling()


class _Deadlines:
    """The deadlines of a lane's reads on one event loop, watched by one timer.

    Why not ``asyncio.timeout`` per read: it cost ~42k instructions a round trip (a timer
    pushed on the loop's heap and cancelled, two coroutines for the context manager),
    against ~57k for the bare asyncio write and read (callgrind,
    ``bench/redis_lane_roundtrip.py``, issue #8). Here a read only notes its deadline
    (:meth:`enter`, :meth:`leave`; ~12k); the one timer is armed at the earliest deadline
    and left armed when reads end: when it fires it cancels the tasks of the reads whose
    deadline it was armed for or passed, as asyncio's timeout would at that moment, and
    re-arms for the earliest deadline still ahead. The cancelled read turns the
    cancellation into a timeout as ``asyncio.timeout`` does (:meth:`expired`).
    """

    __slots__ = ("_at", "_reads", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._reads: set[_Read] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0

    def enter(self, limit: float) -> _Read:
        """Note a read of the running task that must end within ``limit`` seconds."""
        task = asyncio.current_task(self.loop)
        assert task is not None  # the lane's reads run in tasks
        read = _Read(task, self.loop.time() + limit)
        self._reads.add(read)
        if self._timer is None or read.deadline < self._at:
            self._arm(read.deadline)
        return read

    def leave(self, read: _Read) -> None:
        self._reads.discard(read)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        due = max(self._at, self.loop.time())
        ahead: float | None = None
        for read in list(self._reads):
            if read.deadline <= due:
                self._reads.discard(read)
                read.expired = True
                read.task.cancel()
            elif ahead is None or read.deadline < ahead:
                ahead = read.deadline
        if ahead is not None:
            self._arm(ahead)

    @staticmethod
    def expired(read: _Read | None) -> bool:
        """Whether a cancellation that reached ``read`` is its timeout's own (then undone, as
        ``asyncio.timeout`` undoes it: the caller raises a timeout instead), not a cancel
        request from elsewhere, which must go on."""
        if read is None or not read.expired:
            return False
        return read.task.uncancel() <= read.cancelling


async def _read_replies(
    conn: AbstractConnection,
    count: int,
    calls: Sequence[_Queued] = (),
    deadlines: _Deadlines | None = None,
) -> list[Any]:
    """``count`` replies of ``conn`` read straight from its hiredis reader (redis-py arms
    a timeout per reply: a timer, a context manager and three layers of calls each). As
    :meth:`Connection.read_response`: no reply waited for longer than ``socket_timeout``
    (one deadline in ``deadlines``, the lane's, moved on only when a read is needed after
    replies came in, so a coalesced write of many slow calls is not cut off as a whole);
    an error reply is its command's result (a :class:`ResponseError`), a connection error
    reply (``LOADING``) raises, a RESP3 push message goes to the parser's handler and is
    not a reply; a timeout, a failed read or a cancellation disconnects it, and a closed
    stream raises redis-py's ``ConnectionError``. ``calls``: the coalesced calls the
    replies answer, each given its own as soon as they are read (:class:`_Handout`)."""
    parser = cast(Any, conn._parser)
    reader, stream, size = parser._reader, parser._stream, parser._read_size
    replies: list[Any] = []
    handout = None
    if calls:
        handout = _Handout(calls)
        handout.read(replies)
    limit = conn.socket_timeout
    if deadlines is None:
        deadlines = _Deadlines(asyncio.get_running_loop())
    read = None if limit is None else deadlines.enter(limit)
    try:
        armed = 0  # replies read when the deadline was last set
        while len(replies) < count:
            reply = reader.gets()
            if reply is _NOT_ENOUGH_DATA:
                if limit is not None and read is not None and len(replies) > armed:
                    read.deadline = deadlines.loop.time() + limit  # a new reply is awaited
                    armed = len(replies)
                buffer = await stream.read(size)
                if not buffer:
                    raise RedisConnectionError("Connection closed by server.")
                reader.feed(buffer)
                continue
            if _PUSH is not None and isinstance(reply, _PUSH):
                # RESP3 out-of-band message: redis-py's handler, then read on.
                await parser.handle_push_response(reply)
                continue
            if isinstance(reply, RedisConnectionError) or (
                type(reply) is list and reply and isinstance(reply[0], RedisConnectionError)
            ):
                raise reply if isinstance(reply, RedisConnectionError) else reply[0]
            replies.append(reply)
            if handout is not None:
                handout.read(replies)
    except asyncio.CancelledError as exc:
        timed_out = _Deadlines.expired(read)
        await conn.disconnect(nowait=True)
        if timed_out:
            # As before: redis-py's timeout caused by asyncio's TimeoutError, itself
            # caused by the cancellation (what ``asyncio.timeout`` raises), not a
            # CancelledError as the cause (read as a cancellation up the chain).
            timeout = TimeoutError()
            timeout.__cause__ = timeout.__context__ = exc
            raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from timeout
        raise
    except TimeoutError as exc:  # a socket's own timeout (builtins.TimeoutError)
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from exc
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(
            f"Error while reading from {conn._host_error()} : {exc.args}"
        ) from exc
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
    finally:
        if read is not None:
            deadlines.leave(read)
    return replies


# hiredis's stub types pack_command's argument as a 1-tuple; it takes any tuple of them.
_pack_command = cast("Callable[[tuple[Arg, ...]], bytes]", hiredis.pack_command)


def pack_commands(commands: Sequence[Sequence[Arg]]) -> bytes:
    """Commands in the Redis protocol, packed by hiredis (str as UTF-8, int in decimal,
    as redis-py encodes them)."""
    if len(commands) == 1:
        return _pack_command(tuple(commands[0]))
    return b"".join(_pack_command(tuple(args)) for args in commands)


_HEADS_KEPT = 4096
"""Packed script-call heads (script and keys) a :class:`RedisIO` keeps at most."""


class RedisIO:
    """The one door to Redis: single script calls, plain commands and pipelines.

    Scripts run with EVALSHA; on NOSCRIPT (first use, ``SCRIPT FLUSH``, a failover to a
    server that never saw the script) the script is loaded and the call repeated. Pipelines
    are non-transactional, so their commands may address different slots of a cluster.

    A cluster client is made to learn the slot map before each command is routed (a no-op
    once it knows it; see :meth:`_ready`), and a connection that redis-py's own recovery
    closed under a command surfaces as a retryable
    :class:`~tiermem.errors.BackendUnavailableError` (see :func:`closed_under_command`).

    Every call that goes through redis-py rather than the :class:`DirectLane` (a cluster
    client, a client redis-py retries, a command with a response callback) runs in a
    :class:`CancelGuard`: a cancel request redis-py swallowed on the way is raised when
    the call returns, as the lane raises its own.
    """

    def __init__(self, client: RedisClient) -> None:
        decodes = (
            client.get_encoder().decode_responses
            if isinstance(client, RedisCluster)
            else client.connection_pool.connection_kwargs.get("decode_responses", False)
        )
        if decodes:
            raise ValidationError(
                "the Redis client decodes responses to str; tiermem needs bytes. Build it "
                "with decode_responses=False (the default), or use from_url"
            )
        self.client = client
        self._cluster = client if isinstance(client, RedisCluster) else None
        self._direct = DirectLane.for_client(client)
        self._heads: dict[tuple[LuaScript | str, ...], bytes] = {}
        """(script, *keys) → the packed ``EVALSHA sha numkeys keys...`` (see _packed_call)."""

    def _packed_call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
        """``EVALSHA`` of ``script`` on ``keys`` with ``args``, packed as
        :func:`pack_commands` packs it, byte for byte.

        Why: hiredis formats each argument's length with ``sprintf`` (~1.3k instructions
        an argument), and a session's script calls repeat the same head (command, SHA,
        key count, the session's keys: 7-11 of a turn's ~12-25 arguments). The head is
        packed once per script and keys (a bounded map) and only the arguments are packed
        per call; the protocol's argument count is written in front of both.
        """
        ident: tuple[LuaScript | str, ...] = (script, *keys)
        head = self._heads.get(ident)
        if head is None:
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()  # forgetting only costs a repacking
            packed = _pack_command(("EVALSHA", script.sha, len(keys), *keys))
            head = self._heads[ident] = packed[packed.index(b"\n") + 1 :]
        total = 3 + len(keys) + len(args)
        if not args:
            return b"*%d\r\n%b" % (total, head)
        tail = _pack_command(tuple(args))
        return b"".join((b"*%d\r\n" % total, head, tail[tail.index(b"\n") + 1 :]))

    async def _ready(self) -> None:
        """Have a cluster client learn the slot map before a command is routed.

        redis-py's cluster client chooses a command's node before it initializes: a burst
        of commands on a new client (or one that just lost a connection) goes to an
        arbitrary node, each answer is MOVED, and every ``reinitialize_steps``-th MOVED
        makes the client close all its connections, those of commands in flight in other
        tasks included. ``initialize`` is idempotent and serialized by the client's lock.
        """
        if self._cluster is not None:
            await self._cluster.initialize()

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        if self._direct is not None:
            packed = self._packed_call(script, keys, args)
            (reply,) = await self._direct.roundtrip(packed, 1)
            if isinstance(reply, Exception):  # rare: the common path checks once
                if isinstance(reply, NoScriptError):
                    # Load it and resend, in one round trip (NOSCRIPT ran nothing).
                    loaded, reply = await self._direct.roundtrip(
                        pack_commands([("SCRIPT", "LOAD", script.source)]) + packed, 2
                    )
                    if isinstance(loaded, Exception):
                        raise loaded
                if isinstance(reply, Exception):
                    raise reply
            return reply
        with CancelGuard():
            await self._ready()
            with closed_under_command(self._cluster):
                try:
                    return await self.client.evalsha(script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    await self.load(script)
                    return await self.client.evalsha(script.sha, len(keys), *keys, *args)

    async def call_waited(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg], wait: ReplicaWait
    ) -> Any:
        """:meth:`call` followed by WAIT on the script's connection, in one round trip (a
        pipeline). A write the script says it stored that too few replicas acknowledged
        raises :class:`~tiermem.errors.NotReplicatedError` (:meth:`ReplicaWait.check`)."""
        command = script.command(keys, args)
        results, acked = await self._send_with_wait([command], wait)
        if isinstance(results[0], NoScriptError):
            # NOSCRIPT wrote nothing (so WAIT confirmed nothing of it): load and resend.
            await self.load(script)
            results, acked = await self._send_with_wait([command], wait)
        if isinstance(results[0], Exception):
            raise results[0]
        wait.check(results[0], acked)
        return results[0]

    async def execute(self, *args: Arg) -> Any:
        if self._direct is not None and self._direct.takes(args[0]):
            (reply,) = await self._direct.roundtrip(
                pack_commands([args]), 1, coalesce=not blocks(args[0])
            )
            if isinstance(reply, Exception):
                raise reply
            return reply
        with CancelGuard():
            await self._ready()
            with closed_under_command(self._cluster):
                return await self.client.execute_command(*args)

    async def load(self, *scripts: LuaScript) -> None:
        if self._direct is not None:
            sent = [("SCRIPT", "LOAD", script.source) for script in scripts]
            for reply in await self._direct.roundtrip(pack_commands(sent), len(sent)):
                if isinstance(reply, Exception):
                    raise reply
            return
        with CancelGuard():
            await self._ready()
            with closed_under_command(self._cluster):
                for script in scripts:
                    await self.client.script_load(script.source)

    async def send(self, commands: Sequence[Command]) -> list[Any]:
        """One round trip; a command's error comes back as its result, not raised."""
        direct = self._direct
        if direct is not None and all(direct.takes(c.args[0]) for c in commands):
            return await direct.roundtrip(
                pack_commands([c.args for c in commands]),
                len(commands),
                coalesce=not any(blocks(c.args[0]) for c in commands),
            )
        with CancelGuard():
            await self._ready()
            with closed_under_command(self._cluster):
                pipe = self.client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command.args)
                return list(await pipe.execute(raise_on_error=False))

    async def send_waited(self, commands: Sequence[Command], wait: ReplicaWait) -> list[Any]:
        """:meth:`send` where the first command is a write to confirm: WAIT follows it on
        its connection in the same round trip, and :meth:`ReplicaWait.check` raises
        :class:`~tiermem.errors.NotReplicatedError` if it stored something that too few
        replicas acknowledged."""
        results, acked = await self._send_with_wait(commands, wait)
        wait.check(results[0], acked)
        return results

    async def _send_with_wait(
        self, commands: Sequence[Command], wait: ReplicaWait
    ) -> tuple[list[Any], Any]:
        """``commands`` and a WAIT right after ``commands[0]`` on the same connection, in
        one round trip: (each command's result or error, WAIT's answer or error).

        WAIT counts only the writes made on its own connection. A standalone client sends
        everything in one non-transactional pipeline (one connection). A cluster client
        cannot: its pipeline routes each command by its key and WAIT has none, so the
        commands are grouped by the master of their slot and each group goes as one
        pipeline on one of that node's connections (:meth:`ClusterNode.execute_pipeline
        <redis.asyncio.cluster.ClusterNode.execute_pipeline>`), WAIT last in the group of
        ``commands[0]``; the groups go out concurrently.
        """
        direct = self._direct
        if direct is not None and all(direct.takes(c.args[0]) for c in commands):
            sent = [*(c.args for c in commands), wait.command().args]
            out = await direct.roundtrip(pack_commands(sent), len(sent), coalesce=False)
            return out[:-1], out[-1]
        with CancelGuard():
            await self._ready()
            with closed_under_command(self._cluster):
                if self._cluster is None:
                    pipe = self.client.pipeline(transaction=False)
                    for command in commands:
                        pipe.execute_command(*command.args)
                    pipe.execute_command(*wait.command().args)
                    out = list(await pipe.execute(raise_on_error=False))
                    return out[:-1], out[-1]
                return await self._send_with_wait_on_nodes(self._cluster, commands, wait)

    async def _send_with_wait_on_nodes(
        self, cluster: RedisCluster, commands: Sequence[Command], wait: ReplicaWait
    ) -> tuple[list[Any], Any]:
        """:meth:`_send_with_wait` on a cluster. A command answered MOVED did not run: the
        slot map is patched (as redis-py does) and it is sent again, with WAIT if it is
        ``commands[0]``, up to :data:`_MOVED_FOLLOWED` times; after that, or on ASK (a
        slot migrating), its MovedError/AskError is its result (mapped to a retryable
        "did not run" error). A failed connection makes the client rediscover the cluster
        before it raises, so the next call finds a promoted replica."""
        results: list[Any] = [None] * len(commands)
        acked: Any = None
        todo = list(range(len(commands)))
        for _ in range(_MOVED_FOLLOWED + 1):
            groups: dict[str, tuple[ClusterNode, list[int]]] = {}
            for i in todo:
                node = cluster.nodes_manager.get_node_from_slot(
                    cluster.keyslot(commands[i].first_key)
                )
                groups.setdefault(node.name, (node, []))[1].append(i)
            sent: list[tuple[ClusterNode, list[int], list[PipelineCommand]]] = []
            for node, indexes in groups.values():
                batch = [PipelineCommand(n, *commands[i].args) for n, i in enumerate(indexes)]
                if 0 in indexes:
                    batch.append(PipelineCommand(len(batch), *wait.command().args))
                sent.append((node, indexes, batch))
            outcomes = await asyncio.gather(
                *(node.execute_pipeline(batch) for node, _, batch in sent),
                return_exceptions=True,
            )
            failure: Exception | None = None
            for (node, indexes, batch), outcome in zip(sent, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, Exception):
                        raise outcome  # cancelled
                    if _node_failed(outcome):
                        await _forget_failed_node(cluster, node)
                    if 0 in indexes:
                        failure = outcome  # raised once every failed node is handled
                    for i in indexes:
                        results[i] = outcome
                    continue
                for i, sent_command in zip(indexes, batch, strict=False):
                    results[i] = sent_command.result
                if 0 in indexes:
                    acked = batch[-1].result
                # A connection that breaks while the replies are read does not raise: each
                # command's error is its result (ClusterNode.execute_pipeline). The node
                # failed all the same, so the slot map is rediscovered here too.
                if any(_node_failed(c.result) for c in batch):
                    await _forget_failed_node(cluster, node)
            if failure is not None:
                raise failure
            todo = [i for i in todo if isinstance(results[i], MovedError)]
            if not todo:
                break
            for i in todo:
                await cluster.nodes_manager.move_slot(results[i])
        return results, acked

    async def batch(self, commands: Sequence[Command]) -> list[Any]:
        """:meth:`send` for independent commands: reload scripts on NOSCRIPT, raise errors."""
        results = await self.send(commands)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            # A NOSCRIPT command did nothing, so repeating it (and only it) is safe.
            await self.load(*{s for i in missing if (s := commands[i].script) is not None})
            again = await self.send([commands[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results


_MOVED_FOLLOWED = 3
"""MOVED answers a waited write follows (each patches the client's slot map) before its
MovedError becomes its result."""


def _node_failed(outcome: object) -> bool:
    """Whether ``outcome`` (a pipeline's error or one command's) says the node's
    connection failed. All of its connections busy is no sign of a failed node."""
    return isinstance(outcome, RedisConnectionError | RedisTimeoutError) and not isinstance(
        outcome, MaxConnectionsError
    )


async def _forget_failed_node(cluster: RedisCluster, node: ClusterNode) -> None:
    """After a connection to ``node`` failed: what redis-py's cluster client does for its
    own commands (reconnect that node's connections, try it last), then rediscover the
    slot map so that the next command finds the replica once it is promoted. A failure to
    rediscover is left to the next command (the caller raises the original error)."""
    node.update_active_connections_for_reconnect()
    await node.disconnect_free_connections()
    cluster.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
    try:
        await cluster.nodes_manager.initialize(last_failed_node_name=node.name)
    except (RedisError, RedisClusterException) as exc:
        logger.debug("redis: rediscovering the cluster after %s failed: %s", node.name, exc)


_REDIS_PACKAGE = os.path.dirname(redis.__file__)


@contextmanager
def closed_under_command(cluster: RedisCluster | None) -> Iterator[None]:
    """Turn the AttributeError of a cluster connection closed mid-command into a
    retryable :class:`~tiermem.errors.BackendUnavailableError`.

    When the cluster client rebuilds its slot map (a failover, a slot that is not
    covered, too many MOVED answers) it closes every connection, including those that
    other tasks are using; their command then fails inside redis-py with
    ``'NoneType' object has no attribute ...`` (redis-py issues #3835, #4322). Only an
    AttributeError raised inside redis-py on a cluster client is mapped; one from
    tiermem's own code is a bug and propagates.
    """
    try:
        yield
    except AttributeError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        if cluster is None or not frames or not frames[-1].filename.startswith(_REDIS_PACKAGE):
            raise
        raise BackendUnavailableError(
            f"the Redis Cluster client closed a connection under this command while it "
            f"rebuilt its slot map ({type(exc).__name__}: {exc}); the cluster is failing "
            "over or being resharded. The command may or may not have been applied: "
            "retry (a retried turn append is recognized by its write id)",
            backend=BACKEND_NAME,
        ) from exc


# -- errors -------------------------------------------------------------------------------

_UNAVAILABLE = (
    RedisConnectionError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    TryAgainError,
    ReadOnlyError,
)


_REDIRECTED = (AskError, SlotNotCoveredError, ClusterError)  # MovedError is an AskError


class RedisStoreBase:
    """What both Redis stores share: the client (owned or borrowed), keys, clock, grace."""

    def __init__(
        self, client: RedisClient, *, clock: Clock | None, keys: RedisKeys, gc_grace: timedelta
    ) -> None:
        self._io = RedisIO(client)
        self._keys = keys
        self._clock = clock or SystemClock()
        self._system_clock = type(self._clock) is SystemClock
        self._grace_ms = grace_ms(gc_grace)
        self._owns_client = False

    def _own_client(self) -> Self:
        """Mark the client as built by this store (``from_url``), so aclose closes it."""
        self._owns_client = True
        return self

    @property
    def client(self) -> RedisClient:
        return self._io.client

    @property
    def keys(self) -> RedisKeys:
        return self._keys

    async def aclose(self) -> None:
        """Close the client if this store built it (``from_url``); safe to call twice."""
        if self._owns_client:
            self._owns_client = False
            await self._io.client.aclose()

    @property
    def grace_ms(self) -> int:
        """The grace period of this store's native TTLs, in milliseconds."""
        return self._grace_ms

    def _now_us(self) -> int:
        """``to_us(self._clock.now())``. The wall clock (:class:`SystemClock`) is read as
        an integer directly: ``datetime.now(UTC)`` floors the system clock's nanoseconds to
        microseconds as ``time_ns() // 1000`` does, without building a datetime and a
        timedelta (~9.5k instructions against ~1.5k; a turn reads it on each of its round
        trips)."""
        if self._system_clock:
            return time.time_ns() // 1000
        return to_us(self._clock.now())


def map_redis_error(exc: RedisError | RedisClusterException) -> BackendError:
    """The tiermem error for a redis-py error (the caller raises it ``from exc``)."""
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return BackendError(
            f"Redis refused the credentials ({detail}); check the username and password "
            "in the Redis URL",
            backend=BACKEND_NAME,
            retryable=False,
        )
    if isinstance(exc, RedisTimeoutError):
        return BackendTimeoutError(
            f"Redis did not answer in time ({detail}); the write may or may not have been "
            "applied, so retry with a version check or raise socket_timeout",
            backend=BACKEND_NAME,
        )
    if isinstance(exc, _UNAVAILABLE):
        return BackendUnavailableError(
            f"Redis cannot be reached or is not serving ({detail}); check that the server "
            "is up and the URL is right, then retry",
            backend=BACKEND_NAME,
        )
    if isinstance(exc, _REDIRECTED):
        # A redirection means the command did not run. "TTL exhausted" (a ClusterError) is
        # redis-py giving up after 16 redirections: during a slot migration its ASKING goes
        # out on another pooled connection than the command, so a script on a migrating
        # slot bounces between the two masters until the migration ends.
        return BackendUnavailableError(
            f"the Redis Cluster is moving a slot and the client could not follow it "
            f"({detail}); the command did not run. Retry: the client refreshes its slot "
            "map (a standalone client pointed at a cluster node gets this on every "
            "command: set TIERMEM_REDIS_CLUSTER=true)",
            backend=BACKEND_NAME,
        )
    return BackendError(
        f"Redis rejected a command ({detail}); this is a bug or a misconfigured server, "
        "not a transient failure",
        backend=BACKEND_NAME,
        retryable=False,
    )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def redis_boundary(
    method: Callable[_P, Awaitable[_R]],
) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """Map redis-py errors raised by ``method`` to :class:`~tiermem.errors.BackendError`."""

    @functools.wraps(method)
    async def mapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(*args, **kwargs)
        except (RedisError, RedisClusterException) as exc:
            raise map_redis_error(exc) from exc

    return mapped
