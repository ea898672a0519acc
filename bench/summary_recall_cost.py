"""What searching earlier sessions' summary lines costs per-turn recall, on the embedded
default (SQLite store + SQLiteIndex): one user with 10,000 memories and 10,000 archived
turns in 50 sessions (``recall_latency.fill``), each session summarized through its last
turn by the offline engines with its lines indexed (``tiermem.summaries.recall_docs``).

Then ``recall_for_context`` (k = 8) for the same queries with ``summaries`` on and off,
alternating query by query (so load on the shared machine hits both alike): p50/p99 wall
time and mean process CPU per call. Also the pass's index write per session. Writes
``bench/results/summary_recall_cost.json``::

    python bench/summary_recall_cost.py [--memories 10000] [--turns 10000] [--runs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from recall import NOW, USER, make_queries, percentile
from recall_latency import SESSIONS, fill
from tiermem.background import BackgroundWork
from tiermem.clock import FakeClock
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.longterm.recall import Recaller, ResolvedDoc
from tiermem.longterm.recall_context import ContextRecallPolicy, recall_for_context
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.summaries.jobs import SummaryJobs
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.recall_docs import SummaryRecall
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.tokens import TiktokenCounter
from workload import RESULTS, write_results


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        clock = FakeClock(NOW)
        durable = SQLiteDurableStore(path, clock=clock)
        index = SQLiteIndex(path, clock=clock)
        await fill(durable, index, args.memories, args.turns, rng)
        recaller = Recaller(durable, index, clock=clock)
        tokens = TiktokenCounter()
        jobs = SummaryJobs(
            durable,
            summarizer=ExtractiveSummarizer(tokens),
            extractor=RuleStructuredExtractor(),
            background=BackgroundWork(),
            clock=clock,
            tokens=tokens,
        )
        jobs.recall = SummaryRecall(index, jobs.current_for_recall)
        resolved: list[int] = []

        async def resolve(user_id: str, doc_ids: Collection[str]) -> dict[str, ResolvedDoc]:
            assert jobs.recall is not None
            resolved.append(len(doc_ids))
            return await jobs.recall.resolve(user_id, doc_ids)

        recaller.register_summary_resolver(resolve)
        write_wall = write_cpu = 0.0
        for s in range(SESSIONS):
            session_id = f"bench-s{s}"
            last = await durable.next_index(session_id) - 1
            await jobs.run(session_id, through=last)
        lines = jobs.recall.counters.indexed
        # The index writes alone, once more per session (a commit re-indexes its lines).
        for s in range(SESSIONS):
            session_id = f"bench-s{s}"
            current = await jobs.current_for_recall(session_id, True)
            after = jobs.recall.lines(current.tiers, current.structured)
            w0, c0 = time.perf_counter(), time.process_time()
            await jobs.recall.committed(
                USER, session_id, before=after, after=after, turns={}, at=NOW, expires_at=None
            )
            write_wall += time.perf_counter() - w0
            write_cpu += time.process_time() - c0

        queries = make_queries(args.runs, rng)
        base = ContextRecallPolicy(k=8)
        timings: dict[str, tuple[list[float], list[float]]] = {"on": ([], []), "off": ([], [])}
        summary_hits = 0
        for query in queries[:20]:  # warm up both paths
            for summaries in (True, False):
                await recall_for_context(
                    recaller, USER, query, now=NOW, policy=replace(base, summaries=summaries)
                )
        resolved.clear()
        for query in queries:
            for name in ("on", "off"):
                policy = replace(base, summaries=name == "on")
                w0, c0 = time.perf_counter(), time.process_time()
                hits = await recall_for_context(recaller, USER, query, now=NOW, policy=policy)
                timings[name][0].append((time.perf_counter() - w0) * 1000)
                timings[name][1].append((time.process_time() - c0) * 1000)
                if name == "on":  # lines whose turn is a hit too defer to it
                    summary_hits += sum(1 for h in hits if h.kind == "chunk")
        results = []
        for name, (walls, cpus) in timings.items():
            row = {
                "summaries": name,
                "p50_ms": round(percentile(walls, 0.5), 2),
                "p99_ms": round(percentile(walls, 0.99), 2),
                "cpu_ms_mean": round(sum(cpus) / len(cpus), 2),
            }
            results.append(row)
            print(row)
        per_session = {
            "summary_candidates_resolved_per_recall": round(sum(resolved) / len(queries), 2),
            "summary_lines_indexed": lines,
            "index_write_ms_per_session": round(write_wall / SESSIONS * 1000, 2),
            "index_write_cpu_ms_per_session": round(write_cpu / SESSIONS * 1000, 2),
            "summary_hits_per_recall": round(summary_hits / len(queries), 2),
        }
        print(per_session)
        await index.aclose()
        await durable.aclose()
    write_results(
        RESULTS / "summary_recall_cost.json",
        results,
        deployment="sqlite store + SQLiteIndex",
        memories=args.memories,
        turns=args.turns,
        sessions=SESSIONS,
        runs=args.runs,
        **per_session,
    )


if __name__ == "__main__":
    asyncio.run(main())
