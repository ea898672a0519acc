"""CPU time per turn: ``add_turn`` then ``history()``, through the public API, background
work included (indexing, detection; the service is drained before the clock stops).

Process CPU time (``time.process_time``: every thread, SQLite's included) is steadier than
wall time on a shared machine. Writes ``bench/results/turn_cpu.json``::

    python bench/turn_cpu.py [--turns 2000] [--pairing memory+memory] [--pairing embedded]

``--workload conversation`` replays generated conversations (facts, corrections, tool
calls with large outputs; hardly a text repeats) instead of the six ``bench`` messages in
turn, whose texts recur every six turns and so hit every cache keyed by text: the bench
workload is the cheap case, the conversation workload closer to a real session. The
conversation's turns are generated before the clock starts, always at least
:data:`POOL` of them, so two runs of different lengths generate the same number (their
difference under callgrind is the turns' work alone).

Pairings: ``memory+memory`` (both tiers in-process) and ``embedded`` (in-process hot tier +
SQLite file: the default). A quick probe for profiling the Python path; the full picture
(every pairing, redis-server CPU, round trips, 1/50/500 sessions) is ``bench/turns.py``.
Automatic summaries are off by default; ``--summaries`` turns them on, as ``bench/turns.py``
does by default (a default service summarises as it goes, so that is part of a turn's cost).
``--pass-every N`` measures the summary passes alone, one through every N-th turn.
``--split`` measures the pieces of a plain turn apart (memory+memory, no summaries): its
analysis, the write through both tiers, ``history()``, and the background indexing and
memory detection, each over the same turns. Every run also reports the garbage
collector's work: collections per generation and tracked objects kept per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from tiermem.runtime import run
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from workload import (
    MESSAGES,
    RESULTS,
    WORKLOADS,
    add_loop_argument,
    loop_of_argv,
    workload_turns,
    write_results,
)

POOL = 3_000
"""Conversation turns generated whatever ``--turns`` is (see the module docstring)."""
WARM_UP = 50


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


def _workload(workload: str, turns: int) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The warm-up turns and the measured turns."""
    if workload == "bench":
        warm = [("user", MESSAGES[i % len(MESSAGES)]) for i in range(WARM_UP)]
        return warm, workload_turns("bench", turns)
    pool = workload_turns(workload, WARM_UP + max(turns, POOL))
    return pool[:WARM_UP], pool[WARM_UP : WARM_UP + turns]


async def measure(
    pairing: str, turns: int, *, summaries: bool = False, workload: str = "bench"
) -> dict[str, Any]:
    warm, measured = _workload(workload, turns)
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp), summaries=summaries) as memory:
            session = await memory.session(user_id="bench-user")
            for role, content in warm:  # warm caches, compile regexes, open the file
                await session.add_turn(role, content)
            await memory.drain()
            gc.collect()
            tracked0 = len(gc.get_objects())
            collections0 = [g["collections"] for g in gc.get_stats()]
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for role, content in measured:
                await session.add_turn(role, content)
                await session.history()
                await asyncio.sleep(0)  # a request boundary: the background runs (turns.py)
            await memory.drain()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            collections = [
                g["collections"] - c for g, c in zip(gc.get_stats(), collections0, strict=True)
            ]
            gc.collect()
            tracked = len(gc.get_objects()) - tracked0
    return {
        "pairing": pairing,
        "summaries": summaries,
        "workload": workload,
        "turns": turns,
        "cpu_us_per_turn": round(cpu / turns * 1e6, 1),
        "turns_per_s": round(turns / wall, 1),
        "gc_collections": collections,
        "gc_tracked_per_turn": round(tracked / turns, 2),
    }


