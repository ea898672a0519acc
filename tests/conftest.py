"""Shared fixtures: the backends under test.

Redis and DynamoDB tests run against real servers whose addresses come from
``TIERMEM_TEST_REDIS_URL``, ``TIERMEM_TEST_REDIS_CLUSTER_URL`` (a startup node of a
3-master Redis Cluster) and ``TIERMEM_TEST_DYNAMODB_URL`` (scripts/test.sh starts all three).
When ``TIERMEM_REQUIRE_BACKENDS=1`` (always in CI) a missing server is an error, never a skip.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

# Keep pytest's assert-rewritten test modules (and tiermem's bytecode) in __pycache__
# (git-ignored) even where the environment sets PYTHONDONTWRITEBYTECODE=1: rewriting the
# ~270 test modules' asserts is most of the CPU of collecting the suite, and a cached module
# is reused until its source changes (pytest checks the file's mtime and size). Set before
# tiermem's first import (below), or the modules that import loads (tiermem/__init__,
# settings, models, the store contract) are compiled again by every run and every process
# a test starts. The variable goes too, so those processes (``python -m tiermem`` servers,
# MCP servers, workers) cache what only they import instead of compiling it each start.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from tiermem.testing import BackendUnderTest, FakeClock  # noqa: E402 -- after the above


# S108: pytest makes its own pytest-of-<user> folder there (0700, owner checked).
def _temproot_in_memory(shm: Path = Path("/dev/shm"), need: int = 2 << 30) -> None:  # noqa: S108
    """Put pytest's tmp_path folders on the tmpfs at ``/dev/shm`` when it has room (``need``
    bytes free), unless the run chose a root (``PYTEST_DEBUG_TEMPROOT``, ``--basetemp``).

    Most tests' SQLite files live in tmp_path, and on a disk every commit and checkpoint
    waits for an fsync (opening a SQLite deployment: ~80 ms on disk, ~15 ms on tmpfs). No
    test depends on surviving a power cut, only on a killed process, which tmpfs keeps.
    pytest still numbers the runs' folders and keeps the last three.
    """
    if "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return
    try:
        st = os.statvfs(shm)
    except OSError:
        return
    if st.f_bavail * st.f_frsize >= need and os.access(shm, os.W_OK | os.X_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(shm)


_temproot_in_memory()


def _servers_of_this_worker() -> None:
    """Point the plain server variables at this pytest-xdist worker's own servers:
    scripts/test.sh starts a set per worker (``TIERMEM_TEST_REDIS_URL_GW0``, ...), since
    tests read and change server-wide state (INFO commandstats, the slowlog, SCRIPT FLUSH,
    CONFIG SET) that another worker's tests would disturb. Set in the environment, so the
    processes a test starts (servers, workers) use the same set."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker:
        return
    for var in (
        "TIERMEM_TEST_REDIS_URL",
        "TIERMEM_TEST_REDIS_CLUSTER_URL",
        "TIERMEM_TEST_DYNAMODB_URL",
    ):
        own = os.environ.get(f"{var}_{worker.upper()}")
        if own:
            os.environ[var] = own
        elif os.environ.get(var) and require_backends():
            # One set shared by several workers would let their tests disturb each other.
            raise pytest.UsageError(
                f"{var} is set but {var}_{worker.upper()} is not: run the suite through "
                "scripts/test.sh, which starts servers for each worker, or pass -n 0"
            )


BACKENDS = ["memory", "sqlite", "redis", "redis-cluster", "dynamodb"]


def require_backends() -> bool:
    return os.environ.get("TIERMEM_REQUIRE_BACKENDS", "") == "1"


_servers_of_this_worker()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker runs with COLUMNS=80 in its environment (a lone pytest process
    # has none). rich reads it when a console is built and keeps it, so the CLI's output
    # would wrap where it does not in one process, whichever test built the console first.
    # The workers run as one process does: no size set.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


_TEST_LOOP = os.environ.get("TIERMEM_TEST_LOOP", "asyncio")
if _TEST_LOOP not in ("asyncio", "uvloop"):
    raise pytest.UsageError(f"TIERMEM_TEST_LOOP must be asyncio or uvloop, got {_TEST_LOOP!r}")


if _TEST_LOOP == "uvloop":
    # scripts/test.sh's uvloop lane: the async tests run on uvloop's loop, as ``tiermem
    # serve``, ``tiermem mcp``, the CLI and SyncMemory do wherever uvloop is installed
    # (tiermem.runtime). The hook names one factory, so each test runs once, on it; a
    # test marked ``asyncio_internals`` reads asyncio's private state and keeps its loop.
    import uvloop

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
        if item.get_closest_marker("asyncio_internals"):  # e.g. counts loop._scheduled
            return {"asyncio": asyncio.new_event_loop}
        return {"uvloop": uvloop.new_event_loop}


def server_url(backend: str) -> str:
    """The URL of a real server for ``backend``; fails or skips the test when unset."""
    var = {
        "redis": "TIERMEM_TEST_REDIS_URL",
        "redis-cluster": "TIERMEM_TEST_REDIS_CLUSTER_URL",
        "dynamodb": "TIERMEM_TEST_DYNAMODB_URL",
    }[backend]
    url = os.environ.get(var)
    if not url:
        message = f"{var} is not set: start the servers with scripts/test.sh"
        if require_backends():
            pytest.fail(message)
        pytest.skip(message)
    return url


async def open_backend(name: str, clock: FakeClock, tmp_path: Path) -> BackendUnderTest:
    if name == "memory":
        from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

        return BackendUnderTest(
            hot=MemoryHotStore(clock=clock), durable=MemoryDurableStore(clock=clock), clock=clock
        )
    if name == "sqlite":
        from tiermem.store.backends.sqlite import SQLiteDurableStore, SQLiteHotStore

        path = tmp_path / "tiermem.db"
        return BackendUnderTest(
            hot=SQLiteHotStore(path, clock=clock),
            durable=SQLiteDurableStore(path, clock=clock),
            clock=clock,
        )
    if name == "redis":
        from tests.backends.redis import open_redis_backend

        return await open_redis_backend(server_url("redis"), clock)
    if name == "redis-cluster":
        from tests.backends.redis import open_redis_cluster_backend

        return await open_redis_cluster_backend(server_url("redis-cluster"), clock)
    if name == "dynamodb":
        from tests.backends.dynamodb import open_dynamodb_backend

        return await open_dynamodb_backend(server_url("dynamodb"), clock)
    raise ValueError(f"unknown backend {name!r}")


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BackendUnderTest]:
    under_test = await open_backend(request.param, FakeClock(), tmp_path)
    try:
        yield under_test
    finally:
        await under_test.hot.aclose()
        await under_test.durable.aclose()


_passed_by_backend: Counter[str] = Counter()


def backends_named(params: str) -> set[str]:
    """The backends a test id's parameters name ("redis-cluster+dynamodb-3"), longest name
    first so that "redis-cluster" does not also count as "redis"."""
    named: set[str] = set()
    for name in sorted(BACKENDS, key=len, reverse=True):
        pattern = re.compile(rf"(?:^|(?<=[-+])){re.escape(name)}(?=$|[-+])")
        if pattern.search(params):
            named.add(name)
            params = pattern.sub("", params)
    return named


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed and report.nodeid.endswith("]"):
        params = report.nodeid[report.nodeid.rindex("[") + 1 : -1]
        for name in backends_named(params):
            _passed_by_backend[name] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _passed_by_backend:
        counts = ", ".join(f"{name}={_passed_by_backend[name]}" for name in BACKENDS)
        terminalreporter.write_line(f"tests passed per backend: {counts}")
