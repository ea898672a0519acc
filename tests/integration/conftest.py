"""Fixtures for the session tier: the backend pairings users run, and a private redis-server.

Pairings: ``memory+sqlite`` (embedded default), ``redis+dynamodb`` (production),
``redis+sqlite`` and ``redis-cluster+redis-cluster`` (both tiers on a 3-master Redis
Cluster, one client and one key prefix as a deployment has). Redis, the cluster and
DynamoDB are real servers (see tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.conftest import require_backends, server_url
from tiermem.service import MemoryService
from tiermem.store.backends.redis_scripts import client_from_url
from tiermem.store.contract import DurableStore, HotStore
from tiermem.testing import FakeClock
from tiermem.tiers import SessionTierConfig

PAIRINGS = ["memory+sqlite", "redis+dynamodb", "redis+sqlite", "redis-cluster+redis-cluster"]

ONE_DEPLOYMENT = frozenset({"redis-cluster"})
"""Backends whose ``x+x`` pairing shares one client and one key prefix for both roles,
as the composition root builds them (so the hot store's combined append applies)."""


async def open_role(
    name: str, role: str, clock: FakeClock, tmp_path: Path
) -> HotStore | DurableStore:
    from tests.conftest import open_backend

    pair = await open_backend(name, clock, tmp_path)
    keep, drop = (pair.hot, pair.durable) if role == "hot" else (pair.durable, pair.hot)
    await drop.aclose()
    return keep


@dataclass
class Pairing:
    name: str
    hot: HotStore
    durable: DurableStore
    clock: FakeClock

    def service(self, config: SessionTierConfig | None = None, **engines: object) -> MemoryService:
        return MemoryService(self.hot, self.durable, clock=self.clock, config=config, **engines)  # type: ignore[arg-type]


@asynccontextmanager
async def open_pairing(name: str, tmp_path: Path) -> AsyncIterator[Pairing]:
    """A hot and a durable store named ``hot+durable`` on one fake clock, closed after."""
    hot_name, durable_name = name.split("+")
    clock = FakeClock()
    if hot_name == durable_name and hot_name in ONE_DEPLOYMENT:
        from tests.conftest import open_backend

        pair = await open_backend(hot_name, clock, tmp_path)
        try:
            yield Pairing(name, pair.hot, pair.durable, clock)
        finally:
            await pair.hot.aclose()
            await pair.durable.aclose()
        return
    for role in ("hot", "durable"):
        (tmp_path / role).mkdir(exist_ok=True)
    hot = await open_role(hot_name, "hot", clock, tmp_path / "hot")
    durable = await open_role(durable_name, "durable", clock, tmp_path / "durable")
    try:
        yield Pairing(name, hot, durable, clock)  # type: ignore[arg-type]
    finally:
        await hot.aclose()
        await durable.aclose()


@asynccontextmanager
async def open_composed_pairing(name: str, tmp_path: Path) -> AsyncIterator[Pairing]:
    """The pairing as the composition root builds it: one server (one key prefix) or one
    file for both roles when they are the same backend, so a combined append or read can
    apply; otherwise :func:`open_pairing`."""
    from tests.conftest import open_backend

    hot_name, durable_name = name.split("+")
    if hot_name != durable_name:
        async with open_pairing(name, tmp_path) as pairing:
            yield pairing
        return
    clock = FakeClock()
    pair = await open_backend(hot_name, clock, tmp_path)
    try:
        yield Pairing(name, pair.hot, pair.durable, clock)
    finally:
        await pair.hot.aclose()
        await pair.durable.aclose()


@pytest.fixture(params=PAIRINGS)
async def pairing(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    async with open_pairing(request.param, tmp_path) as opened:
        yield opened


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """A redis-server of this test's own, so the test can stop and restart it for real."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 -- a fixed binary with fixed arguments
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    binary = os.environ.get("TIERMEM_TEST_REDIS_SERVER_BIN") or shutil.which("redis-server")
    if not binary:
        message = "redis-server is not installed: run scripts/test.sh"
        if require_backends():
            pytest.fail(message)
        pytest.skip(message)
    server = RedisProcess(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["PAIRINGS", "Pairing", "RedisProcess", "open_pairing", "server_url"]


@pytest.fixture
async def client() -> AsyncIterator[Redis]:
    """A standalone Redis client on the test server, built as the stores build theirs
    (the direct-lane tests; a test file needing another kind of client defines its own)."""
    redis = client_from_url(server_url("redis"))
    try:
        yield redis
    finally:
        await redis.aclose()
