"""Recall benchmark: ``Recaller.recall`` latency per deployment, and recall quality.

Latency (p50/p99 of ``recall(user, query, k=5)``, BM25 without embeddings, and of the
index's ``search`` alone) with 1,000 and 10,000 memories for one user, on:

* ``memory+in_process``   in-memory store, in-process index
* ``sqlite+sqlite``       SQLite store and SQLiteIndex in one file (the embedded default)
* ``redis+redis``         Redis store, RedisIndex on the same client and prefix
* ``dynamodb+redis``      DynamoDB Local store, RedisIndex (production)
* ``dynamodb+warming``    DynamoDB Local store, WarmingIndex (no Redis; the first query
                          loads the partition once, its time is reported apart)

With ``--quality``, recall@5 on the fixture of ``tests/recall/data`` with BM25 alone and
with the local all-MiniLM-L6-v2 embedder (if installed): index vector search, and the
rerank mode of indexes without vectors. Results go to ``bench/results/recall.json`` and
``bench/results/recall.png``. Run with the servers up::

    TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh \\
        python bench/recall.py --quality

Memories are written with ``put_memory``, 48 in flight (the contract has no batch put; a 10k
user takes about 25 s on DynamoDB Local, loaded once per size and shared by both DynamoDB
configurations), and indexed 1,000 documents per ``upsert``. DynamoDB runs time 100 recalls
instead of 200 to keep the whole run under 5 minutes. DynamoDB Local is a Java emulator
sharing 2 cores with everything else: compare shapes, not milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tiermem.clock import FakeClock
from tiermem.longterm.index import SearchHit, SearchIndex
from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
from tiermem.longterm.recall import Recaller, memory_doc, memory_loader
from tiermem.models import MemoryRecord
from tiermem.store.contract import DurableStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NOW = datetime(2030, 1, 1, tzinfo=UTC)
USER = "bench-user"
TYPES = ["preference", "fact", "interaction_summary", "feedback", "behavioral_pattern"]
_DOMAIN_WORDS = (
    "manga volume series order shipping delivery seinen shonen shojo josei horror romance "
    "mystery cooking sports historical berserk vagabond frieren kingdom slam dunk one piece "
    "deluxe hardcover kindle ebook preorder restock refund damaged cover packaging gift "
    "nephew sister osaka kyoto points coupon bundle discount artbook signed edition print "
    "recommendation spoiler anime adaptation convenience store payment paypay line email "
    "漫画 配送 予約 返品 ポイント 全巻 新刊 ホラー 恋愛 歴史 ベルセルク ワンピース"
)
DOMAIN = _DOMAIN_WORDS.split()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_memories(count: int, rng: random.Random) -> list[MemoryRecord]:
    """Synthetic memories: domain words plus a Zipf-like tail of rare words."""
    rare = [f"w{i}" for i in range(5000)]
    weights = [1 / (i + 1) for i in range(len(rare))]
    memories = []
    for i in range(count):
        words = rng.choices(DOMAIN, k=rng.randint(4, 10))
        words += rng.choices(rare, weights=weights, k=rng.randint(2, 8))
        rng.shuffle(words)
        memories.append(
            MemoryRecord(
                memory_id=f"m{i:06d}",
                user_id=USER,
                memory_type=rng.choice(TYPES),
                content=" ".join(words),
                importance=round(rng.random(), 2),
                created_at=NOW - timedelta(days=rng.uniform(0, 365)),
            )
        )
    return memories


def make_queries(count: int, rng: random.Random) -> list[str]:
    rare = [f"w{i}" for i in range(200)]
    return [
        " ".join(rng.choices(DOMAIN, k=rng.randint(1, 3)) + rng.choices(rare, k=1))
        for _ in range(count)
    ]


async def bounded(jobs: list[Callable[[], Awaitable[Any]]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def run(job: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


async def load(durable: DurableStore, memories: list[MemoryRecord], concurrency: int) -> float:
    start = time.perf_counter()

    def put(record: MemoryRecord) -> Callable[[], Awaitable[Any]]:
        return lambda: durable.put_memory(record)

    await bounded([put(m) for m in memories], concurrency)
    return time.perf_counter() - start


async def index_all(index: SearchIndex, memories: list[MemoryRecord]) -> float:
    start = time.perf_counter()
    for i in range(0, len(memories), 1000):
        await index.upsert([memory_doc(m) for m in memories[i : i + 1000]])
    return time.perf_counter() - start


async def measure(recaller: Recaller, index: SearchIndex, queries: list[str]) -> dict[str, Any]:
    for query in queries[:10]:  # warm caches, scripts, connections
        await recaller.recall(USER, query, k=5)
    recall_ms, search_ms, hits = [], [], []
    for query in queries:
        start = time.perf_counter()
        found = await recaller.recall(USER, query, k=5)
        recall_ms.append((time.perf_counter() - start) * 1000)
        hits.append(len(found))
        start = time.perf_counter()
        await index.search(USER, query, kinds=("memory",), limit=50)
        search_ms.append((time.perf_counter() - start) * 1000)
    return {
        "queries": len(queries),
        "recall_p50_ms": round(percentile(recall_ms, 0.5), 3),
        "recall_p99_ms": round(percentile(recall_ms, 0.99), 3),
        "recall_mean_ms": round(statistics.fmean(recall_ms), 3),
        "search_p50_ms": round(percentile(search_ms, 0.5), 3),
        "search_p99_ms": round(percentile(search_ms, 0.99), 3),
        "mean_hits": round(statistics.fmean(hits), 2),
    }


class Deployment:
    """A durable store and an index for one configuration; ``close`` releases both."""

    def __init__(
        self, durable: DurableStore, index: SearchIndex, closers: list[Callable[[], Awaitable[Any]]]
    ) -> None:
        self.durable, self.index, self._closers = durable, index, closers

    async def close(self) -> None:
        for close in self._closers:
            await close()


async def open_deployment(
    name: str, tmp: Path, clock: FakeClock, shared: dict[str, Any]
) -> Deployment:
    durable_name, index_name = name.split("+")
    closers: list[Callable[[], Awaitable[Any]]] = []
    durable: DurableStore
    if durable_name == "memory":
        from tiermem.store.backends.memory import MemoryDurableStore

        durable = MemoryDurableStore(clock=clock)
    elif durable_name == "sqlite":
        from tiermem.store.backends.sqlite import SQLiteDurableStore

        durable = SQLiteDurableStore(tmp / f"{uuid.uuid4().hex}.db", clock=clock)
        closers.append(durable.aclose)
    elif durable_name == "redis":
        from tiermem.store.backends.redis import RedisDurableStore

        durable = RedisDurableStore.from_url(
            os.environ["TIERMEM_TEST_REDIS_URL"], clock=clock, prefix=shared["prefix"]
        )
        closers.append(durable.aclose)
    else:
        durable = shared["dynamodb"]
    index: SearchIndex
    if index_name == "in_process":
        index = InProcessIndex()
    elif index_name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex

        index = SQLiteIndex(durable._db.path)  # type: ignore[attr-defined]
    elif index_name == "redis":
        from tiermem.longterm.index_redis import RedisIndex

        index = RedisIndex.from_url(os.environ["TIERMEM_TEST_REDIS_URL"], prefix=shared["prefix"])
    else:
        index = WarmingIndex([memory_loader(durable)])
    closers.insert(0, index.aclose)
    return Deployment(durable, index, closers)


async def redis_used_memory(index: SearchIndex) -> int | None:
    """Redis's used_memory, when ``index`` is a RedisIndex (to size the index)."""
    from tiermem.longterm.index_redis import RedisIndex

    if not isinstance(index, RedisIndex):
        return None
    info = await index._io.client.info("memory")
    return int(info["used_memory"])