async def measure_split(turns: int) -> dict[str, Any]:
    """CPU µs per turn of each piece of a plain turn on memory+memory (no summaries),
    measured apart over the same turns: ``analyse_text_turn``; the write through both
    tiers (``Session._append_analysed``, background work off); ``history()``; the
    background indexing and memory detection (``_after_appends``, in batches of 64 as the
    queue merges them). What the full turn costs beyond their sum is the background
    queue, the event loop and the garbage collector."""
    from tiermem.session import _after_appends, _AfterAppend

    def per_turn(start: float) -> float:
        return round((time.process_time() - start) / turns * 1e6, 1)

    with tempfile.TemporaryDirectory() as tmp:
        async with _service("memory+memory", Path(tmp)) as memory:
            session = await memory.session(user_id="bench-split")
            texts = [MESSAGES[i % len(MESSAGES)] for i in range(turns)]
            roles = ["user" if i % 2 == 0 else "assistant" for i in range(turns)]
            for role, text in zip(roles[:50], texts[:50], strict=True):  # warm up
                memory.analyse_text_turn(role, text)
            split: dict[str, float] = {}
            start = time.process_time()
            analysed = [memory.analyse_text_turn(r, t) for r, t in zip(roles, texts, strict=True)]
            split["analyse"] = per_turn(start)
            memory.index_turns = memory.auto_detect = False  # their work is measured below
            start = time.process_time()
            for one in analysed:
                await session._append_analysed([one], None)
            split["append"] = per_turn(start)
            start = time.process_time()
            for _ in range(turns):
                await session.history()
            split["history"] = per_turn(start)
            stored = await session.get_turns(0, turns)
            for piece in ("index", "detect"):
                items = [
                    _AfterAppend(
                        session, [turn], [a], index=piece == "index", detect=piece == "detect"
                    )
                    for turn, (_, a) in zip(stored, analysed, strict=True)
                ]
                start = time.process_time()
                for at in range(0, turns, 64):
                    await _after_appends(items[at : at + 64])
                split[piece] = per_turn(start)
    return {"pairing": "memory+memory", "split_cpu_us_per_turn": split, "turns": turns}


async def measure_passes(pairing: str, turns: int, every: int) -> dict[str, Any]:
    """Summary passes alone: ``turns`` turns added with automatic summaries off, and after
    every ``every``-th turn a pass through the turn 6 before it (the 6 kept raw) run
    inline, as the background would at that cadence (a pass every 14 turns is a default
    service's: 20 unsummarized turns, 6 kept raw). CPU of the passes only, per turn.
    Passes run as turns arrive, so each reads only the few turns after its target, as in
    service (adding every turn first would make each pass read all the turns left)."""
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp)) as memory:
            session = await memory.session(user_id="bench-passes")
            cpu, passes = 0.0, 0
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                await session.add_turn(role, MESSAGES[i % len(MESSAGES)])
                if i % every == every - 1 and i >= every + 6:
                    await memory.drain()  # the turn's own background work is not the pass's
                    cpu0 = time.process_time()
                    await memory.summaries.run(session.id, through=i - 6)
                    cpu += time.process_time() - cpu0
                    passes += 1
    return {
        "pairing": pairing,
        "summaries": "passes only",
        "pass_every": every,
        "turns": turns,
        "passes": passes,
        "cpu_us_per_pass": round(cpu / max(passes, 1) * 1e6, 1),
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
    parser.add_argument(
        "--split", action="store_true", help="the pieces of a plain turn apart (measure_split)"
    )
    parser.add_argument("--workload", choices=WORKLOADS, default="bench")
    parser.add_argument("--out", type=Path, default=RESULTS / "turn_cpu.json")
    add_loop_argument(parser)  # read by __main__ before the loop starts (loop_of_argv)
    args = parser.parse_args()
    pairings = args.pairing or ["memory+memory", "embedded"]
    if args.split:
        split = await measure_split(args.turns)
        print(
            "memory+memory CPU µs/turn by piece: "
            + ", ".join(f"{k} {v}" for k, v in split["split_cpu_us_per_turn"].items())
        )
        await asyncio.to_thread(write_results, args.out, [split], loop=args.loop)
        return
    if args.pass_every:
        results = [await measure_passes(p, args.turns, args.pass_every) for p in pairings]
    else:
        results = [
            await measure(p, args.turns, summaries=args.summaries, workload=args.workload)
            for p in pairings
        ]
    for r in results:
        print(
            f"{r['pairing']:>14} summaries={_label(r['summaries'])} "
            f"workload={r.get('workload', 'bench')}: "
            f"{r['cpu_us_per_turn']:8.1f} µs CPU/turn, {r['turns_per_s']} turns/s"
            + (
                f", gc collections {r['gc_collections']}, "
                f"{r['gc_tracked_per_turn']} tracked objects kept/turn"
                if "gc_collections" in r
                else ""
            )
        )
    await asyncio.to_thread(write_results, args.out, results, loop=args.loop)


def _label(summaries: bool | str) -> str:
    if isinstance(summaries, bool):
        return "on" if summaries else "off"
    return summaries


if __name__ == "__main__":
    run(main(), event_loop=loop_of_argv())
