"""What only the Redis backend promises: round trips, slots, sharding, native TTLs, errors.

The conformance suite checks behaviour shared by every backend; these tests look at the
server itself (key names, slots, TTLs, command counts) through a second, plain client.
"""

from __future__ import annotations

import random
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.connection import Connection
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.backends.redis import open_redis_stores
from tests.conftest import server_url
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConflictError,
    TierMemError,
    ValidationError,
)
from tiermem.models import ActiveEntity, MemoryRecord, SessionMetadata, SessionRef
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.backends.redis_scripts import map_redis_error, to_us
from tiermem.store.keys import escape_segment
from tiermem.testing import FakeClock
from tiermem.testing.backend import fresh_id, text_turn

pytestmark = pytest.mark.redis

GRACE = timedelta(minutes=10)
SHARDS = 4
HOUR_MS = 3_600_000
LEASE = timedelta(minutes=5)


class RoundTrips:
    """Counts requests written to the server: one per command, or one per pipeline."""

    def __init__(self) -> None:
        self.count = 0

    def connection_class(self) -> type[Connection]:
        counter = self

        class CountingConnection(Connection):
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.count += 1
                await super().send_packed_command(command, check_health)

        return CountingConnection


@dataclass
class Env:
    hot: RedisHotStore
    durable: RedisDurableStore
    clock: FakeClock
    admin: aredis.Redis
    trips: RoundTrips

    @property
    def prefix(self) -> str:
        return self.hot.keys.prefix

    async def keys_under_prefix(self) -> list[bytes]:
        # SCAN is fine in a test; the stores never use it.
        return [key async for key in self.admin.scan_iter(match=f"{self.prefix}:*", count=500)]

    async def commands_run(self) -> dict[str, int]:
        stats = await self.admin.info("commandstats")
        return {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    url = server_url("redis")
    clock = FakeClock()
    trips = RoundTrips()
    hot, durable = open_redis_stores(
        url,
        clock,
        gc_grace=GRACE,
        activity_shards=SHARDS,
        connection_class=trips.connection_class(),
    )
    admin = aredis.Redis.from_url(url)
    try:
        yield Env(hot, durable, clock, admin, trips)
    finally:
        await hot.aclose()
        await durable.aclose()
        await admin.aclose()


def _later(env: Env, seconds: float) -> Any:
    return env.clock.now() + timedelta(seconds=seconds)


def _metadata(env: Env, session_id: str) -> SessionMetadata:
    now = env.clock.now()
    return SessionMetadata(session_id=session_id, user_id="u-1", created_at=now, last_activity=now)


# -- round trips ----------------------------------------------------------------------------


async def test_append_turns_is_one_round_trip(env: Env) -> None:
    sid = fresh_id("s")
    # The first call loads the scripts (NOSCRIPT, SCRIPT LOAD); measure the steady state.
    await env.hot.append_turns(sid, [text_turn("warm-up")], window=10, expires_at=_later(env, 60))
    before_trips, before_stats = env.trips.count, await env.commands_run()
    await env.hot.append_turns(
        sid,
        [text_turn("a"), text_turn("b")],
        window=10,
        expires_at=_later(env, 60),
        expected_version=1,
        first_index=1,
    )
    after_stats = await env.commands_run()
    assert env.trips.count - before_trips == 1
    # Two commands in that one request: the session script and the activity-index mark.
    assert after_stats["evalsha"] - before_stats["evalsha"] == 2


async def test_load_is_one_round_trip(env: Env) -> None:
    sid = fresh_id("s")
    await env.hot.append_turns(sid, [text_turn("a")], window=10, expires_at=_later(env, 60))
    await env.hot.load(sid)
    before = env.trips.count
    snap = await env.hot.load(sid)
    assert snap is not None
    assert env.trips.count - before == 1
    env.clock.advance(61)
    before = env.trips.count
    assert await env.hot.load(sid, include_expired=True) is not None
    assert env.trips.count - before == 1


async def test_other_writes_and_reads_are_one_round_trip_each(env: Env) -> None:
    sid = fresh_id("s")
    operations: list[Callable[[], Awaitable[object]]] = [
        lambda: env.hot.put_state(sid, "dialogue", {"p": 1}, expires_at=_later(env, 60)),
        lambda: env.hot.get_state(sid, "dialogue"),
        lambda: env.hot.put_metadata(sid, _metadata(env, sid), expires_at=_later(env, 60)),
        lambda: env.hot.touch(sid, expires_at=_later(env, 120)),
        lambda: env.durable.append_turns(sid, [text_turn("a"), text_turn("b")]),
        lambda: env.durable.get_turns(sid),
        lambda: env.durable.put_record(sid, "summary", {"s": 1}),
    ]
    for operation in operations:
        await operation()  # loads the script into the server's cache if it is not there
        before = env.trips.count
        await operation()
        assert env.trips.count - before == 1


# -- key layout -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "session_id", ["plain", "a}b{c", "{tag}", "x:{s=other}:meta", "}", "セッション:1"]
)
async def test_all_keys_of_a_session_share_one_slot(env: Env, session_id: str) -> None:
    sid = f"{session_id}-{fresh_id()}"
    user = f"u{{{fresh_id()}}}"
    now = env.clock.now()
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=_later(env, 60))
    await env.hot.update_entities(
        sid,
        {"series": ActiveEntity(kind="series", value="Berserk", updated_at=now)},
        expires_at=_later(env, 60),
    )
    await env.hot.put_state(sid, "dialogue", {"x": 1}, expires_at=_later(env, 60))
    await env.durable.append_turns(sid, [text_turn("a")])
    await env.durable.put_record(sid, "summary", {"s": 1})
    await env.durable.register_session(SessionRef(session_id=sid, user_id=user, created_at=now))
    for memory_type in ("preference", "fact:{x}"):
        await env.durable.put_memory(
            MemoryRecord(
                memory_id=fresh_id("m"),
                user_id=user,
                memory_type=memory_type,
                content="c",
                created_at=now,
            )
        )

    keys = await env.keys_under_prefix()
    session_tag = f"{{s={escape_segment(sid)}}}".encode()
    user_tag = f"{{u={escape_segment(user)}}}".encode()
    session_keys = [k for k in keys if session_tag in k]
    user_keys = [k for k in keys if user_tag in k]
    assert {k.rsplit(b":", 1)[1] for k in session_keys} == {
        b"meta",
        b"turns",
        b"ent",
        b"state",
        b"archive",
        b"records",
        b"dmeta",
    }
    assert len(user_keys) == 8  # sessions, refs, mem, mem:all, mem:types, umeta, 2 type zsets
    # The tag is the whole escaped id: braces in an id cannot end it early or start another.
    assert {key_slot(k) for k in session_keys} == {key_slot(session_tag[1:-1])}
    assert {key_slot(k) for k in user_keys} == {key_slot(user_tag[1:-1])}
    assert all(k.count(b"{") == 1 and k.count(b"}") == 1 for k in session_keys + user_keys)


