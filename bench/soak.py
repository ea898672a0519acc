"""Soak (issue #13): bounded mixed load on loopback for a long time, with TTL expiry.

Many simulated users open sessions, talk, read their history, assemble context, recall,
remember and write state, while a fake clock runs ``--accel`` times faster than the wall
clock (default 120x: 30 minutes are 60 simulated hours), so hot sessions expire, the
expiry sweeper hands them off, and archived turns pass their 24-hour retention many times
over. Sessions churn: a user mostly continues one of their recent sessions and sometimes
starts a new one, so the set of live sessions turns over instead of growing.

Every ``--sample-seconds`` it records the hot tier's size (sessions held in process, or
the Redis keys and ``used_memory`` under the run's prefix), the process RSS, the SQLite
file size, operations done and failed, and add_turn latency (p50/p99) in the window.
What must hold: hot-tier size and RSS level off (bounded), failures stay 0, and every
turn acknowledged to a session still live is readable (checked on a sample at the end).

Writes ``bench/results/soak.json`` and ``bench/results/soak.png``::

    python bench/soak.py                       # 30 minutes, embedded (in-process hot + SQLite)
    python bench/soak.py --minutes 5
    TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh \\
        .venv/bin/python bench/soak.py --minutes 5 --hot redis   # Redis hot tier

Not run in CI (tests/reliability holds the fault tests); the 30-minute run is for release
checks. Numbers are from one shared machine: compare shapes (flat or growing), not
milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from tiermem.clock import FakeClock
from tiermem.errors import TierMemError
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

OPS = (
    ("add_turn", 0.55),
    ("history", 0.15),
    ("context", 0.10),
    ("recall", 0.08),
    ("remember", 0.04),
    ("state", 0.08),
)


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Window:
    ops: int = 0
    failures: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class User:
    id: str
    sessions: list[Session] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.clock = FakeClock()
        self.prefix = f"soak{uuid.uuid4().hex[:6]}"
        settings: dict[str, Any] = {
            "sqlite_path": workdir / "soak.db",
            "hot_window": 20,
            # A short grace: expired data is collected minutes (simulated) after expiry.
            "gc_grace_seconds": 300,
        }
        if args.hot == "redis":
            settings |= {"hot_backend": "redis", "redis_url": args.redis_url}
            settings["redis_prefix"] = self.prefix
        self.settings = TierMemSettings(**settings)
        self.memory = MemoryService.from_settings(self.settings, clock=self.clock)
        self.sweeper = self.memory.sweeper(owner="soak")
        self.rng = random.Random(args.seed)
        self.window = Window()
        self.samples: list[dict[str, Any]] = []
        self.totals = {"ops": 0, "failures": 0, "turns": 0, "sessions": 0, "swept": 0}
        self.users = [User(f"user-{n}") for n in range(args.users)]
        self.stop = asyncio.Event()

    # -- load ------------------------------------------------------------------------------

    async def session_for(self, user: User) -> Session:
        if not user.sessions or self.rng.random() < self.args.new_session_rate:
            session = await self.memory.session(user_id=user.id)
            user.sessions = [*user.sessions[-2:], session]  # a user resumes one of 3 recent
            self.totals["sessions"] += 1
            return session
        return self.rng.choice(user.sessions)

    async def one_op(self, user: User) -> None:
        kind = self.rng.choices([k for k, _ in OPS], [w for _, w in OPS])[0]
        start = time.perf_counter()
        try:
            if kind == "remember":
                await self.memory.longterm.remember(user.id, self.rng.choice(MESSAGES))
            elif kind == "recall":
                await self.memory.longterm.recall(
                    user.id, "berserk volume", scope=("memory", "turn")
                )
            else:
                session = await self.session_for(user)
                if kind == "add_turn":
                    role = self.rng.choice(("user", "assistant"))
                    turn = await session.add_turn(role, self.rng.choice(MESSAGES))
                    user.acked[session.id] = max(user.acked.get(session.id, 0), turn.index + 1)
                    self.totals["turns"] += 1
                    self.window.latencies.append(time.perf_counter() - start)
                elif kind == "history":
                    await session.history()
                elif kind == "context":
                    await session.context("berserk", 2000)
                else:
                    await session.put_state("cart", {"n": self.rng.randrange(100)})
        except TierMemError as exc:
            # An expired session reopened by another op, a lost race: counted, never hidden.
            self.window.failures += 1
            name = type(exc).__name__
            self.window.errors[name] = self.window.errors.get(name, 0) + 1
            # A session that expired is dropped from the user's recent list.
            user.sessions = [s for s in user.sessions if s.id not in str(exc)]
        self.window.ops += 1

    async def worker(self, user_ids: list[int]) -> None:
        while not self.stop.is_set():
            user = self.users[self.rng.choice(user_ids)]
            await self.one_op(user)
            # Bounded load: think time between a user's actions.
            await asyncio.sleep(self.rng.uniform(0, 2 * self.args.think_ms / 1000))

    # -- time, expiry, sampling ---------------------------------------------------------

    async def drive_clock(self) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(0.1)
            self.clock.advance(timedelta(seconds=0.1 * self.args.accel))

    async def sweep(self) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(1.0)
            try:
                result = await self.sweeper.sweep_once(limit=500)
                self.totals["swept"] += len(result.handed_off)
            except TierMemError as exc:
                print(f"sweep failed: {exc}")

    async def hot_size(self) -> dict[str, Any]:
        hot = self.memory.tiers.hot
        if self.args.hot == "redis":
            client = getattr(hot, "_client", None) or getattr(hot, "client", None)
            keys = 0
            async for _ in client.scan_iter(match=f"*{self.prefix}*", count=1000):
                keys += 1
            info = await client.info("memory")
            return {"hot_keys": keys, "redis_used_memory": int(info["used_memory"])}
        # The in-process hot tier's dict of sessions (a bench may look inside).
        return {"hot_sessions": len(getattr(hot, "_sessions", {}))}

    async def sample(self, started: float) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(self.args.sample_seconds)
            window, self.window = self.window, Window()
            lat = sorted(window.latencies)
            db = self.settings.sqlite_path
            sample = {
                "elapsed_s": round(time.monotonic() - started, 1),
                "simulated_h": round(
                    (self.clock.now() - self.start_time).total_seconds() / 3600, 2
                ),
                "ops": window.ops,
                "ops_per_s": round(window.ops / self.args.sample_seconds, 1),
                "failures": window.failures,
                "errors": window.errors,
                "add_turn_p50_ms": round(1000 * statistics.median(lat), 2) if lat else None,
                "add_turn_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2)
                if lat
                else None,
                "rss_mb": round(rss_bytes() / 2**20, 1),
                "sqlite_mb": round(db.stat().st_size / 2**20, 2) if db and db.exists() else 0,
                "background_queued": self.memory.background.queued,
                **await self.hot_size(),
            }
            self.totals["ops"] += window.ops
            self.totals["failures"] += window.failures
            self.samples.append(sample)
            print(
                f"{sample['elapsed_s']:7.0f}s sim {sample['simulated_h']:6.1f}h "
                f"{sample['ops_per_s']:6.1f} op/s fail {window.failures:3d} "
                f"rss {sample['rss_mb']:6.1f} MB "
                f"hot {sample.get('hot_sessions', sample.get('hot_keys'))} "
                f"p99 {sample['add_turn_p99_ms']} ms",
                flush=True,
            )

    async def verify(self) -> dict[str, int]:
        """Every turn acknowledged to a session whose archive is still within retention is
        readable at its index (a sample of sessions)."""
        checked = missing = 0
        pairs = [(u, sid, n) for u in self.users for sid, n in u.acked.items()]
        for _, sid, acked in self.rng.sample(pairs, min(200, len(pairs))):
            turns = await self.memory.tiers.get_turns(sid, 0, None)
            indexes = {t.index for t in turns}
            if not turns:
                continue  # past retention: collected, as configured
            first = min(indexes)
            expected = set(range(first, acked))
            checked += len(expected)
            missing += len(expected - indexes)
        return {"turns_checked": checked, "turns_missing": missing}

    async def run(self) -> dict[str, Any]:
        self.start_time = self.clock.now()
        started = time.monotonic()
        per_worker = max(1, len(self.users) // self.args.workers)
        groups = [
            list(range(i, min(i + per_worker, len(self.users))))
            for i in range(0, len(self.users), per_worker)
        ]
        tasks = [asyncio.create_task(self.worker(g)) for g in groups]
        tasks += [
            asyncio.create_task(self.drive_clock()),
            asyncio.create_task(self.sweep()),
            asyncio.create_task(self.sample(started)),
        ]
        await asyncio.sleep(self.args.minutes * 60)
        self.stop.set()
        await asyncio.gather(*tasks)
        await self.memory.drain()
        verified = await self.verify()
        await self.memory.aclose()
        return verified


def summarize(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """First, max and last value, and the slope over the second half (per minute): a
    bounded series has a slope near 0 there."""
    values = [s[key] for s in samples if s.get(key) is not None]
    if not values:
        return {}
    half = samples[len(samples) // 2 :]
    xs = [s["elapsed_s"] / 60 for s in half if s.get(key) is not None]
    ys = [s[key] for s in half if s.get(key) is not None]
    slope = statistics.linear_regression(xs, ys).slope if len(xs) >= 2 else 0.0
    return {
        "first": values[0],
        "max": max(values),
        "last": values[-1],
        "second_half_slope_per_min": round(slope, 3),
    }


def plot(samples: list[dict[str, Any]], path: Path, hot_key: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["elapsed_s"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    series = [
        ("rss_mb", "process RSS (MB)"),
        (hot_key, "hot tier size"),
        ("ops_per_s", "operations/s"),
        ("add_turn_p99_ms", "add_turn p99 (ms)"),
    ]
    for ax, (key, label) in zip(axes, series, strict=True):
        ax.plot(minutes, [s.get(key) or 0 for s in samples])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes (wall clock)")
    fig.suptitle("tiermem soak: mixed load with accelerated TTL expiry")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--think-ms", type=float, default=20.0, help="mean pause per worker op")
    parser.add_argument("--new-session-rate", type=float, default=0.05)
    parser.add_argument("--accel", type=float, default=120.0, help="simulated s per real s")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--hot", choices=("memory", "redis"), default="memory")
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args()
    if args.hot == "redis" and not args.redis_url:
        parser.error("--hot redis needs --redis-url or TIERMEM_TEST_REDIS_URL")
    with tempfile.TemporaryDirectory(prefix="tiermem-soak-") as workdir:
        soak = Soak(args, Path(workdir))
        verified = asyncio.run(soak.run())
    hot_key = "hot_keys" if args.hot == "redis" else "hot_sessions"
    summary = {
        "rss_mb": summarize(soak.samples, "rss_mb"),
        hot_key: summarize(soak.samples, hot_key),
        "sqlite_mb": summarize(soak.samples, "sqlite_mb"),
        "add_turn_p99_ms": summarize(soak.samples, "add_turn_p99_ms"),
        **soak.totals,
        **verified,
    }
    write_results(
        args.out,
        soak.samples,
        config={k: str(v) for k, v in vars(args).items()},
        load_average=os.getloadavg(),
        summary=summary,
    )
    plot(soak.samples, args.out.with_suffix(".png"), hot_key)
    print(f"summary: {summary}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
