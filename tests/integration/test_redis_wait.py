"""``TIERMEM_REDIS_WAIT_REPLICAS``: with Redis as the durable tier, a turn returns only once
N replicas acknowledged it (Redis ``WAIT`` on the write's own connection, same round trip).

Real redis-server processes started by each test on free loopback ports, never the shared
ones: a standalone master with one replica, and a 3 masters + 3 replicas cluster (the
failover test's own cluster, :class:`tests.integration.test_redis_failover.OwnCluster`).
A stalled replica is a real one stopped with SIGSTOP (it acknowledges nothing, as a
replica stuck in a long pause would; on the cluster its replication link is also cut with
CLIENT KILL, since a stopped process's kernel still buffers what its master sends); a dead
master is killed with SIGKILL. No fakes.

What must hold:

* a write the replica acknowledged returns normally, and the replica holds it already;
* with the replica stalled the call raises NotReplicatedError within the timeout; the turn
  is on the master; a retry with the same idempotency key writes nothing twice -- while
  the replica is still stalled it is *not* confirmed (even on a new connection, whose own
  WAIT would otherwise count nothing of the first write), once it catches up it is;
* a plain turn with WAIT on is still one round trip;
* on a cluster, after kill -9 of the master owning a loaded session's slot and the
  replica's promotion, every turn that was acknowledged is on the new master -- and a
  control without WAIT shows the failover does lose acknowledged turns when the replica
  lags, so the check can fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import NodesManager, RedisCluster
from redis.crc import key_slot

from tests.integration.test_redis_failover import (
    OwnCluster,
    _cluster_ports,
    _master_of_slot,
    _nodes,
    _ping,
    _replica_of,
    _wait_cluster_ok,
    _wait_promoted,
    _wait_replicas_synced,
)
from tests.reliability.conftest import missing
from tiermem.composition import open_durable_store
from tiermem.errors import BackendError, NotReplicatedError, ValidationError
from tiermem.models import NewTurn, Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.redis import (
    RedisDurableStore,
    RedisHotStore,
    ReplicaWait,
    client_from_url,
)
from tiermem.store.backends.redis_cluster import check_redis
from tiermem.store.backends.redis_scripts import RedisKeys
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn
from tiermem.testing.round_trips import RoundTrips
from tiermem.tiers import SessionTierConfig

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT = 20.0
WAIT_MS = 200
"""WAIT timeout of the stalled-replica cases (each such call takes this long)."""
LOAD_WAIT_MS = 2000
"""WAIT timeout under load on a shared machine: generous, so that a slow acknowledgement
is not mistaken for a missing one."""
PREFIX = "wt"


def _servers() -> tuple[str, str]:
    server = os.environ.get("TIERMEM_TEST_REDIS_SERVER_BIN") or shutil.which("redis-server")
    cli = shutil.which("redis-cli")
    if server and not cli:
        sibling = Path(server).with_name("redis-cli")
        cli = str(sibling) if sibling.exists() else None
    if not server or not cli:
        missing("redis-server and redis-cli are not installed: run scripts/test.sh")
    assert server is not None
    assert cli is not None
    return server, cli


class MasterWithReplica:
    """Two redis-servers of this test's own: a standalone master and its replica."""

    def __init__(self, server: str, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.master, self.replica = _cluster_ports(2)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def _start(self, port: int, *extra: str) -> None:
        home = self.workdir / f"node-{port}"
        home.mkdir()
        self.procs[port] = subprocess.Popen(  # noqa: S603 -- fixed binary and arguments
            [
                self.server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                str(home),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        self._start(self.master)
        self._start(self.replica, "--replicaof", "127.0.0.1", str(self.master))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for port in (self.master, self.replica):
            while not _ping(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server {port} did not start")
                time.sleep(0.05)

    def stall_replica(self) -> None:
        self.procs[self.replica].send_signal(signal.SIGSTOP)

    def resume_replica(self) -> None:
        self.procs[self.replica].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.master}/0"


async def _replica_synced(port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        async with Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
            info = await client.info("replication")
        if info.get("master_link_status") == "up":
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {port} not in sync after {STARTUP_TIMEOUT}s")
        await asyncio.sleep(0.05)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[MasterWithReplica]:
    server, _ = _servers()
    servers = MasterWithReplica(server, tmp_path)
    try:
        servers.start()
        asyncio.run(_replica_synced(servers.replica))
        yield servers
    finally:
        servers.stop()


@asynccontextmanager
async def _stores(
    url: str, wait: ReplicaWait | None, *, cluster: bool = False
) -> AsyncIterator[tuple[RedisHotStore, RedisDurableStore, FakeClock]]:
    """A hot and a durable store on one client, as the composition root builds them."""
    clock = FakeClock()
    client = client_from_url(url, cluster=cluster)
    hot = RedisHotStore(client, clock=clock, prefix=PREFIX)
    durable = RedisDurableStore(client, clock=clock, prefix=PREFIX, replica_wait=wait)
    try:
        yield hot, durable, clock
    finally:
        await client.aclose()


def _quick(durable: RedisDurableStore, clock: FakeClock) -> RedisDurableStore:
    """The same store (same client) waiting only :data:`WAIT_MS` for its replica: for the
    writes made while the replica is stalled, so each fails fast."""
    return RedisDurableStore(
        durable.client, clock=clock, prefix=PREFIX, replica_wait=ReplicaWait(1, WAIT_MS)
    )


def _turn(text: str) -> NewTurn:
    return text_turn(text, at=datetime(2026, 1, 1, tzinfo=UTC))


async def _archived_on(port: int, session_id: str, *, cluster: bool = False) -> list[bytes]:
    """The session's archive as the server on ``port`` holds it (master or replica; a
    cluster replica answers reads only after READONLY, on the same connection)."""
    async with Redis(host="127.0.0.1", port=port, single_connection_client=True) as client:
        if cluster:
            await client.execute_command("READONLY")
        raws: list[bytes] = await client.lrange(RedisKeys(PREFIX).archive(session_id), 0, -1)
    return raws


# -- settings ---------------------------------------------------------------------------


def test_wait_settings_are_validated_and_reach_the_durable_store() -> None:
    with pytest.raises(ValueError, match="only when Redis is the durable tier"):
        TierMemSettings(redis_wait_replicas=1, durable_backend="sqlite")
    with pytest.raises(ValueError, match="redis_wait_timeout_ms"):
        TierMemSettings(redis_wait_replicas=1, durable_backend="redis", redis_wait_timeout_ms=0)
    with pytest.raises(ValueError, match="redis_wait_replicas"):
        TierMemSettings(redis_wait_replicas=-1, durable_backend="redis")
    with pytest.raises(ValidationError, match="at least 1 replica"):
        ReplicaWait(0, 100)
    with pytest.raises(ValidationError, match="block the write forever"):
        ReplicaWait(1, 0)
    # Building the store opens no connection.
    settings = TierMemSettings(
        durable_backend="redis", redis_wait_replicas=2, redis_wait_timeout_ms=250
    )
    store = open_durable_store(settings)
    assert isinstance(store, RedisDurableStore)
    assert store.replica_wait == ReplicaWait(2, 250)
    off = open_durable_store(TierMemSettings(durable_backend="redis"))
    assert isinstance(off, RedisDurableStore)
    assert off.replica_wait is None


# -- standalone master + replica --------------------------------------------------------


async def test_acknowledged_writes_are_on_the_replica_when_they_return(
    pair: MasterWithReplica,
) -> None:
    async with _stores(pair.url, ReplicaWait(1, LOAD_WAIT_MS)) as (hot, durable, clock):
        stored = await durable.append_turns("s-plain", [_turn("one")], idempotency_key="k1")
        assert [t.index for t in stored] == [0]
        turns, result = await hot.append_through(
            durable,
            "s-through",
            [_turn("two")],
            window=10,
            hot_expires_at=clock.now() + timedelta(hours=1),
            durable_expires_at=None,
        )
        assert result is not None
        assert [t.index for t in turns] == [0]
        record = await durable.put_record("s-plain", "notes", {"a": 1})
        assert record.version == 1
        # Read from the replica itself, at once: WAIT returned only after it had them.
        assert len(await _archived_on(pair.replica, "s-plain")) == 1
        assert len(await _archived_on(pair.replica, "s-through")) == 1
        async with Redis(host="127.0.0.1", port=pair.replica) as replica:
            assert await replica.hexists(RedisKeys(PREFIX).records("s-plain"), "notes")


async def test_a_stalled_replica_raises_and_a_keyed_retry_is_harmless(
    pair: MasterWithReplica,
) -> None:
    async with _stores(pair.url, ReplicaWait(1, LOAD_WAIT_MS)) as (_, durable, clock):
        await durable.append_turns("s-1", [_turn("before")])  # acknowledged by the replica
        quick = _quick(durable, clock)
        pair.stall_replica()
        started = time.monotonic()
        with pytest.raises(NotReplicatedError) as raised:
            await quick.append_turns("s-1", [_turn("during")], idempotency_key="k-during")
        elapsed = time.monotonic() - started
        error = raised.value
        assert (error.required, error.acknowledged, error.retryable) == (1, 0, True)
        assert "stored on the Redis master" in str(error)
        assert elapsed >= WAIT_MS / 1000 * 0.9, "WAIT did not wait for the replica"
        # The turn is on the master, at its index.
        assert [t.text for t in await durable.get_turns("s-1")] == ["before", "during"]

        # A retry on a new client (a fresh connection, whose own WAIT would count none of
        # the first write) while the replica is still stalled: recognised, nothing written
        # twice, and still not confirmed.
        async with _stores(pair.url, ReplicaWait(1, WAIT_MS)) as (_, fresh, _clock2):
            with pytest.raises(NotReplicatedError):
                await fresh.append_turns("s-1", [_turn("during")], idempotency_key="k-during")
        assert [t.text for t in await durable.get_turns("s-1")] == ["before", "during"]

        # An append without an idempotency key says a blind retry would duplicate it.
        with pytest.raises(NotReplicatedError) as unkeyed:
            await quick.append_turns("s-1", [_turn("unkeyed")])
        assert unkeyed.value.retryable is False
        assert "no idempotency key" in str(unkeyed.value)

        pair.resume_replica()
        again = await durable.append_turns("s-1", [_turn("during")], idempotency_key="k-during")
        assert [(t.index, t.text) for t in again] == [(1, "during")]
        assert [t.text for t in await durable.get_turns("s-1")] == ["before", "during", "unkeyed"]
        assert len(await _archived_on(pair.replica, "s-1")) == 3


async def test_the_combined_append_waits_too(pair: MasterWithReplica) -> None:
    async with _stores(pair.url, ReplicaWait(1, LOAD_WAIT_MS)) as (hot, durable, clock):
        expires = clock.now() + timedelta(hours=1)
        quick = _quick(durable, clock)

        async def through(text: str, key: str, store: RedisDurableStore = durable) -> list[Turn]:
            turns, _ = await hot.append_through(
                store,
                "s-c",
                [_turn(text)],
                window=10,
                hot_expires_at=expires,
                durable_expires_at=None,
                idempotency_key=key,
            )
            return turns

        await through("first", "k1")
        pair.stall_replica()
        try:
            with pytest.raises(NotReplicatedError) as raised:
                await through("second", "k2", quick)
            assert raised.value.retryable is True
            assert [t.text for t in await durable.get_turns("s-c")] == ["first", "second"]
            hot_turns = await durable.client.lrange(RedisKeys(PREFIX).hot_session("s-c")[1], 0, -1)
            assert len(hot_turns) == 2, "the hot half of the combined append was not written"
        finally:
            pair.resume_replica()
        again = await through("second", "k2")
        assert [(t.index, t.text) for t in again] == [(1, "second")]
        assert [t.text for t in await durable.get_turns("s-c")] == ["first", "second"]


async def test_a_record_write_waits_and_a_conditional_one_is_not_blindly_retryable(
    pair: MasterWithReplica,
) -> None:
    async with _stores(pair.url, ReplicaWait(1, LOAD_WAIT_MS)) as (_, durable, clock):
        await durable.put_record("s-r", "notes", {"v": 1})
        quick = _quick(durable, clock)
        pair.stall_replica()
        try:
            with pytest.raises(NotReplicatedError) as plain:
                await quick.put_record("s-r", "notes", {"v": 2})
            assert plain.value.retryable is True
            with pytest.raises(NotReplicatedError) as conditional:
                await quick.put_record("s-r", "notes", {"v": 3}, expected_version=2)
            assert conditional.value.retryable is False
            record = await durable.get_record("s-r", "notes")
            assert record is not None
            assert (record.version, record.data) == (3, {"v": 3})
        finally:
            pair.resume_replica()


async def test_a_turn_with_wait_on_is_still_one_round_trip(pair: MasterWithReplica) -> None:
    async with _stores(pair.url, ReplicaWait(1, LOAD_WAIT_MS)) as (hot, durable, clock):
        memory = MemoryService(
            hot,
            durable,
            clock=clock,
            config=SessionTierConfig(window=10),
            index_turns=False,
            auto_detect=False,
            auto_summarize=False,
        )
        session = await memory.session(user_id="u-rt")
        await session.add_turn("user", "Hello!")
        await session.add_turn("assistant", "Hi.")
        await memory.drain()
        trips = RoundTrips()
        with trips.counting():
            turn = await session.add_turn("user", "ok thanks")
        assert trips.total == 1, dict(trips.counts)
        assert (await _archived_on(pair.replica, session.id))[-1].endswith(
            f',"index":{turn.index}}}'.encode()
        )
        await memory.drain()


# -- cluster: 3 masters + 3 replicas ----------------------------------------------------

SESSIONS = 6
TURNS = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OwnCluster]:
    """The failover test's own cluster: 3 masters with a replica each, node timeout 1 s."""
    server, cli = _servers()
    nodes = OwnCluster(server, cli, tmp_path)
    try:
        nodes.start()
        asyncio.run(_wait_cluster_ok(nodes.ports))
        asyncio.run(_wait_replicas_synced(nodes.ports))
        yield nodes
    finally:
        nodes.stop()


def _restart(cluster: OwnCluster, port: int) -> None:
    """Start a killed node again on its own directory and nodes.conf: it learns that its
    replica took its slots over and rejoins as that node's replica."""
    cluster.start_node(port)


async def _cluster_load(
    cluster: OwnCluster, wait: ReplicaWait
) -> tuple[dict[str, list[Turn]], list[BaseException]]:
    """Sessions append concurrently through the one-script path (WAIT in the same round
    trip); at 30% of the load the master owning the first session's slot dies by SIGKILL;
    at 60% the load waits for the replica's promotion and for the old master to rejoin as
    its replica (so WAIT 1 can be met again), then finishes. Answers the acknowledged
    turns per session and the failures (turns not acknowledged)."""
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.ports)
    acked: dict[str, list[Turn]] = {}
    failed: list[BaseException] = []
    kill_at, pause_at, resumed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    sessions = [f"s-{n}" for n in range(SESSIONS)]
    async with _stores(urls, wait, cluster=True) as (hot, durable, clock):
        expires = clock.now() + timedelta(hours=1)

        async def load(session_id: str) -> None:
            mine = acked.setdefault(session_id, [])
            for n in range(TURNS):
                if n == int(TURNS * 0.6):
                    pause_at.set()
                    await resumed.wait()
                try:
                    turns, _ = await hot.append_through(
                        durable,
                        session_id,
                        [_turn(f"{session_id} turn {n}")],
                        window=10,
                        hot_expires_at=expires,
                        durable_expires_at=None,
                        idempotency_key=f"{session_id}-{n}",
                    )
                except BackendError as exc:  # not acknowledged: it may be lost; counted
                    failed.append(exc)
                    continue
                mine.extend(turns)
                if sum(len(t) for t in acked.values()) >= SESSIONS * TURNS * 0.3:
                    kill_at.set()

        async def fault() -> None:
            await kill_at.wait()
            slot = key_slot(RedisKeys(PREFIX).archive(sessions[0]).encode())
            survivor = cluster.ports[0]
            master_port, master_id = await _master_of_slot(survivor, slot)
            if master_port == survivor:
                survivor = next(p for p in cluster.ports if p != master_port)
            replica_port = await _replica_of(survivor, master_id)
            cluster.kill(master_port)
            await pause_at.wait()
            await _wait_promoted(cluster.live_ports, replica_port, slot)
            _restart(cluster, master_port)
            for _ in range(int(STARTUP_TIMEOUT / 0.05)):
                if _ping(master_port):
                    break
                await asyncio.sleep(0.05)
            await _wait_replicas_synced(cluster.live_ports)
            resumed.set()

        await asyncio.gather(fault(), *(load(s) for s in sessions))
    return acked, failed


async def _lost_after_failover(urls: str, acked: dict[str, list[Turn]]) -> dict[str, list[int]]:
    """Acknowledged turns missing from (or different on) the masters now serving them,
    read by a new client; also checks indexes are gap-free and nothing is stored twice."""
    lost: dict[str, list[int]] = {}
    async with _stores(urls, None, cluster=True) as (_, durable, _clock):
        for session_id, turns in acked.items():
            archived = await durable.get_turns(session_id)
            assert [t.index for t in archived] == list(range(len(archived))), session_id
            assert len({t.text for t in archived}) == len(archived), session_id
            by_index = {t.index: t.text for t in archived}
            missing_turns = [t.index for t in turns if by_index.get(t.index) != t.text]
            if missing_turns:
                lost[session_id] = missing_turns
    return lost


@pytest.mark.parametrize("round_", range(3))
async def test_cluster_failover_keeps_every_turn_wait_acknowledged(
    cluster: OwnCluster, round_: int
) -> None:
    acked, failed = await _cluster_load(cluster, ReplicaWait(1, LOAD_WAIT_MS))
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.live_ports)
    total = sum(len(turns) for turns in acked.values())
    assert total >= SESSIONS * TURNS // 2, f"too little was acknowledged: {total}, {failed[:3]}"
    assert await _lost_after_failover(urls, acked) == {}
    refused = sum(isinstance(exc, NotReplicatedError) for exc in failed)
    print(
        f"\nround {round_}: {total} acknowledged with WAIT 1, {len(failed)} refused "
        f"({refused} NotReplicatedError), 0 lost"
    )


async def test_cluster_failover_with_a_lagging_replica_loses_only_unacknowledged_turns(
    cluster: OwnCluster,
) -> None:
    """The replica of a session's master is stalled (SIGSTOP) and its replication link
    cut (CLIENT KILL TYPE replica on the master) while turns are written, as a replica
    behind a broken link; then the master dies and the replica, resumed, is promoted
    without them. Without WAIT those
    turns were acknowledged and are lost (the control: this check can fail); with WAIT
    each of them raised NotReplicatedError, nothing acknowledged is lost, and the refused
    turns, sent again with their idempotency keys after the promotion, are stored once."""
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.ports)
    keys = RedisKeys(PREFIX)
    survivor = cluster.ports[0]
    # Two sessions whose slots two different masters serve, neither of them `survivor`.
    victims: dict[int, tuple[str, int, str]] = {}
    n = 0
    while len(victims) < 2:
        session_id = f"lag-{n}"
        n += 1
        slot = key_slot(keys.archive(session_id).encode())
        master_port, master_id = await _master_of_slot(survivor, slot)
        if master_port != survivor and master_port not in victims:
            victims[master_port] = (session_id, slot, master_id)

    outcomes: dict[str, tuple[str, int, int, dict[str, list[int]]]] = {}
    for (master_port, (session_id, slot, master_id)), wait in zip(
        victims.items(), [None, ReplicaWait(1, LOAD_WAIT_MS)], strict=True
    ):
        replica_port = await _replica_of(survivor, master_id)
        acked: dict[str, list[Turn]] = {session_id: []}
        refused = 0
        async with _stores(urls, wait, cluster=True) as (_, durable, clock):
            acked[session_id] += await durable.append_turns(
                session_id, [_turn("before")], idempotency_key="k-before"
            )
            stalled = durable if wait is None else _quick(durable, clock)
            await _replica_has(replica_port, session_id, 1)  # "before" is replicated
            cluster.procs[replica_port].send_signal(signal.SIGSTOP)
            # A stopped process's kernel still takes in what its master sends, and hands
            # it over on SIGCONT: cut the replication link too, from the master's side.
            async with Redis(host="127.0.0.1", port=master_port) as master:
                await master.execute_command("CLIENT", "KILL", "TYPE", "replica")
            try:
                for i in range(3):
                    try:
                        acked[session_id] += await stalled.append_turns(
                            session_id, [_turn(f"stalled {i}")], idempotency_key=f"k{i}"
                        )
                    except NotReplicatedError:
                        refused += 1
                cluster.kill(master_port)
            finally:
                cluster.procs[replica_port].send_signal(signal.SIGCONT)
        await _wait_promoted(cluster.live_ports, replica_port, slot)
        live = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.live_ports)
        lost = await _lost_after_failover(live, acked)
        outcomes["wait" if wait else "no wait"] = (
            session_id,
            len(acked[session_id]),
            refused,
            lost,
        )
        if wait is not None:
            # The promoted replica has no replica of its own: confirm nothing more, just
            # send the refused turns again with their keys.
            async with _stores(live, None, cluster=True) as (_, plain, _clock):
                for i in range(3):
                    await plain.append_turns(
                        session_id, [_turn(f"stalled {i}")], idempotency_key=f"k{i}"
                    )
                    await plain.append_turns(
                        session_id, [_turn(f"stalled {i}")], idempotency_key=f"k{i}"
                    )
                texts = [t.text for t in await plain.get_turns(session_id)]
            assert texts == ["before", "stalled 0", "stalled 1", "stalled 2"]

    control, acked_no_wait, refused_no_wait, lost_no_wait = outcomes["no wait"]
    assert (acked_no_wait, refused_no_wait) == (4, 0), outcomes
    assert lost_no_wait == {control: [1, 2, 3]}, outcomes
    _, acked_wait, refused_wait, lost_wait = outcomes["wait"]
    assert (acked_wait, refused_wait, lost_wait) == (1, 3, {}), outcomes