async def test_activity_index_has_one_key_per_shard(env: Env) -> None:
    sids = [fresh_id("s") for _ in range(40)]
    expires = _later(env, 60)
    for sid in sids:
        await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=expires)
    keys = await env.keys_under_prefix()
    shard_sets = sorted(k for k in keys if b":act:" in k and not k.endswith((b":lease", b":mark")))
    assert shard_sets == [f"{env.prefix}:act:{{{n}}}".encode() for n in range(SHARDS)]
    for sid in sids:
        shard = zlib.crc32(sid.encode()) % SHARDS
        score = await env.admin.zscore(f"{env.prefix}:act:{{{shard}}}", sid)
        assert score == to_us(expires)


# -- expiry ---------------------------------------------------------------------------------


async def test_native_ttls_cover_the_logical_expiry(env: Env) -> None:
    sid = fresh_id("s")
    now = env.clock.now()
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=_later(env, 3600))
    await env.hot.update_entities(
        sid, {"k": ActiveEntity(kind="k", value="v", updated_at=now)}, expires_at=_later(env, 3600)
    )
    await env.hot.put_state(sid, "dialogue", {"x": 1}, expires_at=_later(env, 3600))
    grace_ms = GRACE // timedelta(milliseconds=1)
    for key in env.hot.keys.hot_session(sid):
        ttl = await env.admin.pttl(key)
        assert HOUR_MS < ttl <= HOUR_MS + grace_ms, key

    await env.durable.put_record(sid, "summary", {"x": 1}, expires_at=_later(env, 3600))
    for key in env.durable.keys.durable_session(sid)[1:]:
        ttl = await env.admin.pttl(key)
        assert HOUR_MS < ttl <= HOUR_MS + grace_ms, key
    # One turn kept forever keeps the whole durable session.
    await env.durable.append_turns(sid, [text_turn("forever")])
    for key in env.durable.keys.durable_session(sid):
        assert await env.admin.pttl(key) == -1, key


