"""Redis Cluster for real: configuration, repeated concurrency, redirections, the doctor.

Everything runs on the 3-master cluster scripts/test.sh starts
(``TIERMEM_TEST_REDIS_CLUSTER_URL``). The conformance suite and the session, long-term and
index integration tests run on it as the ``redis-cluster`` backend; this file adds what a
single run cannot show: that the concurrency tests pass round after round, each round on
a new client (the first burst of commands on a new cluster client is where redis-py's
client used to close connections under other tasks), that a slot moved under a live
client is followed, and what ``tiermem doctor`` reports.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from typer.testing import CliRunner

from tests.backends.redis import open_redis_stores
from tests.conftest import server_url
from tiermem.composition import open_durable_store, open_hot_store, open_search_index
from tiermem.errors import BackendUnavailableError, ValidationError
from tiermem.interfaces.cli import app
from tiermem.longterm.index_redis import RedisIndex
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.backends.redis_cluster import (
    check_redis,
    describe_redis,
    probe_key_groups,
)
from tiermem.store.backends.redis_scripts import (
    client_from_url,
    cluster_client_from_url,
    same_server,
)
from tiermem.testing import BackendUnderTest, FakeClock
from tiermem.testing import conformance_durable as durable_suite
from tiermem.testing import conformance_hot as hot_suite
from tiermem.testing import conformance_session as session_suite
from tiermem.testing import conformance_shared as shared_suite
from tiermem.testing.backend import fresh_id, text_turn

ROUNDS = 20
"""How often each concurrency test runs, each time on a new cluster client."""


@pytest.fixture
def cluster_url() -> str:
    return server_url("redis-cluster")


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- configuration ---------------------------------------------------------------------------


def test_several_urls_need_cluster_mode() -> None:
    with pytest.raises(ValidationError, match="TIERMEM_REDIS_CLUSTER"):
        client_from_url("redis://10.0.0.1:6379,redis://10.0.0.2:6379")


@pytest.mark.parametrize(
    ("urls", "match"),
    [
        ("unix:///tmp/redis.sock", "unix socket"),
        ("redis://10.0.0.1:6379/2", "database"),
        ("redis://10.0.0.1:6379,rediss://10.0.0.2:6379", "mix"),
        (" , ", "at least one"),
    ],
)
def test_cluster_urls_a_cluster_cannot_use_are_refused(urls: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        cluster_client_from_url(urls)


async def test_settings_build_cluster_stores_and_index(cluster_url: str) -> None:
    """TIERMEM_REDIS_CLUSTER=true with two startup nodes, one of them down: the
    composition root builds cluster clients, the hot store appends through to the durable
    one in one script, and a turn round-trips through the service."""
    settings = TierMemSettings(
        hot_backend="redis",
        durable_backend="redis",
        redis_cluster=True,
        redis_url=f"redis://127.0.0.1:{_unused_port()},{cluster_url}",
        redis_prefix=f"c{fresh_id('p')[2:10]}",
    )
    clock = FakeClock()
    hot = open_hot_store(settings, clock=clock)
    durable = open_durable_store(settings, clock=clock)
    index = open_search_index(settings, clock=clock)
    try:
        assert isinstance(hot, RedisHotStore)
        assert isinstance(hot.client, RedisCluster)
        assert isinstance(durable, RedisDurableStore)
        assert isinstance(durable.client, RedisCluster)
        assert isinstance(index, RedisIndex)
        assert len(hot.client.startup_nodes) == 2
        assert hot.can_append_through(durable)  # two clients, one cluster, one prefix
        memory = MemoryService(hot, durable, clock=clock, auto_detect=False)
        session = await memory.session(user_id=fresh_id("u"))
        await session.add_turn("user", "hello cluster")
        assert [t.text for t in await durable.get_turns(session.id)] == ["hello cluster"]
    finally:
        await hot.aclose()
        await durable.aclose()
        if index is not None:
            await index.aclose()


def test_cluster_clients_agree_only_on_the_same_startup_nodes() -> None:
    a = cluster_client_from_url("redis://10.0.0.1:6379,redis://10.0.0.2:6379")
    b = cluster_client_from_url(["redis://10.0.0.2:6379", "redis://10.0.0.1:6379"])
    c = cluster_client_from_url("redis://10.0.0.3:6379")
    standalone = client_from_url("redis://10.0.0.1:6379")
    assert same_server(a, b)
    assert not same_server(a, c)
    assert not same_server(a, standalone)


def test_cluster_client_never_resends_a_command_by_itself() -> None:
    """A resent write script that had run would be applied twice (or answer a false
    conflict): the client built here has redis-py's retries off, and follows a MOVED by
    patching one slot instead of closing every connection."""
    client = cluster_client_from_url("redis://10.0.0.1:6379")
    assert client.retry.get_retries() == 0
    assert client.reinitialize_steps == 0


# -- concurrency, round after round ----------------------------------------------------------

Suite = Callable[[BackendUnderTest], Awaitable[None]]

_CONCURRENCY_TESTS: dict[str, Suite] = {
    name: test
    for module in (durable_suite, hot_suite, session_suite, shared_suite)
    for name, test in vars(module).items()
    if name.startswith("test_")
    and ("concurrent" in name or name == "test_durable_get_memories_large_batch")
}


def test_the_concurrency_tests_were_found() -> None:
    assert len(_CONCURRENCY_TESTS) >= 10
    for test in _CONCURRENCY_TESTS.values():
        assert list(inspect.signature(test).parameters) == ["backend"]


async def _fresh_backend(url: str) -> BackendUnderTest:
    clock = FakeClock()
    hot, durable = open_redis_stores(url, clock, cluster=True)
    return BackendUnderTest(hot=hot, durable=durable, clock=clock)


@pytest.mark.parametrize("name", sorted(_CONCURRENCY_TESTS))
async def test_concurrency_holds_round_after_round(name: str, cluster_url: str) -> None:
    """Each concurrency test of the conformance suite, ROUNDS times, each round on a new
    client whose first commands race each other (before the fix, 3 of 5 runs of the gap
    test and every run of the large batch failed)."""
    for _ in range(ROUNDS):
        backend = await _fresh_backend(cluster_url)
        try:
            await _CONCURRENCY_TESTS[name](backend)
        finally:
            await backend.hot.aclose()
            await backend.durable.aclose()


async def test_eight_writers_store_each_turn_exactly_once(cluster_url: str) -> None:
    """The issue's reproduction: 8 tasks x 50 turns to one session through
    RedisDurableStore.append_turns on a new client stored 401-402 turns with duplicated
    texts, or failed with a raw AttributeError. Now: exactly 400, gap-free, every round."""
    for _ in range(ROUNDS):
        backend = await _fresh_backend(cluster_url)
        sid = fresh_id("s")

        async def writer(w: int, durable: Any = backend.durable, sid: str = sid) -> None:
            for i in range(50):
                await durable.append_turns(sid, [text_turn(f"w{w}-{i}")])

        try:
            await asyncio.gather(*(writer(w) for w in range(8)))
            turns = await backend.durable.get_turns(sid)
        finally:
            await backend.hot.aclose()
            await backend.durable.aclose()
        assert [t.index for t in turns] == list(range(400))
        assert sorted(t.text for t in turns) == sorted(
            f"w{w}-{i}" for w in range(8) for i in range(50)
        )


async def test_service_turns_through_both_tiers_round_after_round(cluster_url: str) -> None:
    """The one-script turn path (hot + durable in one EVALSHA) under 8 concurrent writers
    on a new client each round: every turn once in the archive, the window = its tail."""
    for _ in range(ROUNDS):
        backend = await _fresh_backend(cluster_url)
        try:
            assert backend.hot.can_append_through(backend.durable)  # type: ignore[attr-defined]
            memory = MemoryService(
                backend.hot, backend.durable, clock=backend.clock, auto_detect=False
            )
            session = await memory.session(user_id=fresh_id("u"))

            async def writer(w: int, session: Any = session) -> None:
                for i in range(10):
                    await session.add_turn("user", f"w{w}-{i}")

            await asyncio.gather(*(writer(w) for w in range(8)))
            await memory.background.drain()
            archived = await backend.durable.get_turns(session.id)
            snap = await backend.hot.load(session.id)
            await memory.aclose()  # its background work, then both stores
        finally:
            await backend.hot.aclose()
            await backend.durable.aclose()
        assert [t.index for t in archived] == list(range(80))
        assert len({t.text for t in archived}) == 80
        assert snap is not None
        assert list(snap.turns) == archived[-len(snap.turns) :]


# -- a slot moved under a live client ----------------------------------------------------------


async def _home_and_away(admin: RedisCluster, slot: int) -> tuple[Redis, Redis]:
    """Plain clients on the master that serves ``slot`` and on another master."""
    home = admin.nodes_manager.get_node_from_slot(slot)
    away = next(n for n in admin.get_primaries() if n.name != home.name)
    return Redis(host=home.host, port=int(home.port)), Redis(host=away.host, port=int(away.port))


async def _node_id(client: Redis) -> str:
    return str(await client.execute_command("CLUSTER", "MYID"), "utf-8")  # type: ignore[no-untyped-call]


async def _move_slot(source: Redis, target: Redis, slot: int, *, finish: bool = True) -> None:
    """The steps of ``redis-cli --cluster reshard`` for one slot: IMPORTING on the target,
    MIGRATING on the source, MIGRATE every key, then (``finish``) assign the slot."""
    src_id, dst_id = await _node_id(source), await _node_id(target)
    await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)  # type: ignore[no-untyped-call]
    await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)  # type: ignore[no-untyped-call]
    host = target.connection_pool.connection_kwargs["host"]
    port = target.connection_pool.connection_kwargs["port"]
    for _ in range(1000):  # bounded: a key MIGRATE cannot move must fail the test, not hang it
        keys = await source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)  # type: ignore[no-untyped-call]
        if not keys:
            break
        await source.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)  # type: ignore[no-untyped-call]
    else:
        raise AssertionError(f"slot {slot} still holds keys after 1000 MIGRATE rounds")
    if finish:
        for node in (target, source):
            await node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)  # type: ignore[no-untyped-call]


async def _settle(admin: RedisCluster, slot: int, owner: Redis) -> None:
    """Give the slot to ``owner`` on every master (undoes a half-done migration)."""
    owner_id = await _node_id(owner)
    for node in admin.get_primaries():
        client = Redis(host=node.host, port=int(node.port))
        try:
            await client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner_id)  # type: ignore[no-untyped-call]
        finally:
            await client.aclose()


@pytest.fixture
async def admin(cluster_url: str) -> AsyncIterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    await client.initialize()
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_session_whose_slot_moved_is_followed(
    admin: RedisCluster, cluster_url: str
) -> None:
    """Reshard the slot of a live session to another master while the store's client
    still has the old slot map: the next turn follows the MOVED answer, nothing is lost,
    and the slot goes back afterwards."""
    backend = await _fresh_backend(cluster_url)
    sid = fresh_id("s")
    durable = backend.durable
    assert isinstance(durable, RedisDurableStore)
    slot = int(await admin.execute_command("CLUSTER KEYSLOT", durable.keys.archive(sid)))
    home, away = await _home_and_away(admin, slot)
    try:
        await durable.append_turns(sid, [text_turn("before")])
        await _move_slot(home, away, slot)
        await durable.append_turns(sid, [text_turn("after")])
        assert [t.text for t in await durable.get_turns(sid)] == ["before", "after"]
        await _move_slot(away, home, slot)
        await durable.append_turns(sid, [text_turn("home again")])
        assert [t.index for t in await durable.get_turns(sid)] == [0, 1, 2]
    finally:
        await _settle(admin, slot, home)
        await backend.hot.aclose()
        await backend.durable.aclose()
        await home.aclose()
        await away.aclose()


async def test_a_slot_in_migration_answers_a_retryable_error(
    admin: RedisCluster, cluster_url: str
) -> None:
    """Halfway through a migration (the slot MIGRATING, its keys already moved, the
    owner not yet switched) a session's script is redirected with ASK; a script whose keys
    are split between the nodes gets TRYAGAIN. Either way the store answers, or raises the
    retryable BackendUnavailableError, never redis-py's internals."""
    backend = await _fresh_backend(cluster_url)
    durable = backend.durable
    assert isinstance(durable, RedisDurableStore)
    sid = fresh_id("s")
    slot = int(await admin.execute_command("CLUSTER KEYSLOT", durable.keys.archive(sid)))
    home, away = await _home_and_away(admin, slot)
    migrated = False
    try:
        await durable.append_turns(sid, [text_turn("before")])
        migrated = True
        await _move_slot(home, away, slot, finish=False)
        try:
            await durable.append_turns(sid, [text_turn("during")])
            outcome = "applied"
        except BackendUnavailableError as exc:
            outcome = "retryable" if exc.retryable else "not retryable"
        assert outcome in ("applied", "retryable")
        await _settle(admin, slot, away)
        turns = await durable.get_turns(sid)
        expected = ["before", "during"] if outcome == "applied" else ["before"]
        assert [t.text for t in turns] == expected
    finally:
        if migrated:  # the keys live on ``away`` now: finish there, then move them back
            await _settle(admin, slot, away)
            await _move_slot(away, home, slot)
        await _settle(admin, slot, home)
        await backend.hot.aclose()
        await backend.durable.aclose()
        await home.aclose()
        await away.aclose()