async def _replica_has(port: int, session_id: str, count: int) -> None:
    """Wait until the replica on ``port`` holds ``count`` archived turns of the session."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while len(await _archived_on(port, session_id, cluster=True)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {port} never got turn {count - 1} of {session_id}")
        await asyncio.sleep(0.02)


async def test_doctor_flags_a_master_with_fewer_replicas_than_the_writes_wait_for(
    pair: MasterWithReplica,
) -> None:
    def settings(replicas: int) -> TierMemSettings:
        return TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=pair.url,
            redis_wait_replicas=replicas,
        )

    assert (await check_redis(settings(1))).ok
    short = await check_redis(settings(2))
    assert not short.ok
    assert "TIERMEM_REDIS_WAIT_REPLICAS=2 but a master has only 1" in short.summary()


async def test_a_connection_broken_under_a_waited_write_makes_the_client_rediscover(
    cluster: OwnCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master closes the connection a waited write goes out on (CLIENT KILL, as a dying
    node's socket does): the reply read fails, which redis-py's per-node pipeline leaves as
    each command's result instead of raising. The store must treat that node as failed
    all the same -- rediscover the slot map, so that a failover is found on the next
    call -- and a later write must work on a fresh connection."""
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.ports)
    async with _stores(urls, ReplicaWait(1, LOAD_WAIT_MS), cluster=True) as (_, durable, _c):
        session_id = "s-broken"
        await durable.append_turns(session_id, [_turn("first")], idempotency_key="k-0")
        slot = key_slot(RedisKeys(PREFIX).archive(session_id).encode())
        master_port, _ = await _master_of_slot(cluster.ports[0], slot)
        client = durable.client
        assert isinstance(client, RedisCluster)
        rediscovered: list[str | None] = []
        real_initialize = NodesManager.initialize

        async def initialize(self: NodesManager, *args: Any, **kwargs: Any) -> None:
            rediscovered.append(kwargs.get("last_failed_node_name"))  # a spy: the real one runs
            await real_initialize(self, *args, **kwargs)

        monkeypatch.setattr(NodesManager, "initialize", initialize)
        async with Redis(host="127.0.0.1", port=master_port) as admin:
            killed = await admin.execute_command(
                "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
            )
        assert int(killed) >= 1
        with pytest.raises(BackendError) as broken:
            await durable.append_turns(session_id, [_turn("second")], idempotency_key="k-1")
        assert broken.value.retryable
        assert rediscovered == [f"127.0.0.1:{master_port}"]
        # The retry (same key) goes out on a new connection and is confirmed.
        await durable.append_turns(session_id, [_turn("second")], idempotency_key="k-1")
        texts = [t.text for t in await durable.get_turns(session_id)]
        assert texts == ["first", "second"]


