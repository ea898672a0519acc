"""The view's optimization in ``Session.context()``: tokens of turns saved, prompt-prefix
stability, and CPU added per call, on tool-heavy conversations.

Each conversation of ``tests/context/tool_heavy.py`` (seed 002's shop agent: re-read
records, repeated lookups, polled orders, retried timeouts) is replayed turn by turn into a
session (both tiers in-process, no summaries, the default 20-turn hot window), and the
context is assembled before every assistant reply (after each user turn), under

* ``off``       ``optimize=False``: the hot turns as stored;
* ``view``      the default (``optimize=True``, ``VIEW_POLICY``): final results verbatim,
                every successful call kept, seen superseded outputs referenced;
* ``all_steps`` ``OptimizePolicy(side_effect_tools={"add_to_cart"})``: every step,
                repeated successful calls of the other tools collapsed too.

Reported per mode: the tokens of the turns in the window summed over the calls (a budget
large enough that nothing is evicted, so the difference is the optimization's), the share
of calls whose messages start with the previous call's messages (a provider caching the
message prefix could reuse it; the 20-turn hot window slides, so this is low in every
mode), and the median process time of one ``context()`` call (noisy on a shared machine:
use ``--calls`` under callgrind for instruction counts). Writes
``bench/results/context_optimize.json``::

    python bench/context_optimize.py [--seeds 5]
    # CPU per call: the same window assembled N times, one mode (run under callgrind
    # twice with two N and take the difference):
    python bench/context_optimize.py --calls 100 --mode view
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tiermem.context.optimize import OptimizePolicy
from tiermem.models import Message, Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import RESULTS, write_results

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 200_000
"""Large enough that no hot turn is evicted: the windows differ by the optimization only."""


def _modes(side_effects: frozenset[str]) -> dict[str, bool | OptimizePolicy]:
    return {
        "off": False,
        "view": True,
        "all_steps": OptimizePolicy(side_effect_tools=side_effects),
    }


def _service() -> MemoryService:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    return MemoryService.from_settings(settings, auto_summarize=False)


async def _add(session: Session, turn: Turn) -> None:
    await session.add_turn(turn.role, list(turn.content), timestamp=turn.timestamp)


def _starts_with(messages: tuple[Message, ...], prefix: tuple[Message, ...]) -> bool:
    # The last message of a window is the user's latest turn, to which the next window
    # may add tool results (merged into one message): compare all but that one.
    head = prefix[:-1]
    return messages[: len(head)] == head


async def replay(seed: int, turns: tuple[Turn, ...], modes: dict[str, Any]) -> dict[str, Any]:
    """One conversation: every mode's windows, assembled after each user turn."""
    out: dict[str, Any] = {"seed": seed, "turns": len(turns)}
    per_mode: dict[str, dict[str, Any]] = {
        name: {"turn_tokens": 0, "prefix_kept": 0, "cpu_ms": []} for name in modes
    }
    previous: dict[str, tuple[Message, ...]] = {}
    calls = 0
    async with _service() as memory:
        session = await memory.session(f"s-{seed}", user_id="bench-user")
        for turn in turns:
            await _add(session, turn)
            if turn.role != "user":
                continue
            calls += 1
            for name, optimize in modes.items():
                started = time.process_time()
                window = await session.context(budget=BUDGET, optimize=optimize)
                row = per_mode[name]
                row["cpu_ms"].append((time.process_time() - started) * 1000)
                row["turn_tokens"] += window.stats.tokens_by_tier.get("turn", 0)
                if name in previous and _starts_with(window.messages, previous[name]):
                    row["prefix_kept"] += 1
                previous[name] = window.messages
                done = window.stats.optimization
                row["last_window_actions"] = {} if done is None else done.actions
    out["calls"] = calls
    for name, row in per_mode.items():
        row["cpu_ms"] = round(statistics.median(row["cpu_ms"]), 3)
        out[name] = row
    return out


def summarize(rows: list[dict[str, Any]], modes: dict[str, Any]) -> dict[str, Any]:
    off = sum(row["off"]["turn_tokens"] for row in rows)
    calls = sum(row["calls"] for row in rows)
    summary: dict[str, Any] = {"conversations": len(rows), "calls": calls}
    for name in modes:
        tokens = sum(row[name]["turn_tokens"] for row in rows)
        cuts = [100 * (1 - row[name]["turn_tokens"] / row["off"]["turn_tokens"]) for row in rows]
        summary[name] = {
            "turn_tokens": tokens,
            "turn_tokens_per_call": round(tokens / calls, 1),
            "reduction_pct_overall": round(100 * (1 - tokens / off), 1),
            "reduction_pct_min_median_max": [
                round(min(cuts), 1),
                round(statistics.median(cuts), 1),
                round(max(cuts), 1),
            ],
            "prefix_kept_share": round(
                sum(row[name]["prefix_kept"] for row in rows) / max(1, calls - len(rows)), 3
            ),
            "cpu_ms_median": round(statistics.median(row[name]["cpu_ms"] for row in rows), 3),
        }
    return summary


async def repeat_calls(turns: tuple[Turn, ...], optimize: Any, calls: int) -> None:
    """The whole conversation stored, then ``calls`` identical ``context()`` calls."""
    async with _service() as memory:
        session = await memory.session("s-cpu", user_id="bench-user")
        for turn in turns:
            await _add(session, turn)
        await memory.drain()
        for _ in range(calls):
            await session.context(budget=BUDGET, optimize=optimize)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=0, help="CPU mode: this many calls")
    parser.add_argument("--mode", default="view", help="CPU mode: off, view or all_steps")
    parser.add_argument("--out", type=Path, default=RESULTS / "context_optimize.json")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from tests.context.tool_heavy import SIDE_EFFECT_TOOLS, TOOL_HEAVY, tool_heavy_conversation

    modes = _modes(SIDE_EFFECT_TOOLS)
    if args.calls:
        asyncio.run(repeat_calls(tool_heavy_conversation(0), modes[args.mode], args.calls))
        return
    rows = [
        asyncio.run(replay(seed, tool_heavy_conversation(seed, TOOL_HEAVY), modes))
        for seed in range(args.seeds)
    ]
    summary = summarize(rows, modes)
    write_results(args.out, rows, budget=BUDGET, hot_window=20, summary=summary)
    for name in modes:
        line = summary[name]
        print(
            f"{name:<10} turn tokens/call {line['turn_tokens_per_call']:>8} "
            f"({line['reduction_pct_overall']:>5} % less; per conversation min/median/max "
            f"{line['reduction_pct_min_median_max']}), prefix kept "
            f"{line['prefix_kept_share']:.1%}, cpu {line['cpu_ms_median']} ms/call"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
