"""Read-path latency of ``Session.context``, per deployment: the embedded default (SQLite
store + SQLiteIndex), in memory, and Redis (``--redis``, with ``TIERMEM_TEST_REDIS_URL`` set,
e.g. through ``scripts/test.sh``).

1. Per-turn recall: ``recall_for_context`` (k = 8, BM25, neighbours) over one user with
   10,000 memories and 10,000 archived turns (50 sessions of 200 turns), and the index's
   ``search(limit=30)`` alone.
2. ``Session.context()`` without a query, hot tier warm, at 10, 1,000 and 10,000 turns in
   the session (``--context-sizes``): the whole call, and ``assemble_context`` alone.

3. The index's writes while filling (per document: wall, client CPU, and on Redis server
   CPU), and removing 100 archived turns one call each (the worst case of expiry).

4. ``--embeddings`` (sqlite, memory): the same recall, hybrid, with every memory and turn
   embedded by the local all-MiniLM-L6-v2 at fill time (as the indexing path does): the
   query's own embedding alone, recall with all embeddings answered from a cache (the
   recall's own cost), the whole call, and the recall right after a new turn of the
   session was indexed (each time: a live conversation). Stored under
   ``recall_for_context_embeddings`` in the deployment's entry; nothing else is run or
   changed.

Each timing: p50/p99 wall time, mean process CPU time per call (steadier than wall time on
the shared 2-core machine), and on Redis the server's CPU time per call (``INFO cpu``).
Writes ``bench/results/recall_latency.json``::

    python bench/recall_latency.py [--memories 10000] [--turns 10000] [--runs 300] [--redis]
        [--only sqlite memory redis] [--context-sizes 10 1000 10000] [--embeddings]
        [--embedding-cache FILE.npz]

``--embedding-cache`` keeps the fill's document vectors in a file (made on the first run,
read on the next), so repeated ``--embeddings`` runs (before/after pairs) skip embedding
20,000 texts (~2 CPU-minutes); the query's embedding is still timed with the real model.
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
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from recall import DOMAIN, NOW, USER, make_memories, make_queries, percentile
from tiermem.clock import FakeClock
from tiermem.llm.embeddings import Embedder
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


class WriteMeter:
    """Wall, client CPU and (on Redis) server CPU of the index's writes during the fill."""

    def __init__(self, redis_url: str | None) -> None:
        self.redis_url = redis_url
        self.docs = 0
        self.wall = self.cpu = self.server = 0.0

    async def upsert(self, index: SearchIndex, docs: list[Any]) -> None:
        server0 = await redis_cpu_s(self.redis_url) if self.redis_url else 0.0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        await index.upsert(docs)
        self.wall += time.perf_counter() - wall0
        self.cpu += time.process_time() - cpu0
        if self.redis_url:
            self.server += await redis_cpu_s(self.redis_url) - server0
        self.docs += len(docs)

    def per_doc(self) -> dict[str, float]:
        out = {
            "docs": self.docs,
            "wall_us_per_doc": round(self.wall / self.docs * 1e6, 1),
            "cpu_us_per_doc": round(self.cpu / self.docs * 1e6, 1),
        }
        if self.redis_url:
            out["redis_server_cpu_us_per_doc"] = round(self.server / self.docs * 1e6, 1)
        return out


async def fill(
    durable: DurableStore,
    index: SearchIndex,
    memories: int,
    turns: int,
    rng: random.Random,
    meter: WriteMeter | None = None,
    embedder: Embedder | None = None,
) -> float:
    """Fill the store and the index; with ``embedder``, documents carry vectors stored as
    the library stores them: a memory record's ``embedding``/``embedding_model`` (here
    computed in batches of 1,000 rather than one per write), and turn documents through
    ``Recaller.embed_documents`` (what the indexing path calls, one batch per append)."""
    meter = meter or WriteMeter(None)
    start = time.perf_counter()
    records = make_memories(memories, rng)
    recaller = (
        Recaller(durable, index, clock=FakeClock(NOW), embedder=embedder) if embedder else None
    )
    if embedder is not None:
        for i in range(0, len(records), 1000):
            batch = records[i : i + 1000]
            vectors = await embedder.embed([r.content for r in batch])
            records[i : i + 1000] = [
                r.model_copy(update={"embedding": tuple(v), "embedding_model": embedder.model_id})
                for r, v in zip(batch, vectors, strict=True)
            ]
    for record in records:
        await durable.put_memory(record)
    for i in range(0, len(records), 1000):
        await meter.upsert(index, [memory_doc(r) for r in records[i : i + 1000]])
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
        docs = turn_docs(USER, session_id, stored)
        if recaller is not None:
            docs = await recaller.embed_documents(docs)
        await meter.upsert(index, docs)
    return time.perf_counter() - start