async def test_a_waited_write_follows_moved_and_waits_on_the_new_master(
    cluster: OwnCluster,
) -> None:
    """The session's (empty) slot is handed to another master after the client learnt the
    slot map: the waited write is answered MOVED and follows it, and its WAIT goes with it
    to the new master -- with that master's replica stalled it raises NotReplicatedError
    (a WAIT left on the old master's connection would be met by the old replica); once the
    replica is back the keyed retry is confirmed and the replica holds the turn."""
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in cluster.ports)
    async with _stores(urls, ReplicaWait(1, LOAD_WAIT_MS), cluster=True) as (_, durable, clock):
        session_id = "s-moved"
        assert await durable.get_turns(session_id) == []  # the client has the slot map
        slot = key_slot(RedisKeys(PREFIX).archive(session_id).encode())
        old_port, _ = await _master_of_slot(cluster.ports[0], slot)
        new_port, new_id = next(
            (port, str(fields["node_id"]))
            for port, fields in await _nodes(old_port)
            if "master" in fields["flags"] and port != old_port
        )
        replica = await _replica_of(new_port, new_id)
        masters = [port for port, fields in await _nodes(old_port) if "master" in fields["flags"]]
        others = [port for port in masters if port not in (new_port, old_port)]
        # The new owner first, then the other masters, the former owner last, as redis-cli
        # ends a migration (a master told directly does not wait for gossip, which a loaded
        # machine slows down).
        for port in (new_port, *others, old_port):
            async with Redis(host="127.0.0.1", port=port) as admin:
                await admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", new_id)
        # As a migration ends: every node agrees on the new owner (the replicas learn it by
        # gossip) before the write, so only the client's own slot map is stale.
        views: list[int] = []
        for _ in range(600):  # up to 30 s: gossip on a loaded 2-core machine
            views = [(await _master_of_slot(port, slot))[0] for port in cluster.ports]
            if all(view == new_port for view in views):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the nodes never agreed on slot {slot}'s owner: {views}")
        cluster.procs[replica].send_signal(signal.SIGSTOP)
        try:
            async with Redis(host="127.0.0.1", port=new_port) as admin:
                await admin.execute_command("CLIENT", "KILL", "TYPE", "replica")
            with pytest.raises(NotReplicatedError):
                await _quick(durable, clock).append_turns(
                    session_id, [_turn("moved")], idempotency_key="k-0"
                )
        finally:
            cluster.procs[replica].send_signal(signal.SIGCONT)
        await durable.append_turns(session_id, [_turn("moved")], idempotency_key="k-0")
        assert [t.text for t in await durable.get_turns(session_id)] == ["moved"]
        # (the replica may not know yet that its master owns the slot: count its keys)
        async with Redis(host="127.0.0.1", port=replica) as admin:
            assert await admin.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0
        async with Redis(host="127.0.0.1", port=old_port) as admin:
            assert await admin.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