async def test_expired_session_is_reset_by_the_next_write(env: Env) -> None:
    sid = fresh_id("s")
    await env.hot.append_turns(sid, [text_turn("old")], window=5, expires_at=_later(env, 60))
    env.clock.advance(61)
    turns_key = env.hot.keys.hot_session(sid)[1]
    assert await env.admin.llen(turns_key) == 1  # logically expired, not yet collected
    assert await env.hot.load(sid) is None
    with pytest.raises(ConflictError):
        await env.hot.append_turns(
            sid, [text_turn("x")], window=5, expires_at=_later(env, 60), expected_version=1
        )
    # The refused write kept the expired session for handoff.
    assert await env.hot.load(sid, include_expired=True) is not None
    result = await env.hot.append_turns(
        sid, [text_turn("new")], window=5, expires_at=_later(env, 60), first_index=1
    )
    assert result.version == 1
    assert await env.admin.llen(turns_key) == 1
    snap = await env.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["new"]


async def test_include_expired_stops_after_the_grace_period(env: Env) -> None:
    sid = fresh_id("s")
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=_later(env, 60))
    env.clock.advance(60 + GRACE.total_seconds() - 1)
    assert await env.hot.load(sid, include_expired=True) is not None
    env.clock.advance(1)
    assert await env.hot.load(sid, include_expired=True) is None


# -- activity index -------------------------------------------------------------------------


async def test_refused_write_leaves_the_activity_index_as_it_was(env: Env) -> None:
    sid = fresh_id("s")
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=_later(env, 60))
    env.clock.advance(61)
    assert sid in await env.hot.claim_expired(owner="w", lease=LEASE, limit=1000)
    index, leases, _ = env.hot.keys.activity_of(sid)
    score, lease = await env.admin.zscore(index, sid), await env.admin.hget(leases, sid)
    with pytest.raises(ConflictError):
        await env.hot.append_turns(
            sid, [text_turn("b")], window=5, expires_at=_later(env, 600), expected_version=7
        )
    assert await env.hot.touch(sid, expires_at=_later(env, 600)) is False
    assert await env.admin.zscore(index, sid) == score
    assert await env.admin.hget(leases, sid) == lease
    assert await env.hot.release_expired(sid, owner="w") is True


async def test_claim_repairs_an_entry_whose_update_was_lost(env: Env) -> None:
    sid = fresh_id("s")
    expires = _later(env, 3600)
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=expires)
    index = env.hot.keys.activity_of(sid)[0]
    # As if a later write's index update had been lost: the entry says it expired long ago.
    await env.admin.zadd(index, {sid: to_us(env.clock.now()) - 1})
    env.clock.advance(60)
    assert sid not in await env.hot.claim_expired(owner="w", lease=LEASE, limit=1000)
    assert await env.admin.zscore(index, sid) == to_us(expires)


