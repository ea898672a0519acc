"""CPU time per turn: ``add_turn`` then ``history()``, through the public API, background
work included (indexing, detection; the service is drained before the clock stops).

Process CPU time (``time.process_time``: every thread, SQLite's included) is steadier than
wall time on a shared machine. Writes ``bench/results/turn_cpu.json``::

    python bench/turn_cpu.py [--turns 2000] [--pairing memory+memory] [--pairing embedded]

Pairings: ``memory+memory`` (both tiers in-process) and ``embedded`` (in-process hot tier +
SQLite file: the default). A quick probe for profiling the Python path; the full picture
(every pairing, redis-server CPU, round trips, 1/50/500 sessions) is ``bench/turns.py``.
Automatic summaries are off here, as there: they are their own background work.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results


def _service(pairing: str, tmp: Path, *, summaries: bool = False) -> MemoryService:
    if pairing == "memory+memory":
        settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    elif pairing == "embedded":
        settings = TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp / "bench.db"
        )
    else:
        raise SystemExit(f"unknown pairing {pairing!r}")
    return MemoryService.from_settings(settings, auto_summarize=summaries)


async def measure(pairing: str, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp)) as memory:
            session = await memory.session(user_id="bench-user")
            for i in range(50):  # warm caches, compile regexes, open the file
                await session.add_turn("user", MESSAGES[i % len(MESSAGES)])
            await memory.drain()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                await session.add_turn(role, MESSAGES[i % len(MESSAGES)])
                await session.history()
            await memory.drain()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "pairing": pairing,
        "turns": turns,
        "cpu_us_per_turn": round(cpu / turns * 1e6, 1),
        "turns_per_s": round(turns / wall, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--pairing", action="append")
    parser.add_argument("--out", type=Path, default=RESULTS / "turn_cpu.json")
    args = parser.parse_args()
    results = [await measure(p, args.turns) for p in args.pairing or ["memory+memory", "embedded"]]
    for r in results:
        print(
            f"{r['pairing']:>14}: {r['cpu_us_per_turn']:8.1f} µs CPU/turn, "
            f"{r['turns_per_s']:7.1f} turns/s"
        )
    await asyncio.to_thread(write_results, args.out, results)


if __name__ == "__main__":
    asyncio.run(main())
