"""Storage benchmark: append and load latency per backend.

For each backend, ``--sessions`` sessions receive ``--appends`` single-turn appends in
total, driven by ``--concurrency`` asyncio tasks, through both roles of the contract:

* hot append  (``HotStore.append_turns``: window cap + expiry + version in one write)
* hot load    (``HotStore.load``: the whole snapshot in one read)
* durable append (``DurableStore.append_turns``: gap-free index allocation)
* durable tail   (``DurableStore.tail_turns(20)``: the lazy-reload read)

Results go to ``bench/results/storage.json`` and ``bench/results/storage.png``.
Redis and DynamoDB Local must be running; the simplest way is::

    TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh python bench/storage.py

which starts both on loopback and exports TIERMEM_TEST_REDIS_URL / TIERMEM_TEST_DYNAMODB_URL.
Numbers are from one 2-core machine and vary run to run by 10-30 %; compare backends within
one run, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tiermem.clock import SystemClock
from tiermem.composition import open_durable_store, open_hot_store
from tiermem.models import NewTurn, TextBlock
from tiermem.settings import TierMemSettings
from tiermem.store.contract import DurableStore, HotStore

RESULTS = Path(__file__).parent / "results"

# Realistic chat turns: 20-400 characters, English and Japanese.
PHRASES = [
    "Do you have Berserk volume 42 in stock?",
    "I prefer seinen over shojo, and nothing with horror please.",
    "好きなジャンルはセイネンです。",
    "Your order ORD-12345 ships tomorrow from the Osaka warehouse.",
    "Thanks!",
    "Could you recommend something like Vinland Saga but shorter?",
]


def make_turn(rng: random.Random, clock: SystemClock) -> NewTurn:
    text = " ".join(rng.choice(PHRASES) for _ in range(rng.randint(1, 6)))
    role = rng.choice(["user", "assistant"])
    return NewTurn.model_validate(
        {"role": role, "content": [TextBlock(text=text)], "timestamp": clock.now()}
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples: list[float], wall_s: float) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_ms": round(percentile(samples, 0.50), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "ops_per_s": round(len(samples) / wall_s, 1),
    }


async def timed(samples: list[float], op: Callable[[], Awaitable[Any]]) -> None:
    start = time.perf_counter()
    await op()
    samples.append((time.perf_counter() - start) * 1000)


async def run_backend(
    name: str,
    hot: HotStore,
    durable: DurableStore,
    *,
    sessions: int,
    appends: int,
    concurrency: int,
    window: int,
) -> dict[str, Any]:
    clock = SystemClock()
    rng = random.Random(42)
    run = uuid.uuid4().hex[:8]
    session_ids = [f"bench-{run}-{i}" for i in range(sessions)]
    ops: dict[str, list[float]] = {
        k: [] for k in ("hot_append", "hot_load", "durable_append", "durable_tail")
    }
    walls: dict[str, float] = {}
    per_task = appends // concurrency

    async def phase(label: str, work: Callable[[int, int], Awaitable[None]]) -> None:
        async def worker(w: int) -> None:
            for i in range(per_task):
                await work(w, i)

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        walls[label] = time.perf_counter() - start

    def sid(w: int, i: int) -> str:
        return session_ids[(w * per_task + i) % sessions]

    async def hot_append(w: int, i: int) -> None:
        turn = make_turn(rng, clock)
        await timed(
            ops["hot_append"],
            lambda: hot.append_turns(
                sid(w, i), [turn], window=window, expires_at=clock.now() + timedelta(minutes=30)
            ),
        )

    async def hot_load(w: int, i: int) -> None:
        await timed(ops["hot_load"], lambda: hot.load(sid(w, i)))

    async def durable_append(w: int, i: int) -> None:
        turn = make_turn(rng, clock)
        await timed(ops["durable_append"], lambda: durable.append_turns(sid(w, i), [turn]))

    async def durable_tail(w: int, i: int) -> None:
        await timed(ops["durable_tail"], lambda: durable.tail_turns(sid(w, i), 20))

    await phase("hot_append", hot_append)
    await phase("hot_load", hot_load)
    await phase("durable_append", durable_append)
    await phase("durable_tail", durable_tail)
    for session_id in session_ids:
        await hot.delete(session_id)
        await durable.delete_session(session_id)
    return {op: summarize(samples, walls[op]) for op, samples in ops.items()}


async def open_pair(name: str, tmp: Path) -> tuple[HotStore, DurableStore]:
    env = os.environ
    if name == "memory":
        settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    elif name == "sqlite":
        settings = TierMemSettings(
            hot_backend="sqlite", durable_backend="sqlite", sqlite_path=tmp / "bench.db"
        )
    elif name == "redis":
        settings = TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=env["TIERMEM_TEST_REDIS_URL"],
            redis_prefix=f"bench{uuid.uuid4().hex[:6]}",
        )
    else:
        from tiermem.store.backends.dynamodb import create_table

        table = f"tiermem-bench-{uuid.uuid4().hex[:6]}"
        endpoint = env["TIERMEM_TEST_DYNAMODB_URL"]
        await create_table(table, endpoint_url=endpoint, region_name="us-east-1")
        settings = TierMemSettings(
            hot_backend="dynamodb",
            durable_backend="dynamodb",
            dynamodb_table=table,
            dynamodb_endpoint_url=endpoint,
            aws_region="us-east-1",
        )
    return open_hot_store(settings), open_durable_store(settings)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(results["backends"])
    ops = ["hot_append", "hot_load", "durable_append", "durable_tail"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = [
        ("latency", "p50_ms", "p50 latency, 1 task (ms, log)"),
        ("latency", "p99_ms", "p99 latency, 1 task (ms, log)"),
        ("throughput", "ops_per_s", f"ops/s, {results['params']['concurrency']} tasks (log)"),
    ]
    width = 0.8 / len(backends)
    for ax, (label, stat, title) in zip(axes, panels, strict=True):
        for b_i, backend in enumerate(backends):
            values = [results["backends"][backend][label][op][stat] for op in ops]
            ax.bar([i + b_i * width for i in range(len(ops))], values, width, label=backend)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))], ops, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"tiermem storage contract: {results['params']['appends']} appends over "
        f"{results['params']['sessions']} sessions (DynamoDB Local: "
        f"{results['params']['dynamodb_appends']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def collect() -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="memory,sqlite,redis,dynamodb")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--appends", type=int, default=100_000)
    parser.add_argument(
        "--dynamodb-appends",
        type=int,
        default=10_000,
        help="DynamoDB Local is a slow Java emulator; fewer ops keep the run short",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--latency-appends",
        type=int,
        default=5000,
        help="appends of the one-task latency pass (DynamoDB: a fifth)",
    )
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS / "storage.json"))
    args = parser.parse_args()

    import tempfile

    results: dict[str, Any] = {
        "params": {
            "sessions": args.sessions,
            "appends": args.appends,
            "dynamodb_appends": args.dynamodb_appends,
            "concurrency": args.concurrency,
            "window": args.window,
            "latency_appends": args.latency_appends,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.backends.split(","):
            results["backends"][name] = {}
            # Two passes: one task at a time gives each operation's latency (service time);
            # many tasks give throughput, where latency is mostly queueing in this process.
            passes = {
                "latency": (
                    args.latency_appends if name != "dynamodb" else args.latency_appends // 5,
                    1,
                ),
                "throughput": (
                    args.dynamodb_appends if name == "dynamodb" else args.appends,
                    args.concurrency,
                ),
            }
            for label, (appends, concurrency) in passes.items():
                hot, durable = await open_pair(name, Path(tmp))
                print(
                    f"== {name} {label}: {appends} appends over {args.sessions} sessions, "
                    f"{concurrency} tasks",
                    flush=True,
                )
                try:
                    stats = await run_backend(
                        name,
                        hot,
                        durable,
                        sessions=args.sessions,
                        appends=appends,
                        concurrency=concurrency,
                        window=args.window,
                    )
                finally:
                    await hot.aclose()
                    await durable.aclose()
                results["backends"][name][label] = stats
                for op, row in stats.items():
                    print(
                        f"   {op:15s} p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:8.3f} ms"
                        f"  {row['ops_per_s']:9.1f} ops/s",
                        flush=True,
                    )
    return args, results


def main() -> None:
    args, results = asyncio.run(collect())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