def open_local(name: str, clock: FakeClock, tmp: Path) -> tuple[DurableStore, SearchIndex] | None:
    """The durable store and index of the in-process deployments (None for the others)."""
    if name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex
        from tiermem.store.backends.sqlite import SQLiteDurableStore

        path = tmp / f"{uuid.uuid4().hex}.db"
        return SQLiteDurableStore(path, clock=clock), SQLiteIndex(path, clock=clock)
    if name == "memory":
        from tiermem.store.backends.memory import MemoryDurableStore

        return MemoryDurableStore(clock=clock), InProcessIndex(clock=clock)
    return None


async def removal_cost(
    index: SearchIndex, durable: DurableStore, redis_url: str | None, count: int = 100
) -> dict[str, float]:
    """Removing archived turns one call each (the worst case: expiry collects what is due,
    often one turn per write), then writing them back: per call, wall, client and server
    CPU. Each removal rewrites the packed lists of the turn's terms on Redis."""
    session_id = "bench-s0"
    turns = (await durable.get_turns(session_id, 0, count))[:count]
    docs = turn_docs(USER, session_id, turns)
    server0 = await redis_cpu_s(redis_url) if redis_url else 0.0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for d in docs:
        await index.remove(USER, [d.doc_id])
    out = {
        "removed": len(docs),
        "wall_us_per_removal": round((time.perf_counter() - wall0) / len(docs) * 1e6, 1),
        "cpu_us_per_removal": round((time.process_time() - cpu0) / len(docs) * 1e6, 1),
    }
    if redis_url:
        server = await redis_cpu_s(redis_url) - server0
        out["redis_server_cpu_us_per_removal"] = round(server / len(docs) * 1e6, 1)
    await index.upsert(docs)
    return out


