"""Pre-save optimization: state size before and after ``optimize_turns``, per conversation.

Conversations come from the seeded generator of ``tests/context/tool_heavy.py``:

* ``tool_heavy``   seed 002's case: a shop agent that re-reads the customer record, repeats
                   lookups, polls an order, retries timeouts and fixes invalid input;
* ``heavier``      the same agent with more repetition (a sensitivity check);
* ``distinct``     the control: every call is distinct and none fails.

Each is optimized under three policies:

* ``snapshot``      the default: every final successful result verbatim, every turn keeps its
                    slot (what a stored snapshot needs);
* ``view``          the same, but turns left empty are dropped;
* ``view_seed004``  the view, also replacing final results by a reference once the model has
                    seen them (seed 004); the archive keeps them in full.

Size is the JSON bytes of the turns as stored and their cl100k tokens as messages
(:func:`tiermem.context.optimize.state_size`); ``cpu_ms`` is the median process time of one
``optimize_turns`` call over 5 rounds. Writes ``bench/results/optimize.json``::

    python bench/optimize.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tiermem.context.optimize import (
    OptimizePolicy,
    final_successful_results,
    optimize_turns,
    pair_tool_calls,
    state_size,
)
from tiermem.models import ToolResultBlock, Turn
from tiermem.tokens import TiktokenCounter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
ROUNDS = 5


def _policies(side_effect_tools: frozenset[str]) -> dict[str, OptimizePolicy]:
    return {
        "snapshot": OptimizePolicy(side_effect_tools=side_effect_tools),
        "view": OptimizePolicy(side_effect_tools=side_effect_tools, keep_empty_turns=False),
        "view_seed004": OptimizePolicy(
            side_effect_tools=side_effect_tools,
            keep_empty_turns=False,
            reference_final_results=True,
        ),
    }


def _finals_verbatim(before: tuple[Turn, ...], after: tuple[Turn, ...]) -> bool:
    """Whether every final successful result of ``before`` is in ``after`` unchanged."""
    finals = {call.use.tool_use_id: call.result for call in final_successful_results(
        pair_tool_calls(before)).values()}  # fmt: skip
    kept = {
        block.tool_use_id: block
        for turn in after
        for block in turn.content
        if isinstance(block, ToolResultBlock)
    }
    return all(kept.get(tool_use_id) == result for tool_use_id, result in finals.items())


def _cpu_ms(turns: tuple[Turn, ...], policy: OptimizePolicy) -> float:
    times = []
    for _ in range(ROUNDS):
        started = time.process_time()
        optimize_turns(turns, policy)
        times.append((time.process_time() - started) * 1000)
    return round(statistics.median(times), 2)


def _pct(before: int, after: int) -> float:
    return round(100 * (1 - after / before), 1) if before else 0.0


def measure(
    profile_name: str, turns: tuple[Turn, ...], seed: int, side_effects: frozenset[str]
) -> dict[str, Any]:
    counter = TiktokenCounter()
    size = state_size(turns, counter)
    row: dict[str, Any] = {
        "profile": profile_name,
        "seed": seed,
        "turns": len(turns),
        "tool_calls": len(pair_tool_calls(turns)),
        "before": {"bytes": size.bytes, "tokens": size.tokens},
    }
    for name, policy in _policies(side_effects).items():
        done = optimize_turns(turns, policy)
        after = state_size(done.turns, counter)
        row[name] = {
            "bytes": after.bytes,
            "tokens": after.tokens,
            "reduction_pct": {
                "bytes": _pct(size.bytes, after.bytes),
                "tokens": _pct(size.tokens, after.tokens),
            },
            "turns": len(done.turns),
            "actions": done.report.counts(),
            "final_results_verbatim": _finals_verbatim(turns, done.turns),
            "cpu_ms": _cpu_ms(turns, policy),
        }
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for profile in dict.fromkeys(row["profile"] for row in rows):
        mine = [row for row in rows if row["profile"] == profile]
        for policy in ("snapshot", "view", "view_seed004"):
            cuts = [row[policy]["reduction_pct"]["bytes"] for row in mine]
            token_cuts = [row[policy]["reduction_pct"]["tokens"] for row in mine]
            before = sum(row["before"]["bytes"] for row in mine)
            after = sum(row[policy]["bytes"] for row in mine)
            out.append(
                {
                    "profile": profile,
                    "policy": policy,
                    "conversations": len(mine),
                    "bytes_reduction_pct": {
                        "min": min(cuts),
                        "median": round(statistics.median(cuts), 1),
                        "max": max(cuts),
                        "overall": _pct(before, after),
                    },
                    "tokens_reduction_pct_median": round(statistics.median(token_cuts), 1),
                    "conversations_at_70pct_bytes": sum(cut >= 70 for cut in cuts),
                    "final_results_verbatim": all(
                        row[policy]["final_results_verbatim"] for row in mine
                    ),
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "optimize.json")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from tests.context.tool_heavy import (
        DISTINCT_CALLS,
        SIDE_EFFECT_TOOLS,
        TOOL_HEAVY,
        Profile,
        tool_heavy_conversation,
    )

    profiles = {
        "tool_heavy": TOOL_HEAVY,
        "heavier": Profile(
            refetch_rate=0.9, repeat_rate=0.8, verify_rate=0.8, timeout_rate=0.25, polls=(5, 10)
        ),
        "distinct": DISTINCT_CALLS,
    }
    rows = [
        measure(name, tool_heavy_conversation(seed, profile), seed, SIDE_EFFECT_TOOLS)
        for name, profile in profiles.items()
        for seed in range(args.seeds)
    ]
    summary = summarize(rows)
    report = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "profiles": {name: vars_of(profile) for name, profile in profiles.items()},
        "summary": summary,
        "conversations": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"{'profile':<11} {'policy':<13} {'min':>6} {'median':>7} {'max':>6} {'overall':>8}"
          f" {'tokens':>7} {'>=70%':>6}")  # fmt: skip
    for line in summary:
        cut = line["bytes_reduction_pct"]
        print(
            f"{line['profile']:<11} {line['policy']:<13} {cut['min']:>6} {cut['median']:>7} "
            f"{cut['max']:>6} {cut['overall']:>8} {line['tokens_reduction_pct_median']:>7} "
            f"{line['conversations_at_70pct_bytes']:>3}/{line['conversations']}"
        )
    print(f"wrote {args.out}")


def vars_of(profile: Any) -> dict[str, Any]:
    return {name: getattr(profile, name) for name in profile.__slots__}


if __name__ == "__main__":
    main()