async def run_size(
    size: int,
    configs: list[str],
    queries: list[str],
    tmp: Path,
    rng: random.Random,
    slow_queries: int,
) -> list[dict[str, Any]]:
    memories = make_memories(size, rng)
    clock = FakeClock(NOW)
    runs = []
    shared: dict[str, Any] = {}
    dynamo_load_s: float | None = None
    if any(c.startswith("dynamodb") for c in configs):
        from tiermem.store.backends.dynamodb import DynamoDBDurableStore, create_table

        endpoint = os.environ["TIERMEM_TEST_DYNAMODB_URL"]
        table = f"tiermem-bench-{uuid.uuid4().hex[:6]}"
        await create_table(table, endpoint_url=endpoint, region_name="us-east-1")
        shared["dynamodb"] = DynamoDBDurableStore(
            table, clock=clock, endpoint_url=endpoint, region_name="us-east-1"
        )
        dynamo_load_s = await load(shared["dynamodb"], memories, 48)
        print(f"  loaded {size} memories into DynamoDB Local in {dynamo_load_s:.1f} s", flush=True)
    try:
        for config in configs:
            shared["prefix"] = f"bench{uuid.uuid4().hex[:6]}"
            deployment = await open_deployment(config, tmp, clock, shared)
            try:
                if config.startswith("dynamodb"):
                    load_s = dynamo_load_s or 0.0
                else:
                    load_s = await load(deployment.durable, memories, 48)
                index_s = 0.0
                warm_s = None
                index_mb = None
                if isinstance(deployment.index, WarmingIndex):
                    start = time.perf_counter()
                    await deployment.index.warm(USER)
                    warm_s = round(time.perf_counter() - start, 3)
                else:
                    before = await redis_used_memory(deployment.index)
                    index_s = await index_all(deployment.index, memories)
                    after = await redis_used_memory(deployment.index)
                    if before is not None and after is not None:
                        index_mb = round((after - before) / 2**20, 1)
                recaller = Recaller(deployment.durable, deployment.index, clock=clock)
                timed = queries if not config.startswith("dynamodb") else queries[:slow_queries]
                stats = await measure(recaller, deployment.index, timed)
                run = {
                    "config": config,
                    "memories": size,
                    "load_s": round(load_s, 2),
                    "index_s": round(index_s, 2),
                    "warm_up_s": warm_s,
                    "redis_index_mb": index_mb,
                    **stats,
                }
                runs.append(run)
                print(
                    f"  {config:18s} {size:6d}  recall p50 {stats['recall_p50_ms']:7.2f} ms"
                    f"  p99 {stats['recall_p99_ms']:7.2f} ms  (index search p50 "
                    f"{stats['search_p50_ms']:6.2f} ms)",
                    flush=True,
                )
            finally:
                await deployment.close()
    finally:
        if "dynamodb" in shared:
            await shared["dynamodb"].aclose()
    return runs


