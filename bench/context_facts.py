"""Planted-fact preservation of ``session.context()`` at 512 / 2k / 4k tokens (issue #10).

Each run generates #7's conversation (``tiermem.testing.conversations``: 300 turns, 30
planted facts, 10 corrections, distractors, tool calls with large outputs), adds it through
the public API to a service from settings (memory hot tier; SQLite durable tier in a
temporary directory, the embedded default, or memory), with the offline summary engines
and the store's title catalogue, waits for the summaries' watermark, and assembles
``session.context(budget=B, model=MODEL)`` with and without a query. What the rendered
context keeps is measured by :func:`tiermem.testing.context_facts.check_facts`
(``tiermem.summaries.quality``'s functions): preservation (share of planted facts whose
latest value the rendered request states), stale rate (share of corrected facts with a
superseded value presented as current), tokens used and tokens per item kind.

The test ``tests/context/test_planted_facts.py`` asserts the 4k row (every fact, nothing
stale) for one seed; this reports all budgets over several seeds and both domains.
Writes ``bench/results/context_facts.json``::

    .venv/bin/python bench/context_facts.py [--seeds 5] [--durable sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.testing.context_facts import check_facts
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

RESULTS = Path(__file__).parent / "results"
MODEL = "claude-3-5-sonnet"
BUDGETS = (512, 2048, 4096)
QUERIES = {
    "manga": "Remind me of my budget, my postcode and the order number.",
    "assistant": "Remind me of my budget, my address and my appointment.",
}


async def one_run(
    seed: int, domain: Literal["manga", "assistant"], durable: str, directory: Path
) -> list[dict[str, Any]]:
    conversation = generate_conversation(seed, turns=300, facts=30, corrections=10, domain=domain)
    clock = FakeClock(conversation.turns[0].timestamp)
    rules = RuleStructuredExtractor(conversation.known_titles)
    settings = TierMemSettings(
        hot_backend="memory",
        durable_backend="sqlite" if durable == "sqlite" else "memory",
        sqlite_path=directory / f"{domain}-{seed}.db",
    )
    rows: list[dict[str, Any]] = []
    async with MemoryService.from_settings(
        settings,
        clock=clock,
        summarizer=ExtractiveSummarizer(TiktokenCounter(), extractor=rules),
        extractor=rules,
    ) as service:
        session = await service.session(f"s-{domain}-{seed}", user_id="u-1")
        for turn in conversation.turns:
            clock.set(turn.timestamp)
            await session.add_turn(turn.role, list(turn.content), timestamp=turn.timestamp)
            await service.drain()
        await session.summaries(wait_through=len(conversation.turns) - 1)
        corrected = len(conversation.corrections)
        for budget in BUDGETS:
            for query in (None, QUERIES[domain]):
                started = time.perf_counter()
                window = await session.context(query=query, budget=budget, model=MODEL)
                elapsed_ms = (time.perf_counter() - started) * 1000
                check = check_facts(window, conversation.facts, rules.entities)
                rows.append(
                    {
                        "seed": seed,
                        "domain": domain,
                        "budget": budget,
                        "query": query is not None,
                        "budget_tokens": window.budget_tokens,
                        "total_tokens": window.total_tokens,
                        "tokens_by_kind": window.stats.tokens_by_tier,
                        "sections_dropped": window.stats.sections_dropped,
                        "kept_turns": window.stats.kept_turns,
                        "preservation": 1 - len(check.lost) / len(conversation.facts),
                        "stale_rate": len(check.stale) / corrected if corrected else 0.0,
                        "lost": list(check.lost),
                        "stale": list(check.stale),
                        "context_ms": round(elapsed_ms, 2),
                    }
                )
    return rows


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for budget in BUDGETS:
        for query in (False, True):
            group = [r for r in rows if r["budget"] == budget and r["query"] is query]
            key = f"{budget}{'+query' if query else ''}"
            table[key] = {
                "runs": len(group),
                "preservation_mean": round(statistics.fmean(r["preservation"] for r in group), 4),
                "preservation_min": min(r["preservation"] for r in group),
                "all_facts_kept_share": round(
                    sum(r["preservation"] == 1.0 for r in group) / len(group), 4
                ),
                "stale_rate_mean": round(statistics.fmean(r["stale_rate"] for r in group), 4),
                "total_tokens_mean": round(statistics.fmean(r["total_tokens"] for r in group)),
                "budget_tokens": group[0]["budget_tokens"],
            }
    return table


async def run(seeds: int, durable: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        for domain in ("manga", "assistant"):
            for seed in range(seeds):
                rows += await one_run(seed, domain, durable, Path(directory))  # type: ignore[arg-type]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--durable", choices=["sqlite", "memory"], default="sqlite")
    args = parser.parse_args()
    rows = asyncio.run(run(args.seeds, args.durable))
    table = aggregate(rows)
    RESULTS.mkdir(exist_ok=True)
    result = {
        "benchmark": "context_facts",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "setup": {
            "turns": 300,
            "facts": 30,
            "corrections": 10,
            "model": MODEL,
            "budgets": list(BUDGETS),
            "seeds_per_domain": args.seeds,
            "domains": ["manga", "assistant"],
            "backends": f"memory+{args.durable}",
            "summaries": "offline engines, wait_through=last turn",
        },
        "summary": table,
        "runs": rows,
    }
    (RESULTS / "context_facts.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    for key, row in table.items():
        print(
            f"{key:>12}: preservation {row['preservation_mean']:.3f} "
            f"(min {row['preservation_min']:.3f}, all kept in {row['all_facts_kept_share']:.0%}), "
            f"stale {row['stale_rate_mean']:.3f}, {row['total_tokens_mean']} of "
            f"{row['budget_tokens']} tokens"
        )


if __name__ == "__main__":
    main()
