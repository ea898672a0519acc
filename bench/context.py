"""``Session.context()`` latency on the embedded default (in-process hot tier + SQLite file,
BM25 recall without embeddings), at 10 / 1,000 / 10,000 turns in the session.

For each size: p50/p99 wall time and mean process CPU time of ``context()`` without a query
(one hot read + assembly) and with a query (plus the user context and per-turn recall over
memories, archived turns and chunks), budget 8,000 tokens. Turns are added through the
public API in batches and the background work (indexing, detection) is drained before
timing. Writes ``bench/results/context.json``::

    python bench/context.py [--sizes 10 1000 10000] [--runs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.session import TurnInput
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

MESSAGES = [*MESSAGES[:-1], "My budget for the Vagabond box set is 120 EUR.", MESSAGES[-1]]
QUERIES = ["What was my budget for the box set?", "Is Berserk in stock?", "order status"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(runs: int, call: Any) -> dict[str, float]:
    for _ in range(20):  # warm-up
        await call(0)
    walls: list[float] = []
    cpu0 = time.process_time()
    for i in range(runs):
        t0 = time.perf_counter()
        await call(i)
        walls.append((time.perf_counter() - t0) * 1000)
    cpu = (time.process_time() - cpu0) / runs * 1000
    return {
        "p50_ms": round(statistics.median(walls), 3),
        "p99_ms": round(_pct(walls, 0.99), 3),
        "cpu_ms_mean": round(cpu, 3),
    }


async def measure(turns: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=Path(tmp) / "b.db"
        )
        async with MemoryService.from_settings(settings) as memory:
            session = await memory.session("bench-s", user_id="bench-user")
            batch: list[TurnInput] = []
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                batch.append(TurnInput(role=role, content=f"{MESSAGES[i % len(MESSAGES)]} #{i}"))
                if len(batch) == 50:
                    await session.add_turns(batch)
                    batch = []
            if batch:
                await session.add_turns(batch)
            await memory.drain()
            window = await session.context(query=QUERIES[0], system="You sell manga.")

            async def no_query(i: int) -> None:
                await session.context(system="You sell manga.")

            async def with_query(i: int) -> None:
                await session.context(query=QUERIES[i % len(QUERIES)], system="You sell manga.")

            return {
                "turns": turns,
                "hot_turns": window.stats.hot_turns,
                "context_tokens_with_query": window.total_tokens,
                "recall_hits": window.stats.recall_hits,
                "no_query": await _timed(runs, no_query),
                "with_query": await _timed(runs, with_query),
            }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        result = await measure(size, args.runs)
        print(json.dumps(result))
        results.append(result)
    flat = [r["no_query"]["p50_ms"] for r in results]
    write_results(
        RESULTS / "context.json",
        results,
        deployment="embedded (in-process hot tier + SQLite, BM25 recall, no embeddings)",
        budget_tokens=8_000,
        runs=args.runs,
        no_query_p50_ratio_largest_to_smallest=round(flat[-1] / flat[0], 2) if flat else None,
    )


if __name__ == "__main__":
    asyncio.run(main())