async def test_scripts_are_reloaded_after_a_script_flush(env: Env) -> None:
    sid = fresh_id("s")
    await env.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=_later(env, 30))
    await env.admin.script_flush()
    await env.hot.append_turns(sid, [text_turn("b")], window=5, expires_at=_later(env, 30))
    index = env.hot.keys.activity_of(sid)[0]
    assert await env.admin.zscore(index, sid) == to_us(_later(env, 30))
    await env.admin.script_flush()
    snap = await env.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["a", "b"]
    await env.admin.script_flush()
    env.clock.advance(31)
    assert await env.hot.claim_expired(owner="w", lease=LEASE, limit=1000) == [sid]


# -- errors and ownership -------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_server_is_a_retryable_unavailable_error() -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    hot = RedisHotStore.from_url(url, clock=FakeClock(), socket_connect_timeout=2)
    durable = RedisDurableStore.from_url(url, clock=FakeClock(), socket_connect_timeout=2)
    try:
        with pytest.raises(BackendUnavailableError) as hot_error:
            await hot.load("s-1")
        with pytest.raises(BackendUnavailableError) as durable_error:
            await durable.append_turns("s-1", [text_turn("a")])
    finally:
        await hot.aclose()
        await durable.aclose()
    for info in (hot_error, durable_error):
        assert info.value.retryable is True
        assert info.value.backend == "redis"
        assert isinstance(info.value.__cause__, RedisConnectionError)


@pytest.mark.parametrize(
    ("error", "mapped", "retryable"),
    [
        (RedisTimeoutError("read timed out"), BackendTimeoutError, True),
        (RedisConnectionError("refused"), BackendUnavailableError, True),
        (AuthenticationError("invalid password"), BackendError, False),
        (ResponseError("WRONGTYPE Operation against a key"), BackendError, False),
    ],
)
def test_redis_errors_map_to_backend_errors(
    error: Exception, mapped: type[BackendError], retryable: bool
) -> None:
    result = map_redis_error(error)  # type: ignore[arg-type]
    assert type(result) is mapped
    assert result.retryable is retryable


async def test_a_client_passed_in_stays_open_and_aclose_is_idempotent() -> None:
    url = server_url("redis")
    client = aredis.Redis.from_url(url)
    try:
        store = RedisHotStore(client, clock=FakeClock())
        await store.aclose()
        await store.aclose()
        assert await client.ping() is True
    finally:
        await client.aclose()
    owned = RedisDurableStore.from_url(url, clock=FakeClock())
    assert await owned.next_index(fresh_id("s")) == 0
    await owned.aclose()
    await owned.aclose()


async def test_a_client_that_decodes_responses_is_rejected() -> None:
    client = aredis.Redis.from_url(server_url("redis"), decode_responses=True)
    try:
        with pytest.raises(ValidationError, match="decode_responses=False"):
            RedisDurableStore(client)
    finally:
        await client.aclose()


@pytest.mark.parametrize("prefix", ["", "a{b", "a:b", "a b"])
async def test_a_prefix_that_could_break_keys_is_rejected(prefix: str) -> None:
    client = aredis.Redis.from_url(server_url("redis"))
    try:
        with pytest.raises(ValidationError, match="prefix"):
            RedisHotStore(client, prefix=prefix)
    finally:
        await client.aclose()


# -- differential: Redis and the reference backend agree on random operation sequences ------
#
# The conformance suite checks chosen cases; these run seeded random sequences against
# MemoryHotStore / MemoryDurableStore (the reference) and the Redis stores on one fake clock,
# and compare every result and every error. A step is data: (operation, arguments).

Step = tuple[str, dict[str, Any]]


async def _outcome(call: Awaitable[object]) -> object:
    try:
        return ("ok", await call)
    except ConflictError as exc:
        return ("conflict", exc.expected, exc.actual)
    except TierMemError as exc:
        return (type(exc).__name__,)


