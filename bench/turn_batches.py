"""Background coalescing (issue #8): CPU per turn and throughput with it off and on.

With it on (the default), the background queue merges queued turn-indexing items, any
sessions', into one index write (``tiermem.session.AFTER_APPEND``: at most 64, lingering
5 ms for more when the queue runs empty). Off is ``max_items=1``: one index write per
``add_turns``, as before. Runs alternate off/on so both see the same machine load; the
best CPU and throughput of the repeats are reported, with every run's numbers kept.

Writes ``bench/results/turn_batches.json``::

    python bench/turn_batches.py [--pairings memory+memory,embedded] [--sessions 1,50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import tiermem.session as session_module
from tiermem.background import Batch
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

WARM_TURNS = 50


def settings(pairing: str, tmp: Path) -> TierMemSettings:
    if pairing == "memory+memory":
        return TierMemSettings(hot_backend="memory", durable_backend="memory")
    if pairing == "embedded":
        return TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp / "bench.db"
        )
    raise SystemExit(f"unknown pairing {pairing!r}: memory+memory or embedded")


async def turn(session: Session, i: int) -> float:
    """add_turn then history(); returns add_turn's latency in ms."""
    start = time.perf_counter()
    await session.add_turn("user" if i % 2 == 0 else "assistant", MESSAGES[i % len(MESSAGES)])
    latency = (time.perf_counter() - start) * 1000
    await session.history()
    return latency


async def measure(pairing: str, turns: int, sessions: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        service = MemoryService.from_settings(settings(pairing, Path(tmp)), auto_summarize=False)
        async with service as memory:
            warm = await memory.session(user_id="bench-warm")
            for i in range(WARM_TURNS):
                await turn(warm, i)
            await memory.drain()
            open_sessions = [await memory.session(user_id=f"u-{n}") for n in range(sessions)]
            per_session = max(1, turns // sessions)
            latencies: list[float] = []

            async def talk(session: Session) -> None:
                for i in range(per_session):
                    latencies.append(await turn(session, i))

            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(talk(s) for s in open_sessions))
            await memory.drain()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = per_session * sessions
    latencies.sort()
    return {
        "cpu_us_per_turn": round(cpu / done * 1e6, 1),
        "turns_per_s": round(done / wall, 1),
        "p50_ms": round(latencies[len(latencies) // 2], 2),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
    }


async def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    on = session_module.AFTER_APPEND
    off = Batch(on.run, max_items=1)
    results: list[dict[str, Any]] = []
    for pairing in args.pairings.split(","):
        for sessions in (int(s) for s in args.sessions.split(",")):
            runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for _ in range(args.repeats):
                for mode, batch in (("off", off), ("on", on)):
                    session_module.AFTER_APPEND = batch
                    runs[mode].append(await measure(pairing, args.turns, sessions))
            session_module.AFTER_APPEND = on
            for mode, measured in runs.items():
                best = {
                    "cpu_us_per_turn": min(r["cpu_us_per_turn"] for r in measured),
                    "turns_per_s": max(r["turns_per_s"] for r in measured),
                }
                results.append(
                    {"pairing": pairing, "sessions": sessions, "coalescing": mode, **best,
                     "runs": measured}
                )  # fmt: skip
                print(
                    f"{pairing:14s} {sessions:4d} sessions coalescing {mode:3s}: "
                    f"{best['cpu_us_per_turn']:7.1f} µs CPU/turn "
                    f"{best['turns_per_s']:8.1f} turns/s  p99 "
                    f"{[r['p99_ms'] for r in measured]} ms"
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairings", default="memory+memory,embedded")
    parser.add_argument("--sessions", default="1,50")
    parser.add_argument("--turns", type=int, default=2000, help="turns per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "turn_batches.json")
    args = parser.parse_args()
    results = asyncio.run(collect(args))
    write_results(args.out, results, load_average=os.getloadavg(), turns=args.turns)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
