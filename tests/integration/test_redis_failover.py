"""kill -9 of a Redis Cluster master mid-load: the replica takes over, nothing acknowledged is lost.

The test starts its own cluster (3 masters + 3 replicas, ``--cluster-node-timeout 1000``)
on free loopback ports, never the shared one scripts/test.sh starts. The hot tier is the
cluster, the durable tier SQLite, write-through. Sessions append concurrently; at 30% of
the load the master that owns one session's slot (the victim) dies by SIGKILL. What must
hold:

* while the slot has no master the service still answers the victim session, from the
  durable tier (a view, and a turn acknowledged);
* the load goes on (bypassing the hot tier where it must) until the replica is promoted,
  and finishes after it;
* every acknowledged turn is in the durable tier at the index it was acknowledged with,
  every session's indexes are gap-free, nothing is stored twice;
* after the failover the victim session reloads (or reads hot) with exactly its last
  acknowledged turns, and then reads hot.

The load pauses at 60% until the promotion is seen, so the order kill → outage load →
promotion → load is the same on every run whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from tests.integration.conftest import open_role
from tests.reliability.conftest import missing
from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.store.backends.redis import RedisHotStore
from tiermem.store.backends.redis_scripts import RedisKeys
from tiermem.testing import FakeClock
from tiermem.tiers import SessionTierConfig, WritePolicy

pytestmark = pytest.mark.slow

SESSIONS = 8
TURNS_PER_SESSION = 40
WINDOW = 10
PREFIX = "fo"
STARTUP_TIMEOUT = 20.0
PROMOTION_TIMEOUT = 20.0


def _port_pair_free(port: int) -> bool:
    """``port`` and its cluster bus port (``port + 10000``) both free on loopback."""
    for candidate in (port, port + 10000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _cluster_ports(count: int) -> list[int]:
    ports: list[int] = []
    rng = random.Random()
    while len(ports) < count:
        # Ports 20000-22767, bus ports 30000-32767: the two ranges cannot overlap, and
        # both lie below Linux's ephemeral range (32768+), where outgoing connections
        # would take them.
        port = rng.randrange(20000, 22768)
        if port not in ports and _port_pair_free(port):
            ports.append(port)
    return ports


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class OwnCluster:
    """Six redis-servers of this test's own in cluster mode, 3 masters with a replica each."""

    def __init__(self, server: str, cli: str, workdir: Path) -> None:
        self.server = server
        self.cli = cli
        self.workdir = workdir
        self.ports = _cluster_ports(6)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start_node(self, port: int) -> None:
        """Start (or restart, on its own directory and nodes.conf) the node on ``port``."""
        home = self.workdir / f"node-{port}"
        home.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(  # noqa: S603 -- fixed binary and arguments
            [
                self.server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--save",
                "",
                "--appendonly",
                "no",
                # A replica that never finished its first sync may not take over:
                # start the sync at once instead of after the default 5 s.
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                str(home),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        for port in self.ports:
            self.start_node(port)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for port in self.ports:
            while not _ping(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not start")
                time.sleep(0.05)
        created = subprocess.run(  # noqa: S603 -- fixed binary and arguments
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=STARTUP_TIMEOUT,
            check=False,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout!r}")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()

    @property
    def live_ports(self) -> list[int]:
        return sorted(self.procs)


async def _nodes(port: int) -> list[tuple[int, dict[str, Any]]]:
    """``CLUSTER NODES`` as node ``port`` sees it (redis-py parses it): (port, fields)."""
    async with Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
        nodes = await client.execute_command("CLUSTER NODES")
    return [
        (int(address.split("@")[0].rsplit(":", 1)[1]), fields) for address, fields in nodes.items()
    ]


async def _wait_cluster_ok(ports: list[int]) -> None:
    """Every node in ``ports`` says cluster_state:ok (all slots served by a live master)."""
    deadline = time.monotonic() + PROMOTION_TIMEOUT
    while True:
        states = []
        for port in ports:
            async with Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
                info = await client.execute_command("CLUSTER INFO")
            states.append(info.get("cluster_state"))
        if all(state == "ok" for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster not ok on {ports} after {PROMOTION_TIMEOUT}s: {states}")
        await asyncio.sleep(0.1)


async def _owner(port: int, slot: int) -> tuple[int, str] | None:
    """(port, node id) of the master serving ``slot`` as node ``port`` sees it; None
    while it sees none (the old master failed, the replica not yet promoted)."""
    for node_port, fields in await _nodes(port):
        if "master" not in fields["flags"] or "fail" in fields["flags"]:
            continue
        for low, *high in fields["slots"]:
            if int(low) <= slot <= int(high[0] if high else low):
                return node_port, str(fields["node_id"])
    return None


async def _master_of_slot(port: int, slot: int) -> tuple[int, str]:
    owner = await _owner(port, slot)
    assert owner is not None, f"no master serves slot {slot}"
    return owner


async def _replica_of(port: int, master_id: str) -> int:
    """The port of ``master_id``'s replica as node ``port`` sees it, waiting for gossip:
    a replica's own link can be up before other nodes have heard that it replicates."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        for node_port, fields in await _nodes(port):
            if "slave" in fields["flags"] and fields["master_id"] == master_id:
                return node_port
        if time.monotonic() > deadline:
            raise AssertionError(f"master {master_id} has no replica after {STARTUP_TIMEOUT}s")
        await asyncio.sleep(0.1)


async def _replicas_known_everywhere(ports: list[int]) -> bool:
    """Every node's ``CLUSTER NODES`` shows each master with a replica (gossip has
    converged: a replica's link is up before the other nodes have heard of it)."""
    for port in ports:
        nodes = await _nodes(port)
        masters = {str(f["node_id"]) for _, f in nodes if "master" in f["flags"]}
        served = {str(f["master_id"]) for _, f in nodes if "slave" in f["flags"]}
        if len(masters) != 3 or served != masters:
            return False
    return True


async def _wait_replicas_synced(ports: list[int]) -> None:
    """Every replica's link to its master is up (its first full sync is done)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        links = []
        for port in ports:
            async with Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
                info = await client.info("replication")
            if info.get("role") == "slave":
                links.append(info.get("master_link_status") == "up")
        if len(links) == 3 and all(links) and await _replicas_known_everywhere(ports):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas not in sync after {STARTUP_TIMEOUT}s: {links}")
        await asyncio.sleep(0.1)


async def _wait_promoted(ports: list[int], replica: int, slot: int) -> None:
    """Every live node sees ``replica`` as the master of ``slot`` and says cluster_state:ok."""
    deadline = time.monotonic() + PROMOTION_TIMEOUT
    while True:
        owners = {port: await _owner(port, slot) for port in ports}
        if {owner[0] if owner else None for owner in owners.values()} == {replica}:
            await _wait_cluster_ok(ports)
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {replica} not promoted: {owners}")
        await asyncio.sleep(0.1)


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[OwnCluster]:
    server = os.environ.get("TIERMEM_TEST_REDIS_SERVER_BIN") or shutil.which("redis-server")
    cli = shutil.which("redis-cli")
    if server and not cli:
        sibling = Path(server).with_name("redis-cli")
        cli = str(sibling) if sibling.exists() else None
    if not server or not cli:
        missing("redis-server and redis-cli are not installed: run scripts/test.sh")
    assert server is not None
    assert cli is not None
    cluster = OwnCluster(server, cli, tmp_path)
    try:
        cluster.start()
        asyncio.run(_wait_cluster_ok(cluster.ports))
        asyncio.run(_wait_replicas_synced(cluster.ports))
        yield cluster
    finally:
        cluster.stop()


async def test_kill_9_a_cluster_master_mid_load_loses_no_acknowledged_turn(
    own_cluster: OwnCluster, tmp_path: Path
) -> None:
    clock = FakeClock()
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in own_cluster.ports)
    hot = RedisHotStore.from_url(urls, cluster=True, clock=clock, prefix=PREFIX)
    durable = await open_role("sqlite", "durable", clock, tmp_path)
    memory = MemoryService(
        hot,
        durable,
        clock=clock,
        config=SessionTierConfig(window=WINDOW, write_policy=WritePolicy.WRITE_THROUGH),
        index_turns=False,
        auto_detect=False,
        auto_summarize=False,
    )
    total = SESSIONS * TURNS_PER_SESSION
    acked: dict[str, list[Turn]] = {}
    failed: list[BaseException] = []
    killed, promoted = asyncio.Event(), asyncio.Event()
    kill_at, pause_at = asyncio.Event(), asyncio.Event()
    outage: dict[str, object] = {}

    def acked_count() -> int:
        return sum(len(turns) for turns in acked.values())

    async def load(session: Session) -> None:
        mine = acked.setdefault(session.id, [])
        for n in range(TURNS_PER_SESSION):
            if n == int(TURNS_PER_SESSION * 0.6):
                pause_at.set()
                await promoted.wait()  # the rest of the load runs after the failover
            try:
                turn = await session.add_turn("user", f"{session.id} turn {n}")
            except Exception as exc:  # noqa: BLE001 -- an unacknowledged turn may fail; count it
                failed.append(exc)
                continue
            mine.append(turn)
            if acked_count() >= total * 0.3:
                kill_at.set()
            await asyncio.sleep(0)

    async def fault(victim: Session) -> None:
        await kill_at.wait()
        slot = key_slot(RedisKeys(PREFIX).hot_meta(victim.id).encode())
        survivor = own_cluster.ports[0]
        master_port, master_id = await _master_of_slot(survivor, slot)
        if master_port == survivor:
            survivor = next(p for p in own_cluster.ports if p != master_port)
        replica_port = await _replica_of(survivor, master_id)
        own_cluster.kill(master_port)
        killed.set()
        # The slot has no master for at least the node timeout (1 s): the victim is
        # answered from the durable tier, reads and writes.
        reopened = await memory.session(victim.id, user_id=victim.user_id)
        view = await reopened.view()
        outage["source"] = view.source
        turn = await reopened.add_turn("user", "victim during the outage")
        acked[victim.id].append(turn)
        outage["bypasses"] = memory.metrics.bypasses
        await pause_at.wait()
        await _wait_promoted(own_cluster.live_ports, replica_port, slot)
        promoted.set()

    try:
        sessions = [await memory.session(user_id=f"u-{n % 3}") for n in range(SESSIONS)]
        victim = sessions[0]
        acked[victim.id] = []
        await asyncio.gather(fault(victim), *(load(s) for s in sessions))
        assert killed.is_set()
        assert promoted.is_set()
        assert outage["source"] == "durable"
        assert isinstance(outage["bypasses"], int)
        assert outage["bypasses"] > 0, "the outage was never bypassed"

        for session_id, turns in acked.items():
            archived = await durable.get_turns(session_id, 0, None)
            assert [t.index for t in archived] == list(range(len(archived))), session_id
            by_index = {t.index: t.text for t in archived}
            lost = [t.index for t in turns if by_index.get(t.index) != t.text]
            assert lost == [], (session_id, lost)
            assert len({t.text for t in archived}) == len(archived), session_id

        # After the failover the hot tier serves again: the victim's window is exactly its
        # last acknowledged turns, whether it reloaded or its hot copy was already right.
        for session in sessions:
            reopened = await memory.session(session.id, user_id=session.user_id)
            view = await reopened.view()
            assert view.source in ("reload", "hot"), session.id
            expected = sorted(acked[session.id], key=lambda t: t.index)[-WINDOW:]
            assert [(t.index, t.text) for t in view.turns] == [
                (t.index, t.text) for t in expected
            ], session.id
            assert (await reopened.view()).source == "hot", session.id
        print(
            f"\nfailover: {acked_count()} acknowledged, {len(failed)} refused, "
            f"{memory.metrics.bypasses} bypasses, {memory.metrics.reloads} reloads, 0 lost"
        )
    finally:
        await memory.aclose()
