"""CPU cost of automatic summaries per turn, by session length (issues #8 and #9).

For each session length (100, 300 and 1,000 turns by default) it adds a generated
conversation (``tiermem.testing.conversations``: planted facts, corrections, tool calls
with large outputs) one turn at a time through the public API, memory+memory backends,
the offline engines, background work drained at the end, once with automatic summaries
off and once on:

Turns are paced like a conversation's (the background drained after each turn), so every
pass that falls due runs: added back to back, passes would coalesce and hide their cost.

* **amortised CPU per turn** (``time.process_time``, every thread) on and off, and the
  difference: what summaries cost per turn;
* **marginal CPU per turn** over the last fifth of the session: whether the cost grows
  with the session's length;
* **one pass at that length**: a pass through 20 new turns of the summarized session,
  timed alone (CPU µs), with the top functions of its cProfile (``--profile``).

Writes ``bench/results/summaries_cost.json``::

    .venv/bin/python bench/summaries_cost.py [--lengths 100,300,1000] [--repeat 3] [--profile]
        [--before earlier_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing.conversations import generate_conversation
from workload import RESULTS, write_results

WARM_TURNS = 60
PASS_TURNS = 20


def conversation_of(seed: int, turns: int) -> list[Any]:
    """A generated conversation of ``turns`` turns, its planted facts scaled to its length."""
    facts = max(2, min(30, turns // 12))
    return list(generate_conversation(seed, turns=turns, facts=facts, corrections=facts // 3).turns)


def service(summaries: bool) -> MemoryService:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    return MemoryService.from_settings(settings, auto_summarize=summaries)


async def run_session(length: int, summaries: bool, seed: int, profile: bool) -> dict[str, Any]:
    turns = conversation_of(seed, length + 2 * PASS_TURNS)
    async with service(summaries) as memory:
        warm = await memory.session(user_id="bench-warm")
        for turn in conversation_of(seed + 1000, WARM_TURNS):
            await warm.add_turn(turn.role, list(turn.content))
        await memory.drain()
        session = await memory.session(user_id="bench-cost")
        tail_from = length - length // 5
        cpu0 = time.process_time()
        tail0 = cpu0
        for i, turn in enumerate(turns[:length]):
            if i == tail_from:
                await memory.drain()
                tail0 = time.process_time()
            await session.add_turn(turn.role, list(turn.content))
            await memory.drain()  # turns paced like a conversation: every due pass runs
        cpu = time.process_time() - cpu0
        tail = time.process_time() - tail0
        stats = memory.summaries.stats
        result: dict[str, Any] = {
            "amortised_cpu_us_per_turn": round(cpu / length * 1e6, 1),
            "marginal_cpu_us_per_turn_last_fifth": round(tail / (length - tail_from) * 1e6, 1),
            "passes": stats.committed,
            "jobs": stats.jobs,
            "validation_retries": stats.validation_retries,
            "verbatim_appends": stats.verbatim_appends,
            "compression_in_force": (
                None if stats.last_compression is None else stats.last_compression.model_dump()
            ),
        }
        if not summaries:
            return result
        # One pass at this length, timed alone: 20 more turns, then the pass inline; then,
        # with --profile, one more under cProfile (profiling inflates what it measures).
        memory.auto_summarize = False
        for turn in turns[length : length + PASS_TURNS]:
            await session.add_turn(turn.role, list(turn.content))
        await memory.drain()
        start = time.process_time()
        outcome = await memory.summaries.run(session.id)
        result["pass_cpu_us"] = round((time.process_time() - start) * 1e6, 1)
        result["pass_outcome"] = outcome.value
        if profile:
            for turn in turns[length + PASS_TURNS :]:
                await session.add_turn(turn.role, list(turn.content))
            await memory.drain()
            profiler = cProfile.Profile()
            profiler.enable()
            await memory.summaries.run(session.id)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
            result["pass_profile_top"] = [
                line.rstrip() for line in out.getvalue().splitlines() if line.strip()
            ][:40]
        return result


MEASURES = ("amortised_cpu_us_per_turn", "marginal_cpu_us_per_turn_last_fifth", "pass_cpu_us")


def least(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run, with each CPU measure the least of all runs' (and all runs' values)."""
    out = dict(runs[0])
    for measure in MEASURES:
        values = [r[measure] for r in runs if measure in r]
        if values:
            out[measure] = min(values)
            out[f"{measure}_runs"] = values
    return out


async def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for length in (int(n) for n in args.lengths.split(",")):
        # The machine is shared: each side is run --repeat times (alternating) and the
        # least CPU kept, per measure (noise only ever adds CPU).
        offs, ons = [], []
        for attempt in range(args.repeat):
            offs.append(await run_session(length, False, args.seed, False))
            ons.append(await run_session(length, True, args.seed, args.profile and not attempt))
        off, on = least(offs), least(ons)
        cost = on["amortised_cpu_us_per_turn"] - off["amortised_cpu_us_per_turn"]
        marginal = (
            on["marginal_cpu_us_per_turn_last_fifth"] - off["marginal_cpu_us_per_turn_last_fifth"]
        )
        run = {
            "turns": length,
            "off": off,
            "on": on,
            "summaries_cpu_us_per_turn_amortised": round(cost, 1),
            "summaries_cpu_us_per_turn_marginal_last_fifth": round(marginal, 1),
            "summaries_cpu_us_per_pass_amortised": (
                round(cost * length / on["passes"], 1) if on["passes"] else None
            ),
        }
        print(
            f"{length:>5} turns: off {off['amortised_cpu_us_per_turn']} µs/turn, "
            f"on {on['amortised_cpu_us_per_turn']} µs/turn → summaries {cost:.1f} µs/turn "
            f"(last fifth {marginal:.1f}); {on['passes']} passes; "
            f"one pass at this length {on['pass_cpu_us']} µs"
        )
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,300,1000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; least CPU kept")
    parser.add_argument("--profile", action="store_true", help="cProfile one pass per length")
    parser.add_argument("--label", default="", help="a label stored with the results")
    parser.add_argument(
        "--before", type=Path, help="a results file of an earlier run, stored as 'before'"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "summaries_cost.json")
    args = parser.parse_args()
    runs = asyncio.run(collect(args))
    write_results(
        args.out,
        runs,
        label=args.label,
        before=json.loads(args.before.read_text()) if args.before else None,
        engine="offline (ExtractiveSummarizer + RuleStructuredExtractor)",
        pairing="memory+memory",
        cpus=os.cpu_count(),
        load_average_1_5_15=[round(v, 2) for v in os.getloadavg()],
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