async def _agree(env: Env, reference: object, store: object, steps: list[Step]) -> None:
    apply = _apply_hot if isinstance(reference, MemoryHotStore) else _apply_durable
    for number, (operation, args) in enumerate(steps):
        if operation == "advance":
            env.clock.advance(args["seconds"])
            continue
        if operation == "tail":
            # MemoryDurableStore.tail_turns slices from len - count, which is negative when
            # len < count < 2 * len and then keeps too few turns; the contract ("the last
            # count archived turns") is the reference here.
            turns = await reference.get_turns(args["sid"])  # type: ignore[attr-defined]
            expected: object = ("ok", turns[len(turns) - min(args["count"], len(turns)) :])
        else:
            expected = await _outcome(apply(env, reference, operation, args))
        got = await _outcome(apply(env, store, operation, args))
        assert got == expected, f"step {number}: {operation} {args}"


def _hot_steps(rng: random.Random) -> list[Step]:
    sids = [fresh_id("s") for _ in range(3)]
    kinds = ["append"] * 4 + ["state", "entities", "metadata", "touch", "load", "get_state"]
    kinds += ["delete", "advance", "advance", "claim", "release"]
    steps: list[Step] = []
    for _ in range(150):
        kind = rng.choice(kinds)
        args: dict[str, Any] = {
            "sid": rng.choice(sids),
            "ttl": rng.choice([30, 90, 600]),
            "version": rng.choice([None, None, 0, 1, 2]),
        }
        if kind == "append":
            args["texts"] = [f"t{rng.randrange(10**6)}" for _ in range(rng.randint(1, 3))]
            args["window"] = rng.randint(1, 4)
            args["first"] = rng.choice([None, None, 0, 3])
        elif kind == "advance":
            args["seconds"] = rng.choice([10, 40, 100, 700])
        elif kind in ("claim", "release"):
            args["owner"] = rng.choice(["w1", "w2"])
            args["limit"] = rng.choice([1, 2, 10])
        args["name"] = rng.choice(["a", "b"])
        args["include"] = rng.random() < 0.5
        steps.append((kind, args))
    return steps


async def _apply_hot(env: Env, store: Any, operation: str, a: dict[str, Any]) -> object:
    sid, expires, now = a["sid"], _later(env, a["ttl"]), env.clock.now()
    match operation:
        case "append":
            r = await store.append_turns(
                sid,
                [text_turn(t) for t in a["texts"]],
                window=a["window"],
                expires_at=expires,
                expected_version=a["version"],
                first_index=a["first"],
            )
            return (r.turns, r.version, r.next_index)
        case "state":
            return await store.put_state(
                sid,
                a["name"],
                {"ttl": a["ttl"]},
                expires_at=expires,
                expected_version=a["version"],
            )
        case "entities":
            upsert = {a["name"]: ActiveEntity(kind=a["name"], value="v", updated_at=now)}
            removed = ["b" if a["name"] == "a" else "a"]
            return await store.update_entities(sid, upsert, removed, expires_at=expires)
        case "metadata":
            return await store.put_metadata(
                sid, _metadata(env, sid), expires_at=expires, expected_version=a["version"]
            )
        case "touch":
            return await store.touch(sid, expires_at=expires)
        case "load":
            return await store.load(sid, include_expired=a["include"])
        case "get_state":
            return await store.get_state(sid, a["name"])
        case "delete":
            return await store.delete(sid)
        case "claim":
            return await store.claim_expired(owner=a["owner"], lease=LEASE, limit=a["limit"])
        case "release":
            return await store.release_expired(sid, owner=a["owner"])
    raise AssertionError(operation)