async def redis_cpu_s(url: str) -> float:
    """The Redis server's CPU time so far (user + sys, main thread and children)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        info = await client.info("cpu")
    finally:
        await client.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def timed(
    runs: int, call: Callable[[int], Awaitable[Any]], redis_url: str | None = None
) -> dict[str, float]:
    for i in range(20):
        await call(i)
    walls = []
    server0 = await redis_cpu_s(redis_url) if redis_url else 0.0
    cpu0 = time.process_time()
    for i in range(runs):
        t0 = time.perf_counter()
        await call(i)
        walls.append((time.perf_counter() - t0) * 1000)
    cpu = (time.process_time() - cpu0) / runs * 1000
    out = {
        "p50_ms": round(statistics.median(walls), 3),
        "p99_ms": round(percentile(walls, 0.99), 3),
        "cpu_ms_mean": round(cpu, 3),
    }
    if redis_url:
        server = (await redis_cpu_s(redis_url) - server0) / runs * 1000
        out["redis_server_cpu_ms_mean"] = round(server, 3)
    return out


async def context_no_query(name: str, turns: int, runs: int, tmp: Path) -> dict[str, Any]:
    """``Session.context()`` without a query (warm hot tier) in a session of ``turns``
    turns, and the share of it spent in ``assemble_context``."""
    import tiermem.context as context_module
    from tiermem.service import MemoryService
    from tiermem.session import TurnInput
    from tiermem.settings import TierMemSettings

    redis_url = os.environ.get("TIERMEM_TEST_REDIS_URL") if name == "redis" else None
    if name == "redis":
        settings = TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=redis_url or "",
            redis_prefix=f"cx{uuid.uuid4().hex[:6]}",
        )
    elif name == "sqlite":
        settings = TierMemSettings(
            hot_backend="memory",
            durable_backend="sqlite",
            sqlite_path=tmp / f"{uuid.uuid4().hex}.db",
        )
    else:
        settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    assemble = context_module.assemble_context
    assembly_ms: list[float] = []

    def timed_assemble(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return assemble(*args, **kwargs)
        finally:
            assembly_ms.append((time.perf_counter() - t0) * 1000)

    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(f"cx-{turns}", user_id="bench-user")
        texts = make_turn_texts(turns, random.Random(turns))
        for start in range(0, turns, 50):
            await session.add_turns(
                [
                    TurnInput(role="user" if i % 2 == 0 else "assistant", content=texts[i])
                    for i in range(start, min(turns, start + 50))
                ]
            )
        await memory.drain()
        window = await session.context(system="You sell manga.")

        async def call(i: int) -> None:
            await session.context(system="You sell manga.")

        context_module.assemble_context = timed_assemble  # type: ignore[assignment]
        try:
            timing = await timed(runs, call, redis_url)
        finally:
            context_module.assemble_context = assemble  # type: ignore[assignment]
    measured = assembly_ms[20:]  # after the warm-up calls, as in timed()
    return {
        "turns": turns,
        "hot_turns": window.stats.hot_turns,
        "context_tokens": window.total_tokens,
        "context": timing,
        "assemble_context": {
            "p50_ms": round(statistics.median(measured), 3),
            "p99_ms": round(percentile(measured, 0.99), 3),
        },
    }


class MeteredEmbedder:
    """Wraps the real embedder: counts the texts it embeds and the wall time of its calls;
    with ``cached`` set, answers texts it has embedded before from memory, so a recall
    measured through it excludes embedding work (``misses`` shows any that remained)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self.cached = False
        self.cache: dict[str, list[float]] = {}
        self.texts = self.calls = self.misses = 0
        self.wall = 0.0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.cached and all(t in self.cache for t in texts):
            return [self.cache[t] for t in texts]
        self.misses += self.cached
        t0 = time.perf_counter()
        vectors = await self.inner.embed(texts)
        self.wall += time.perf_counter() - t0
        self.calls += 1
        self.texts += len(texts)
        self.cache.update(zip(texts, vectors, strict=True))
        return vectors

    def reset(self) -> None:
        self.texts = self.calls = self.misses = 0
        self.wall = 0.0


class FileBackedEmbedder:
    """Wraps the real embedder for the fill: answers the texts stored in ``path`` (an
    ``.npz`` of texts and float64 vectors) from it, embeds the others with ``inner``, and
    :meth:`save` writes them all back. The vectors are the model's own, so the index holds
    exactly what a fill through the model would give."""

    def __init__(self, inner: Embedder, path: Path) -> None:
        import numpy as np

        self.inner = inner
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self.path = path
        self.vectors: dict[str, list[float]] = {}
        self.added = 0
        if path.exists():
            with np.load(path) as stored:
                texts = stored["texts"].tolist()
                self.vectors = dict(zip(texts, stored["vectors"].tolist(), strict=True))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        todo = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if todo:
            self.vectors.update(zip(todo, await self.inner.embed(todo), strict=True))
            self.added += len(todo)
        return [self.vectors[t] for t in texts]

    def save(self) -> None:
        import numpy as np

        if not self.added:
            return
        texts = list(self.vectors)
        with self.path.open("wb") as out:
            np.savez(
                out,
                texts=np.array(texts),
                vectors=np.array([self.vectors[t] for t in texts], dtype=np.float64),
            )


