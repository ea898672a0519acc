"""Two processes on one session: 500 interleaved operations (appends, metadata updates,
counter increments).

Each process is a full service of its own (tests/reliability/concurrency_worker.py) on the
same stores: SQLite (hot and durable tiers in one file) or Redis + DynamoDB (the shared
real servers). They start together and interleave appends, metadata updates (``attributes``
is merged by compare-and-set) and compare-and-set increments of a state counter. What must
hold afterwards: no lost update (every attribute and every increment is there), every
acknowledged turn archived exactly once at its acknowledged index, indexes gap-free, each
writer's turns in its own order, and the hot window equal to the archive's tail.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.backends.dynamodb import shared_table
from tests.conftest import server_url
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

pytestmark = pytest.mark.slow

OPS_PER_WORKER = 250
"""Each worker's operations: 200 appends and 50 metadata updates and increments. (500 took
41-68 s on Redis + DynamoDB and proved nothing more: with 250 the writers still switch
88 (Redis + DynamoDB) and 192 (SQLite) times in a measured run; the test asks for 3.)"""
META_EVERY = 5  # every fifth operation: a metadata update and a counter increment


async def _settings(name: str, tmp_path: Path) -> dict[str, Any]:
    if name == "sqlite":
        return {
            "hot_backend": "sqlite",
            "durable_backend": "sqlite",
            "sqlite_path": str(tmp_path / "shared.db"),
        }
    endpoint = server_url("dynamodb")
    return {
        "hot_backend": "redis",
        "redis_url": server_url("redis"),
        "redis_prefix": f"c{uuid.uuid4().hex[:8]}",
        "durable_backend": "dynamodb",
        "dynamodb_endpoint_url": endpoint,
        "dynamodb_table": await shared_table(endpoint),
        "aws_region": "us-east-1",
    }


def _run_workers(
    settings: dict[str, Any], session_id: str, user_id: str, tmp_path: Path
) -> list[dict[str, Any]]:
    """Start both workers, let them go at once, and collect what each acknowledged."""
    go = tmp_path / "go"
    workers = []
    for worker in ("A", "B"):
        config = {
            "settings": settings,
            "worker": worker,
            "ops": OPS_PER_WORKER,
            "meta_every": META_EVERY,
            "session_id": session_id,
            "user_id": user_id,
            "go_file": str(go),
            "ready_file": str(tmp_path / f"ready-{worker}"),
        }
        workers.append(
            subprocess.Popen(  # noqa: S603 -- our own interpreter and module
                [sys.executable, "-m", "tests.reliability.concurrency_worker", json.dumps(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    # Go only once both have imported and opened the service (a process that starts a
    # second earlier would otherwise run most of its share alone).
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{w}").exists() for w in ("A", "B")):
        if any(p.poll() is not None for p in workers) or time.monotonic() > deadline:
            break  # a worker died (its error is reported below) or never got ready
        time.sleep(0.005)
    go.touch()
    results = []
    for process in workers:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err.decode()
        results.append(json.loads(out))
    return results


@pytest.mark.parametrize("stores", ["sqlite", "redis+dynamodb"])
async def test_two_processes_interleaving_on_one_session_lose_no_update(
    stores: str, tmp_path: Path
) -> None:
    settings = await _settings(stores, tmp_path)
    session_id, user_id = f"s-{uuid.uuid4().hex[:8]}", "u-conc"
    async with MemoryService.from_settings(TierMemSettings(**settings)) as memory:
        await memory.session(session_id, user_id=user_id)  # both processes resume it
    results = await asyncio.to_thread(_run_workers, settings, session_id, user_id, tmp_path)

    appends = OPS_PER_WORKER - OPS_PER_WORKER // META_EVERY
    async with MemoryService.from_settings(TierMemSettings(**settings)) as memory:
        session = await memory.session(session_id, user_id=user_id)
        archived = await session.get_turns(0, None)
        # Indexes gap-free, and exactly the acknowledged turns, each once, where acknowledged.
        assert [t.index for t in archived] == list(range(2 * appends))
        acked = {index: text for r in results for index, text in r["turns"]}
        assert len(acked) == 2 * appends  # no index acknowledged twice
        assert {t.index: t.text for t in archived} == acked
        for worker in ("A", "B"):  # each writer's turns in the order it wrote them
            mine = [int(t.text.split()[1]) for t in archived if t.text.startswith(worker)]
            assert mine == sorted(mine)
        # No lost update: every attribute either worker merged, and every increment.
        metadata = await session.metadata()
        written = {name for r in results for name in r["attributes"]}
        assert len(written) == 2 * (OPS_PER_WORKER // META_EVERY)
        assert set(metadata.attributes) == written
        assert metadata.turn_count == 2 * appends
        counter = await session.get_state("counter", fresh=True)
        assert counter is not None
        assert counter.data["n"] == sum(r["increments"] for r in results)
        # The hot window is the archive's tail.
        history = await session.history()
        assert [t.index for t in history] == [t.index for t in archived[-len(history) :]]
        # The two really interleaved (not one after the other).
        writers = [t.text[0] for t in archived]
        switches = sum(a != b for a, b in itertools.pairwise(writers))
        assert switches >= 3
        print(
            f"\n{stores}: {len(archived)} turns, {len(written)} attributes, "
            f"{counter.data['n']} increments, {switches} writer switches, 0 lost"
        )