# -- tiermem doctor ------------------------------------------------------------------------------


async def test_doctor_reports_a_cluster_and_one_slot_per_session_and_user(
    cluster_url: str,
) -> None:
    topology = await check_redis(TierMemSettings(redis_url=cluster_url, redis_cluster=True))
    assert (topology.mode, topology.masters, topology.slots_from) == ("cluster", 3, "server")
    assert topology.ok, topology.problems
    assert set(topology.slots) == {"session", "user"}
    assert all(len(slots) == 1 for slots in topology.slots.values())
    assert "Redis Cluster, 3 masters" in topology.summary()


async def test_doctor_reports_a_standalone_server() -> None:
    topology = await check_redis(TierMemSettings(redis_url=server_url("redis")))
    assert (topology.mode, topology.masters, topology.slots_from) == ("standalone", 1, "client")
    assert topology.ok
    assert "standalone Redis server" in topology.summary()


async def test_doctor_flags_a_standalone_client_on_a_cluster_node(cluster_url: str) -> None:
    topology = await check_redis(TierMemSettings(redis_url=cluster_url))
    assert not topology.ok
    assert topology.masters == 3
    assert "TIERMEM_REDIS_CLUSTER=true" in topology.summary()


async def test_doctor_flags_keys_that_span_slots(cluster_url: str) -> None:
    """The check can fail: two sessions' keys in one group hash to two slots."""
    groups = probe_key_groups("tm")
    mixed = {"session": [*groups["session"], "tm:{s=another}:meta"]}
    client = cluster_client_from_url(cluster_url)
    try:
        topology = await describe_redis(client, mixed)
    finally:
        await client.aclose()
    assert len(topology.slots["session"]) == 2
    assert not topology.ok
    assert "CROSSSLOT" in topology.summary()


def test_tiermem_doctor_names_the_cluster(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "TIERMEM_HOT_BACKEND": "redis",
        "TIERMEM_DURABLE_BACKEND": "redis",
        "TIERMEM_REDIS_CLUSTER": "true",
        "TIERMEM_REDIS_URL": cluster_url,
        "TIERMEM_REDIS_PREFIX": f"d{fresh_id('p')[2:10]}",
    }.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.stdout
    assert "[ok  ] redis topology: Redis Cluster, 3 masters" in result.stdout
    assert "session keys -> slot" in result.stdout
