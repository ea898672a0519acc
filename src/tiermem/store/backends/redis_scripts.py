"""Redis plumbing shared by :mod:`~tiermem.store.backends.redis_hot` and
:mod:`~tiermem.store.backends.redis_durable`: the key builder, value framing, how Lua
scripts are addressed and run (each store keeps its own scripts beside the code that calls
them), the one door through which every command goes, and the error boundary.

The key layout and the design are drawn in :mod:`tiermem.store.backends.redis`.

Lua scripts never read the server's clock: the store passes ``now`` (microseconds since
the epoch, from its injected clock) as an argument, so a test's fake clock governs logical
expiry on the server exactly as it does in the reference backend. Every script declares
all the keys it touches, and all of them share one hash tag, so each runs on one slot of
a Redis Cluster.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tiermem.clock import Clock, SystemClock
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.models import NewTurn
from tiermem.store.codec import check_aware, check_kind, encode_turn
from tiermem.store.contract import EntityChange
from tiermem.store.keys import escape_segment

__all__ = [
    "BACKEND_NAME",
    "Arg",
    "Command",
    "LuaScript",
    "RedisClient",
    "RedisIO",
    "RedisKeys",
    "RedisStoreBase",
    "client_from_url",
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

    def _session(self, session_id: str, part: str) -> str:
        # Escaping walks the id character by character; a turn builds a session's keys
        # several times, so the escaped "<prefix>:{s=<sid>}:" is remembered.
        tag = self._session_tags.get(session_id)
        if tag is None:
            if len(self._session_tags) >= _TAGS_KEPT:
                self._session_tags.clear()
            tag = self._session_tags[session_id] = (
                f"{self.prefix}:{{s={escape_segment(session_id)}}}:"
            )
        return tag + part

    def _user(self, user_id: str, part: str) -> str:
        return f"{self.prefix}:{{u={escape_segment(user_id)}}}:{part}"

    # hot tier: one session
    def hot_session(self, session_id: str) -> list[str]:
        """meta, turns, entities, state: the keys every hot session script declares, in order."""
        tag = self._session(session_id, "")
        return [tag + "meta", tag + "turns", tag + "ent", tag + "state"]

    def hot_meta(self, session_id: str) -> str:
        return self._session(session_id, "meta")

    def hot_state(self, session_id: str) -> str:
        return self._session(session_id, "state")

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

    Raises:
        ValidationError: ``value`` is naive.
    """
    check_aware(value, what=what)
    return (value - _EPOCH) // _MICROSECOND


def from_us(value: int | bytes | str) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


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


def client_from_url(url: str, **options: Any) -> Redis:
    """An asyncio client for a ``redis://``, ``rediss://`` or ``unix://`` URL.

    Responses stay bytes (``decode_responses=False``: payloads are UTF-8 JSON and ids are
    decoded where needed). redis-py's automatic retries are off unless ``retry`` is passed:
    a retried EVALSHA whose first attempt reached the server would append the same turns
    twice. Failures surface as retryable :class:`~tiermem.errors.BackendError` instead,
    and callers retry with a version check, which is safe.
    """
    options.setdefault("retry", Retry(NoBackoff(), 0))
    options["decode_responses"] = False
    return Redis.from_url(url, **options)


_SERVER_FIELDS = ("host", "port", "path", "db", "username")


def same_server(a: RedisClient, b: RedisClient) -> bool:
    """Whether two clients reach the same server and database: the same client, or two
    standalone clients built with the same address, socket path, database and user."""
    if a is b:
        return True
    if isinstance(a, RedisCluster) or isinstance(b, RedisCluster):
        return False  # two cluster clients: only the same client is known to agree
    ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    return all(ka.get(f) == kb.get(f) for f in _SERVER_FIELDS)


class RedisIO:
    """The one door to Redis: single script calls, plain commands and pipelines.

    Scripts run with EVALSHA; on NOSCRIPT (first use, ``SCRIPT FLUSH``, a failover to a
    server that never saw the script) the script is loaded and the call repeated. Pipelines
    are non-transactional, so their commands may address different slots of a cluster.
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

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load(script)
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)

    async def execute(self, *args: Arg) -> Any:
        return await self.client.execute_command(*args)

    async def load(self, *scripts: LuaScript) -> None:
        for script in scripts:
            await self.client.script_load(script.source)

    async def send(self, commands: Sequence[Command]) -> list[Any]:
        """One round trip; a command's error comes back as its result, not raised."""
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command.args)
        return list(await pipe.execute(raise_on_error=False))

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


# -- errors -------------------------------------------------------------------------------

_UNAVAILABLE = (
    RedisConnectionError,
    BusyLoadingError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
)


class RedisStoreBase:
    """What both Redis stores share: the client (owned or borrowed), keys, clock, grace."""

    def __init__(
        self, client: RedisClient, *, clock: Clock | None, keys: RedisKeys, gc_grace: timedelta
    ) -> None:
        self._io = RedisIO(client)
        self._keys = keys
        self._clock = clock or SystemClock()
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
