"""Session benchmark: ``Session.add_turn`` end to end (tokens, importance, entities, both tiers).

Measures add_turn latency (p50/p99) and throughput (turns/s) for the embedded pairing
(in-process hot + SQLite) and the production pairing (Redis + DynamoDB Local), with 1 and
with 50 sessions written concurrently, write-through (the default). Results go to
``bench/results/sessions.json`` and ``bench/results/sessions.png``. Run with the servers up::

    TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh python bench/sessions.py

DynamoDB Local is a Java emulator on the same 2 cores, not the AWS service: its absolute
latencies say little about production; compare shapes, not milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def settings_for(pairing: str, tmp: Path) -> TierMemSettings:
    if pairing == "embedded":
        return TierMemSettings(
            hot_backend="memory",
            durable_backend="sqlite",
            sqlite_path=tmp / f"{uuid.uuid4().hex}.db",
        )
    from tiermem.store.backends.dynamodb import create_table

    table = f"tiermem-bench-{uuid.uuid4().hex[:6]}"
    endpoint = os.environ["TIERMEM_TEST_DYNAMODB_URL"]
    await create_table(table, endpoint_url=endpoint, region_name="us-east-1")
    return TierMemSettings(
        hot_backend="redis",
        durable_backend="dynamodb",
        redis_url=os.environ["TIERMEM_TEST_REDIS_URL"],
        redis_prefix=f"bench{uuid.uuid4().hex[:6]}",
        dynamodb_table=table,
        dynamodb_endpoint_url=endpoint,
        aws_region="us-east-1",
    )


async def run(pairing: str, concurrency: int, turns_per_session: int, tmp: Path) -> dict[str, Any]:
    memory = MemoryService.from_settings(await settings_for(pairing, tmp))
    latencies: list[float] = []
    try:
        sessions = [await memory.session(user_id=f"bench-user-{i}") for i in range(concurrency)]

        async def drive(session: Any) -> None:
            for i in range(turns_per_session):
                role = "user" if i % 2 == 0 else "assistant"
                start = time.perf_counter()
                await session.add_turn(role, MESSAGES[i % len(MESSAGES)])
                latencies.append((time.perf_counter() - start) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(drive(s) for s in sessions))
        wall = time.perf_counter() - start
        for session in sessions:
            await session.clear()
    finally:
        await memory.aclose()
    return {
        "turns": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies), 3),
        "turns_per_s": round(len(latencies) / wall, 1),
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    labels = [f"{r['pairing']}\n{r['concurrency']} sessions" for r in runs]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(runs))
    lat.bar([i - 0.2 for i in x], [r["p50_ms"] for r in runs], 0.4, label="p50")
    lat.bar([i + 0.2 for i in x], [r["p99_ms"] for r in runs], 0.4, label="p99")
    lat.set_xticks(list(x), labels, fontsize=8)
    lat.set_ylabel("add_turn latency (ms)")
    lat.legend()
    thr.bar(list(x), [r["turns_per_s"] for r in runs])
    thr.set_xticks(list(x), labels, fontsize=8)
    thr.set_ylabel("turns / s")
    fig.suptitle("tiermem add_turn, write-through")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def collect() -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairings", default="embedded,redis+dynamodb")
    parser.add_argument("--turns", type=int, default=2000, help="turns per run")
    parser.add_argument("--out", default=str(RESULTS / "sessions.json"))
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for pairing in args.pairings.split(","):
            for concurrency in (1, 50):
                per_session = max(1, args.turns // concurrency)
                stats = await run(pairing, concurrency, per_session, Path(tmp))
                results["runs"].append({"pairing": pairing, "concurrency": concurrency, **stats})
                print(
                    f"{pairing:16s} {concurrency:3d} sessions  p50 {stats['p50_ms']:7.2f} ms"
                    f"  p99 {stats['p99_ms']:7.2f} ms  {stats['turns_per_s']:8.1f} turns/s",
                    flush=True,
                )
    return args, results


def main() -> None:
    args, results = asyncio.run(collect())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
