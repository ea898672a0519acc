"""Per-turn recall latency for ``Session.context``: ``recall_for_context`` (k = 8, BM25, with
second hop and neighbours) over one user with 10,000 memories and 10,000 archived turns
(50 sessions of 200 turns), on the embedded default (SQLite store + SQLiteIndex), in
memory, and on Redis (``--redis``, with ``TIERMEM_TEST_REDIS_URL`` set, e.g. through
``scripts/test.sh``). Also the index's ``search(limit=30)`` alone. Writes
``bench/results/recall_latency.json``::

    python bench/recall_latency.py [--memories 10000] [--turns 10000] [--runs 300] [--redis]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from recall import DOMAIN, NOW, USER, make_memories, make_queries, percentile
from tiermem.clock import FakeClock
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import Recaller, memory_doc, turn_docs
from tiermem.longterm.recall_context import ContextRecallPolicy, recall_for_context
from tiermem.models import NewTurn, SessionRef, TextBlock
from tiermem.store.contract import MAX_TURNS_PER_APPEND, DurableStore
from workload import RESULTS, write_results

SESSIONS = 50


def make_turn_texts(count: int, rng: random.Random) -> list[str]:
    rare = [f"w{i}" for i in range(5000)]
    weights = [1 / (i + 1) for i in range(len(rare))]
    texts = []
    for _ in range(count):
        words = rng.choices(DOMAIN, k=rng.randint(6, 16)) + rng.choices(rare, weights, k=3)
        rng.shuffle(words)
        texts.append(" ".join(words))
    return texts


async def fill(
    durable: DurableStore, index: SearchIndex, memories: int, turns: int, rng: random.Random
) -> float:
    start = time.perf_counter()
    records = make_memories(memories, rng)
    for record in records:
        await durable.put_memory(record)
    for i in range(0, len(records), 1000):
        await index.upsert([memory_doc(r) for r in records[i : i + 1000]])
    texts = make_turn_texts(turns, rng)
    per = max(1, turns // SESSIONS)
    for s in range(SESSIONS):
        session_id = f"bench-s{s}"
        at = NOW - timedelta(days=SESSIONS - s)
        await durable.register_session(
            SessionRef(session_id=session_id, user_id=USER, created_at=at)
        )
        chunk = texts[s * per : (s + 1) * per]
        new = [
            NewTurn(
                role="user" if j % 2 == 0 else "assistant",
                content=(TextBlock(text=text),),
                timestamp=at + timedelta(minutes=j),
            )
            for j, text in enumerate(chunk)
        ]
        stored = []
        for j in range(0, len(new), MAX_TURNS_PER_APPEND):
            stored.extend(await durable.append_turns(session_id, new[j : j + MAX_TURNS_PER_APPEND]))
        await index.upsert(turn_docs(USER, session_id, stored))
    return time.perf_counter() - start


async def timed(runs: int, call: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    for i in range(20):
        await call(i)
    walls = []
    for i in range(runs):
        t0 = time.perf_counter()
        await call(i)
        walls.append((time.perf_counter() - t0) * 1000)
    return {
        "p50_ms": round(statistics.median(walls), 3),
        "p99_ms": round(percentile(walls, 0.99), 3),
    }


async def run(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    clock = FakeClock(NOW)
    closers: list[Callable[[], Awaitable[Any]]] = []
    durable: DurableStore
    index: SearchIndex
    if name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex
        from tiermem.store.backends.sqlite import SQLiteDurableStore

        path = tmp / f"{uuid.uuid4().hex}.db"
        durable = SQLiteDurableStore(path, clock=clock)
        index = SQLiteIndex(path, clock=clock)
    elif name == "memory":
        from tiermem.store.backends.memory import MemoryDurableStore

        durable = MemoryDurableStore(clock=clock)
        index = InProcessIndex(clock=clock)
    else:
        from tiermem.longterm.index_redis import RedisIndex
        from tiermem.store.backends.redis import RedisDurableStore

        prefix = f"rl{uuid.uuid4().hex[:6]}"
        url = os.environ["TIERMEM_TEST_REDIS_URL"]
        durable = RedisDurableStore.from_url(url, clock=clock, prefix=prefix)
        index = RedisIndex.from_url(url, prefix=prefix, clock=clock)
    closers += [index.aclose, durable.aclose]
    try:
        rng = random.Random(7)
        load_s = await fill(durable, index, args.memories, args.turns, rng)
        recaller = Recaller(durable, index, clock=clock)
        queries = make_queries(50, rng)
        policy = ContextRecallPolicy(k=8)
        hot = range(180, 200)

        async def recall(i: int) -> None:
            await recall_for_context(
                recaller, USER, queries[i % len(queries)], now=clock.now(),
                session_id=f"bench-s{SESSIONS - 1}", hot_indexes=hot, policy=policy,
            )  # fmt: skip

        async def search(i: int) -> None:
            await index.search(USER, queries[i % len(queries)], kinds=("memory", "turn"), limit=30)

        result = {
            "deployment": name,
            "memories": args.memories,
            "archived_turns": args.turns,
            "load_s": round(load_s, 1),
            "recall_for_context": await timed(args.runs, recall),
            "index_search": await timed(args.runs, search),
            "load_average_1m": round(os.getloadavg()[0], 1),  # 2 cores, shared machine
        }
        print(result)
        return result
    finally:
        for close in closers:
            await close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--redis", action="store_true")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    names = args.only or ["sqlite", "memory"] + (["redis"] if args.redis else [])
    with tempfile.TemporaryDirectory() as tmp:
        results = [await run(name, args, Path(tmp)) for name in names]
    path = RESULTS / "recall_latency.json"
    if path.exists():  # keep the other deployments' last results (--only runs some)
        earlier = json.loads(path.read_text()).get("results", [])
        results = [r for r in earlier if r["deployment"] not in names] + results
    write_results(
        RESULTS / "recall_latency.json",
        results,
        what="recall_for_context (k=8, BM25 only, second hop + neighbours) and index.search",
        runs=args.runs,
    )


if __name__ == "__main__":
    asyncio.run(main())
