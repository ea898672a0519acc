"""CPU time per turn: ``add_turn`` then ``history()``, through the public API, background
work included (indexing, detection; the service is drained before the clock stops).

Process CPU time (``time.process_time``: every thread, SQLite's included) is steadier than
wall time on a shared machine. Writes ``bench/results/turn_cpu.json``::

    python bench/turn_cpu.py [--turns 2000] [--pairing memory+memory] [--pairing embedded]

Pairings: ``memory+memory`` (both tiers in-process) and ``embedded`` (in-process hot tier +
SQLite file: the default). A quick probe for profiling the Python path; the full picture
(every pairing, redis-server CPU, round trips, 1/50/500 sessions) is ``bench/turns.py``.
Automatic summaries are off by default; ``--summaries`` turns them on, as ``bench/turns.py``
does by default (a default service summarises as it goes, so that is part of a turn's cost).
``--pass-every N`` measures the summary passes alone, one through every N-th turn.
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


async def measure(pairing: str, turns: int, *, summaries: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp), summaries=summaries) as memory:
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
        "summaries": summaries,
        "turns": turns,
        "cpu_us_per_turn": round(cpu / turns * 1e6, 1),
        "turns_per_s": round(turns / wall, 1),
    }


async def measure_passes(pairing: str, turns: int, every: int) -> dict[str, Any]:
    """Summary passes alone: ``turns`` turns added with automatic summaries off, then a
    pass through every ``every``-th turn run inline (as the background would at that
    cadence: about 400 turns on memory+memory, whose background runs rarely during a
    back-to-back loop; about 20 on SQLite, whose awaits let it run). CPU of the passes
    only, per turn."""
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp)) as memory:
            session = await memory.session(user_id="bench-passes")
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                await session.add_turn(role, MESSAGES[i % len(MESSAGES)])
            await memory.drain()
            cpu = 0.0
            for through in range(every - 1, turns - 6, every):  # 6: the turns kept raw
                cpu0 = time.process_time()
                await memory.summaries.run(session.id, through=through)
                cpu += time.process_time() - cpu0
    return {
        "pairing": pairing,
        "summaries": "passes only",
        "pass_every": every,
        "turns": turns,
        "cpu_us_per_turn": round(cpu / turns * 1e6, 1),
        "turns_per_s": None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--pairing", action="append")
    parser.add_argument(
        "--summaries", action="store_true", help="automatic summaries on (as in bench/turns.py)"
    )
    parser.add_argument(
        "--pass-every",
        type=int,
        help="measure summary passes alone, one through every N-th turn (measure_passes)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "turn_cpu.json")
    args = parser.parse_args()
    pairings = args.pairing or ["memory+memory", "embedded"]
    if args.pass_every:
        results = [await measure_passes(p, args.turns, args.pass_every) for p in pairings]
    else:
        results = [await measure(p, args.turns, summaries=args.summaries) for p in pairings]
    for r in results:
        print(
            f"{r['pairing']:>14} summaries={_label(r['summaries'])}: "
            f"{r['cpu_us_per_turn']:8.1f} µs CPU/turn, {r['turns_per_s']} turns/s"
        )
    await asyncio.to_thread(write_results, args.out, results)


def _label(summaries: bool | str) -> str:
    if isinstance(summaries, bool):
        return "on" if summaries else "off"
    return summaries


if __name__ == "__main__":
    asyncio.run(main())
