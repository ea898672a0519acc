"""Breakers shared by two worker processes through one Redis: one worker opens the breaker
and the other sees it open; when both race for the half-open probe, exactly one probes; a
prober killed mid-probe loses its lease and the other worker recovers the tool."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.backends.redis import fresh_prefix
from tests.conftest import server_url

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2030, 1, 1, tzinfo=UTC)
ANSWER_TIMEOUT_S = 30.0


class WorkerProcess:
    """A ``tests.tools.breaker_worker`` process, spoken to in JSON lines."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, url: str, prefix: str) -> WorkerProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.tools.breaker_worker",
            url,
            prefix,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(process)
        assert await worker._read() == {"ready": True}
        return worker

    async def _read(self) -> Any:
        assert self.process.stdout is not None
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            line = await self.process.stdout.readline()
        assert line, f"worker exited with {await self.process.wait()}"
        return json.loads(line)

    async def ask(self, op: str, **fields: Any) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        await self.process.stdin.drain()
        return await self._read()

    async def set_clock(self, at: datetime) -> None:
        await self.ask("clock", at=at.isoformat())

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    await self.process.wait()
            except TimeoutError:
                self.kill()
                await self.process.wait()


@pytest.fixture
async def workers() -> AsyncIterator[tuple[WorkerProcess, WorkerProcess]]:
    url, prefix = server_url("redis"), fresh_prefix()
    a, b = await asyncio.gather(WorkerProcess.start(url, prefix), WorkerProcess.start(url, prefix))
    try:
        yield a, b
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def set_clocks(at: datetime, *workers: WorkerProcess) -> None:
    await asyncio.gather(*(w.set_clock(at) for w in workers))


async def open_breaker(worker: WorkerProcess) -> None:
    await worker.ask("behave", mode="raise")
    answers = [await worker.ask("call", n=1) for _ in range(3)]
    tools = [answer["results"][0]["tool"] for answer in answers]
    # Two plain failures raise; the third opens the breaker and the fallback answers.
    assert tools == [None, None, "cached_search"]


async def test_one_worker_opens_the_breaker_and_the_other_sees_it_open(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    a, b = workers
    await open_breaker(a)
    assert await b.ask("state") == {"status": "open", "probe_id": None}
    answer = await b.ask("call", n=3)
    assert answer["search_invocations"] == 0
    assert [r["tool"] for r in answer["results"]] == ["cached_search"] * 3
    note = answer["results"][0]["note"]
    assert note.startswith("Tool 'search' is unavailable since 00:00:00 UTC")
    assert "it will be retried at 00:00:30 UTC" in note


@pytest.mark.parametrize("round_", range(3))
async def test_exactly_one_probe_across_both_workers(
    workers: tuple[WorkerProcess, WorkerProcess], round_: int
) -> None:
    a, b = workers
    await open_breaker(a)
    await set_clocks(T0 + timedelta(seconds=30), a, b)
    await asyncio.gather(a.ask("behave", mode="slow_ok"), b.ask("behave", mode="slow_ok"))
    start_at = time.time() + 0.5
    answers = await asyncio.gather(
        a.ask("call", n=10, start_at=start_at), b.ask("call", n=10, start_at=start_at)
    )
    assert sum(answer["probes"] for answer in answers) == 1
    assert sum(answer["search_invocations"] for answer in answers) == 1
    tools = sorted(r["tool"] for answer in answers for r in answer["results"])
    assert tools == ["cached_search"] * 19 + ["search"]
    assert await a.ask("state") == await b.ask("state") == {"status": "closed", "probe_id": None}


async def test_a_killed_probers_lease_runs_out_and_the_other_worker_recovers(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    a, b = workers
    await open_breaker(a)
    await set_clocks(T0 + timedelta(seconds=30), a, b)
    await a.ask("behave", mode="hang")
    await a.ask("call_in_background")  # a now holds the probe ...
    a.kill()  # ... and dies holding it
    await a.process.wait()
    state = await b.ask("state")
    assert state["status"] == "half_open"
    assert state["probe_id"]
    await b.ask("behave", mode="ok")
    answer = await b.ask("call", n=2)
    assert answer["search_invocations"] == 0  # the lease still runs: b does not probe
    assert "a recovery check is in progress" in answer["results"][0]["note"]
    await b.set_clock(T0 + timedelta(seconds=50))  # the 20 s lease has run out
    answer = await b.ask("call", n=1)
    assert (answer["probes"], answer["results"][0]["tool"]) == (1, "search")
    assert await b.ask("state") == {"status": "closed", "probe_id": None}