async def recall_after_writes(
    durable: DurableStore,
    index: SearchIndex,
    embedder: Embedder,
    recall: Callable[[int], Awaitable[None]],
    runs: int,
) -> dict[str, Any]:
    """Per-turn recall in a live conversation: before each recall, one new turn of the
    asking session is indexed with its vector (as the service's indexing path does after
    archiving it). Only the recall is timed; its query's embedding comes from the cache.
    An index that drops its cached vectors on a write reads them all again here."""
    session_id = f"bench-s{SESSIONS - 1}"
    at = NOW - timedelta(days=1, minutes=-1000)  # after the session's filled turns
    texts = make_turn_texts(runs + 20, random.Random(11))
    new = [
        NewTurn(
            role="user" if j % 2 == 0 else "assistant",
            content=(TextBlock(text=text),),
            timestamp=at + timedelta(minutes=j),
        )
        for j, text in enumerate(texts)
    ]
    stored = []
    for j in range(0, len(new), MAX_TURNS_PER_APPEND):
        stored.extend(await durable.append_turns(session_id, new[j : j + MAX_TURNS_PER_APPEND]))
    embedding = Recaller(durable, index, clock=FakeClock(NOW), embedder=embedder)
    docs = await embedding.embed_documents(turn_docs(USER, session_id, stored))
    walls: list[float] = []
    cpu = 0.0
    for i, doc in enumerate(docs):
        await index.upsert([doc])
        cpu0, t0 = time.process_time(), time.perf_counter()
        await recall(i)
        if i >= 20:  # the first 20 warm up, as in timed()
            walls.append((time.perf_counter() - t0) * 1000)
            cpu += time.process_time() - cpu0
    return {
        "p50_ms": round(statistics.median(walls), 3),
        "p99_ms": round(percentile(walls, 0.99), 3),
        "cpu_ms_mean": round(cpu / len(walls) * 1000, 3),
    }