class _NoVectors(InProcessIndex):
    """An in-process index that declares no vectors: recall reranks, as with RedisIndex."""

    supports_vectors = False

    async def vector_search(self, *args: Any, **kwargs: Any) -> list[SearchHit]:
        raise NotImplementedError


async def quality() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.recall.quality import build_recaller, load_fixture, recall_at_k

    fixture = load_fixture()
    out: dict[str, Any] = {
        "fixture": "tests/recall/data/manga_recall.json",
        "memories": len(fixture.memories),
        "queries": len(fixture.queries),
    }
    report = await recall_at_k(await build_recaller(fixture), fixture)
    out["bm25"] = {
        "recall_at_5": round(report.overall, 3),
        "by_category": {k: round(v, 3) for k, v in report.by_category.items()},
    }
    try:
        from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

        embedder = LocalMiniLMEmbedder()
    except Exception as exc:  # noqa: BLE001 -- reported in the results, not a failure
        out["embeddings"] = f"not measured: {exc}"
        return out
    for mode, index in (("hybrid_vector_search", None), ("hybrid_rerank", _NoVectors())):
        report = await recall_at_k(
            await build_recaller(fixture, embedder=embedder, index=index), fixture
        )
        out[mode] = {
            "model": embedder.model_id,
            "recall_at_5": round(report.overall, 3),
            "by_category": {k: round(v, 3) for k, v in report.by_category.items()},
            "misses": report.misses,
        }
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    sizes = sorted({r["memories"] for r in runs})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        chosen = [r for r in runs if r["memories"] == size]
        x = range(len(chosen))
        ax.bar([i - 0.2 for i in x], [r["recall_p50_ms"] for r in chosen], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [r["recall_p99_ms"] for r in chosen], 0.4, label="p99")
        ax.set_xticks(list(x), [r["config"] for r in chosen], fontsize=8, rotation=15)
        ax.set_ylabel("recall latency (ms), k=5, BM25")
        ax.set_title(f"{size} memories per user")
        ax.legend()
    fig.suptitle("tiermem Recaller.recall")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def collect(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(20300101)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": [],
    }
    configs = args.configs.split(",")
    queries = make_queries(args.queries, rng)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            print(f"== {size} memories", flush=True)
            results["runs"] += await run_size(
                size, configs, queries, Path(tmp), rng, args.dynamodb_queries
            )
    if args.quality:
        print("== quality (recall@5 on the fixture)", flush=True)
        results["quality"] = await quality()
        q = results["quality"]
        print(f"  bm25 {q['bm25']['recall_at_5']}", flush=True)
        for mode in ("hybrid_vector_search", "hybrid_rerank"):
            if mode in q:
                print(f"  {mode} {q[mode]['recall_at_5']} {q[mode]['by_category']}")
            elif isinstance(q.get("embeddings"), str):
                print(f"  {q['embeddings']}")
                break
    results["total_s"] = round(time.perf_counter() - started, 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--queries", type=int, default=200, help="timed recalls per run")
    parser.add_argument(
        "--dynamodb-queries",
        type=int,
        default=100,
        help="timed recalls per DynamoDB run (each reads ~50 items)",
    )
    parser.add_argument(
        "--configs",
        default="memory+in_process,sqlite+sqlite,redis+redis,dynamodb+redis,dynamodb+warming",
    )
    parser.add_argument("--quality", action="store_true", help="also measure recall@5")
    parser.add_argument("--out", default=str(RESULTS / "recall.json"))
    args = parser.parse_args()
    results = asyncio.run(collect(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} in {results['total_s']} s")


if __name__ == "__main__":
    main()