def _durable_steps(rng: random.Random) -> list[Step]:
    sids, users = [fresh_id("s") for _ in range(2)], [fresh_id("u") for _ in range(2)]
    memory_ids = [fresh_id("m") for _ in range(6)]
    kinds = ["append"] * 3 + ["get_turn", "get_turns", "tail", "redact", "record", "get_record"]
    kinds += ["memory"] * 3 + ["query"] * 2 + ["get_memory", "delete_memory", "advance"]
    kinds += ["register", "list", "delete_session", "purge"]
    steps: list[Step] = []
    for _ in range(150):
        kind = rng.choice(kinds)
        start = rng.randint(0, 6)
        args: dict[str, Any] = {
            "sid": rng.choice(sids),
            "user": rng.choice(users),
            "n": rng.randint(1, 3),
            "ttl": rng.choice([None, None, 50, 200]),
            "first": rng.choice([None, None, 0, 2]),
            "index": rng.randint(0, 8),
            "start": start,
            "end": rng.choice([None, start, start + 3]),
            "count": rng.randint(0, 5),
            "kind": rng.choice(["summary", "structured"]),
            "version": rng.choice([None, None, 0, 1, 2]),
            "memory_id": rng.choice(memory_ids),
            "type": rng.choice(["preference", "fact", "feedback"]),
            "age": rng.choice([0, 100, 100, 5000]),
            "types": rng.choice([None, ["preference"], ["fact", "feedback"], ["nope"]]),
            "since": rng.choice([None, 150, 6000]),
            "until": rng.choice([None, 50, 150]),
            "limit": rng.randint(1, 5),
            "include": rng.random() < 0.3,
            "seconds": rng.choice([30, 120]),
        }
        steps.append((kind, args))
    return steps


async def _apply_durable(env: Env, store: Any, operation: str, a: dict[str, Any]) -> object:
    sid, user, now = a["sid"], a["user"], env.clock.now()
    expires = None if a["ttl"] is None else _later(env, a["ttl"])
    match operation:
        case "append":
            turns = [text_turn(f"{sid}-{i}") for i in range(a["n"])]
            return await store.append_turns(sid, turns, first_index=a["first"], expires_at=expires)
        case "get_turn":
            return await store.get_turn(sid, a["index"])
        case "get_turns":
            return await store.get_turns(sid, a["start"], a["end"])
        case "tail":
            return await store.tail_turns(sid, a["count"])
        case "redact":
            return await store.redact_turn(sid, a["index"])
        case "record":
            return await store.put_record(
                sid, a["kind"], {"n": a["n"]}, expected_version=a["version"], expires_at=expires
            )
        case "get_record":
            return await store.get_record(sid, a["kind"])
        case "memory":
            current = await store.get_memory(user, a["memory_id"])
            version = None if a["version"] is None else (current.version if current else 0)
            record = MemoryRecord(
                memory_id=a["memory_id"],
                user_id=user,
                memory_type=a["type"],
                content=f"c{a['n']}",
                created_at=now - timedelta(seconds=a["age"]),
                expires_at=expires,
                version=1 if version is None else version + 1,
            )
            return await store.put_memory(record, expected_version=version)
        case "query":
            since = None if a["since"] is None else now - timedelta(seconds=a["since"])
            until = None if a["until"] is None else now - timedelta(seconds=a["until"])
            found = await store.query_memories(
                user,
                memory_types=a["types"],
                since=since,
                until=until,
                limit=a["limit"],
                include_expired=a["include"],
            )
            return [(r.memory_id, r.memory_type, r.version) for r in found]
        case "get_memory":
            return await store.get_memory(user, a["memory_id"])
        case "delete_memory":
            return await store.delete_memory(user, a["memory_id"])
        case "advance":
            env.clock.advance(a["seconds"])
            return None
        case "register":
            ref = SessionRef(session_id=sid, user_id=user, created_at=now)
            return await store.register_session(ref)
        case "list":
            return await store.list_sessions(user, limit=a["limit"])
        case "delete_session":
            return await store.delete_session(sid)
        case "purge":
            return await store.purge_user(user)
    raise AssertionError(operation)


@pytest.mark.parametrize("seed", range(4))
async def test_hot_store_agrees_with_the_reference(env: Env, seed: int) -> None:
    reference = MemoryHotStore(clock=env.clock, gc_grace=GRACE)
    await _agree(env, reference, env.hot, _hot_steps(random.Random(seed)))


@pytest.mark.parametrize("seed", range(4))
async def test_durable_store_agrees_with_the_reference(env: Env, seed: int) -> None:
    reference = MemoryDurableStore(clock=env.clock)
    await _agree(env, reference, env.durable, _durable_steps(random.Random(seed)))