async def run_embeddings(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Hybrid per-turn recall with local all-MiniLM-L6-v2 embeddings (``--embeddings``):
    the query's own embedding alone, and ``recall_for_context`` with every embedding
    answered from a cache (the recall's own cost), and the whole call with real embedding."""
    from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

    clock = FakeClock(NOW)
    local_stores = open_local(name, clock, tmp)
    if local_stores is None:
        raise SystemExit(f"--embeddings supports sqlite and memory, not {name}")
    durable, index = local_stores
    local = LocalMiniLMEmbedder()
    await local.load()
    try:
        rng = random.Random(7)
        cpu0 = time.process_time()
        filler: Embedder = local
        if args.embedding_cache is not None:
            filler = FileBackedEmbedder(local, args.embedding_cache)
        load_s = await fill(durable, index, args.memories, args.turns, rng, embedder=filler)
        load_cpu_s = time.process_time() - cpu0
        if isinstance(filler, FileBackedEmbedder):
            filler.save()
        embedder = MeteredEmbedder(local)
        recaller = Recaller(durable, index, clock=clock, embedder=embedder)
        queries = make_queries(50, rng)
        policy = ContextRecallPolicy(k=8)
        hot = range(180, 200)

        async def recall(i: int) -> None:
            await recall_for_context(
                recaller, USER, queries[i % len(queries)], now=clock.now(),
                session_id=f"bench-s{SESSIONS - 1}", hot_indexes=hot, policy=policy,
            )  # fmt: skip

        async def embed_query(i: int) -> None:
            await local.embed([queries[i % len(queries)]])

        query_embedding = await timed(args.runs, embed_query)
        embedder.reset()
        whole = await timed(args.runs, recall)
        calls = args.runs + 20  # timed() warms up with 20 calls
        whole["embed_calls_per_recall"] = round(embedder.calls / calls, 2)
        whole["texts_embedded_per_recall"] = round(embedder.texts / calls, 2)
        whole["embed_wall_ms_mean"] = round(embedder.wall / calls * 1000, 3)
        for i in range(len(queries)):  # every query's texts are in the cache now
            await recall(i)
        embedder.cached = True
        embedder.reset()
        excluding = await timed(args.runs, recall)
        excluding["cache_misses"] = embedder.misses
        after_write = await recall_after_writes(durable, index, filler, recall, args.runs)
        after_write["cache_misses"] = embedder.misses
        if isinstance(filler, FileBackedEmbedder):
            filler.save()
        result = {
            "model": local.model_id,
            "model_load_s": round(local.load_seconds or 0.0, 2),
            "load_s": round(load_s, 1),
            "load_cpu_s": round(load_cpu_s, 1),
            # With --embedding-cache, the fill's vectors come from the file: load_s and
            # load_cpu_s then leave out embedding 20,000 texts.
            "fill_vectors_from": (
                f"file ({filler.added} texts embedded by the model)"
                if isinstance(filler, FileBackedEmbedder)
                else "model"
            ),
            "query_embedding": query_embedding,
            "recall_excluding_embedding": excluding,
            "recall_with_embedding": whole,
            "recall_after_a_turn_indexed": after_write,
            "load_average_1m": round(os.getloadavg()[0], 1),  # 2 cores, shared machine
        }
        print(name, result)
        return result
    finally:
        await index.aclose()
        await durable.aclose()


async def run(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    clock = FakeClock(NOW)
    closers: list[Callable[[], Awaitable[Any]]] = []
    durable: DurableStore
    index: SearchIndex
    local_stores = open_local(name, clock, tmp)
    if local_stores is not None:
        durable, index = local_stores
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
        redis_url = os.environ["TIERMEM_TEST_REDIS_URL"] if name == "redis" else None
        meter = WriteMeter(redis_url)
        load_s = await fill(durable, index, args.memories, args.turns, rng, meter)
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

        result: dict[str, Any] = {
            "deployment": name,
            "memories": args.memories,
            "archived_turns": args.turns,
            "load_s": round(load_s, 1),
            "index_upsert": meter.per_doc(),
            "index_remove_one": await removal_cost(index, durable, redis_url),
            "recall_for_context": await timed(args.runs, recall, redis_url),
            "index_search": await timed(args.runs, search, redis_url),
        }
        result["context_no_query"] = [
            await context_no_query(name, size, args.runs, tmp) for size in args.context_sizes
        ]
        sizes = result["context_no_query"]
        if len(sizes) > 1:
            # Largest over smallest, and largest over the second size: from 10 turns the
            # window gains a rolling summary, so the first ratio also measures more content.
            for part in ("context", "assemble_context"):
                result[f"{part}_p50_ratio_largest_to_smallest"] = round(
                    sizes[-1][part]["p50_ms"] / sizes[0][part]["p50_ms"], 2
                )
                result[f"{part}_p50_ratio_largest_to_second"] = round(
                    sizes[-1][part]["p50_ms"] / sizes[1][part]["p50_ms"], 2
                )
        result["load_average_1m"] = round(os.getloadavg()[0], 1)  # 2 cores, shared machine
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
    parser.add_argument("--context-sizes", type=int, nargs="*", default=[10, 1_000, 10_000])
    parser.add_argument("--embeddings", action="store_true")
    parser.add_argument("--embedding-cache", type=Path, default=None)
    args = parser.parse_args()
    names = args.only or ["sqlite", "memory"] + (["redis"] if args.redis else [])
    if args.embeddings:
        await main_embeddings(args, names)
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = [await run(name, args, Path(tmp)) for name in names]
    path = RESULTS / "recall_latency.json"
    if path.exists():  # keep the other deployments' last results (--only runs some)
        earlier = json.loads(path.read_text()).get("results", [])
        if not args.context_sizes:  # and, with --context-sizes alone, their context parts
            before = {r["deployment"]: r for r in earlier}
            for result in results:
                old = before.get(result["deployment"], {})
                result.update({k: v for k, v in old.items() if k.startswith("context")})
        kept = {r["deployment"]: r for r in earlier}  # and the --embeddings figures
        for result in results:
            extra = kept.get(result["deployment"], {}).get("recall_for_context_embeddings")
            if extra is not None:
                result["recall_for_context_embeddings"] = extra
        results = [r for r in earlier if r["deployment"] not in names] + results
    write_results(
        RESULTS / "recall_latency.json",
        results,
        what=(
            "recall_for_context (k=8, BM25 only, neighbours), index.search (limit 30), and "
            "Session.context() without a query (warm hot tier) at 10, 1,000 and 10,000 turns"
        ),
        runs=args.runs,
    )


async def main_embeddings(args: argparse.Namespace, names: list[str]) -> None:
    """``--embeddings``: store each deployment's figures under
    ``recall_for_context_embeddings`` in its existing entry, keeping everything else."""
    with tempfile.TemporaryDirectory() as tmp:
        measured = {name: await run_embeddings(name, args, Path(tmp)) for name in names}
    path = RESULTS / "recall_latency.json"
    payload = json.loads(path.read_text()) if path.exists() else {}
    results = payload.get("results", [])
    for name, figures in measured.items():
        entry = next((r for r in results if r["deployment"] == name), None)
        if entry is None:
            entry = {"deployment": name}
            results.append(entry)
        entry["recall_for_context_embeddings"] = {"runs": args.runs, **figures}
    payload["results"] = results
    path.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
