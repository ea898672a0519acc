"""Turn path benchmark (issue #8): CPU, round trips, latency and throughput per pairing.

For each pairing of backends it measures, through the public API (``add_turn`` then
``history()``, write-through, background work included and drained):

* **CPU per turn** of the client process (``time.process_time``: every thread, SQLite's
  and the background worker's included), and of redis-server (``INFO cpu`` delta / turns);
* **round trips per turn**, counted by wrapping the clients
  (:class:`tiermem.testing.round_trips.RoundTrips`): on the response path of ``add_turn``
  and of ``history()``, and in the background work a turn causes;
* **latency** of ``add_turn`` (p50, p99) and **throughput** (turns/s, a turn being
  ``add_turn`` + ``history()``) with 1, 50 and 500 sessions writing concurrently.

Writes ``bench/results/turns.json`` and ``bench/results/turns.png``::

    TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh \\
        .venv/bin/python bench/turns.py
    python bench/turns.py --redis-url redis://127.0.0.1:6379/0 \\
        --dynamodb-url http://127.0.0.1:8000 [--pairings memory+memory,embedded]

Pairings: ``memory+memory``, ``embedded`` (in-process hot + SQLite file, the default),
``sqlite+sqlite``, ``redis+redis`` and ``redis+dynamodb`` (those two need the servers;
``--redis-url`` / ``--dynamodb-url`` default to ``TIERMEM_TEST_REDIS_URL`` /
``TIERMEM_TEST_DYNAMODB_URL``, and a pairing without its server is skipped with a note).
Automatic summaries are on, as in a default service (``--no-summaries`` turns them off to
compare); their cost by session length is measured by ``bench/summaries_cost.py``.

CPU time is steadier than wall time on a shared machine, but not immune: the machine's
load is recorded with the results. DynamoDB Local is a Java emulator on the same cores,
not the AWS service: compare its round trips, not its milliseconds.

Where the CPU goes: each measurement also splits it by thread (``cpu_us_per_turn_by_thread``:
the event loop's, the SQLite worker threads' (``tiermem-sqlite``), any other), read from
each thread's CPU clock, and counts the garbage collector's pauses while it ran (``gc``:
collections and the longest pause per generation, from ``gc.callbacks``). A full
collection (generation 2) walks every tracked object of the process, tens of
milliseconds with a service's modules, models and caches loaded, during which no session
makes progress: at 50 sessions it decides the p99. ``--gc-freeze`` moves what exists
after the warm-up into the permanent generation (``gc.freeze()``), as a service's
entrypoint may do after start-up (see the deployment notes); the library itself never
touches the collector.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tiermem.errors import TierMemError
from tiermem.runtime import run
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.testing.round_trips import RoundTrips
from workload import MESSAGES, RESULTS, add_loop_argument, redis_dynamodb_settings, write_results

ALL_PAIRINGS = ("memory+memory", "embedded", "sqlite+sqlite", "redis+redis", "redis+dynamodb")
WARM_TURNS = 50
TRIP_SAMPLE = 60
"""Turns whose round trips are counted one by one (the background drained in between)."""


class Servers:
    """Where the servers are, and what a pairing needs of them."""

    def __init__(self, redis_url: str | None, dynamodb_url: str | None) -> None:
        self.redis_url = redis_url
        self.dynamodb_url = dynamodb_url

    def missing(self, pairing: str) -> str | None:
        if "redis" in pairing and not self.redis_url:
            return "no --redis-url"
        if "dynamodb" in pairing and not self.dynamodb_url:
            return "no --dynamodb-url"
        return None

    async def settings(self, pairing: str, tmp: Path) -> TierMemSettings:
        db = tmp / f"{uuid.uuid4().hex}.db"
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        if pairing == "memory+memory":
            return TierMemSettings(hot_backend="memory", durable_backend="memory")
        if pairing == "embedded":
            return TierMemSettings(hot_backend="memory", durable_backend="sqlite", sqlite_path=db)
        if pairing == "sqlite+sqlite":
            return TierMemSettings(hot_backend="sqlite", durable_backend="sqlite", sqlite_path=db)
        assert self.redis_url is not None
        if pairing == "redis+redis":
            return TierMemSettings(
                hot_backend="redis",
                durable_backend="redis",
                redis_url=self.redis_url,
                redis_prefix=prefix,
                sqlite_path=db,  # the search index of a Redis deployment without RediSearch
            )
        assert self.dynamodb_url is not None
        return await redis_dynamodb_settings(
            self.redis_url, self.dynamodb_url, prefix, sqlite_path=db
        )

    async def redis_cpu_s(self) -> float | None:
        """redis-server's CPU seconds so far (user + system, all its threads)."""
        if not self.redis_url:
            return None
        from redis.asyncio import Redis

        client = Redis.from_url(self.redis_url)
        try:
            info = await client.info("cpu")
        finally:
            await client.aclose()
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class ThreadCpu:
    """CPU seconds per thread of this process, by role (event loop, SQLite, other), read
    from each live thread's CPU clock; threads that ended in between are not counted, so
    read it before closing the service."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> dict[int, tuple[str, float]]:
        clocks: dict[int, tuple[str, float]] = {}
        for thread in threading.enumerate():
            if thread.ident is None:
                continue
            try:
                clock = time.pthread_getcpuclockid(thread.ident)
                seconds = time.clock_gettime(clock)
            except (OSError, AttributeError):  # ended meanwhile, or not on this platform
                continue
            if thread is threading.main_thread():
                role = "event_loop"
            elif thread.name.startswith("tiermem-sqlite"):
                role = "sqlite"
            else:
                role = "other"
            clocks[thread.ident] = (role, seconds)
        return clocks

    def per_turn_us(self, turns: int) -> dict[str, float]:
        totals: Counter[str] = Counter()
        for ident, (role, seconds) in self._read().items():
            before = self.start.get(ident, (role, 0.0))[1]
            totals[role] += seconds - before
        return {role: round(totals[role] / turns * 1e6, 1) for role in sorted(totals)}


class GcPauses:
    """The garbage collector's pauses while it is entered: count and longest per generation."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {}
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = (time.perf_counter() - self._started) * 1000
            self.pauses.setdefault(info["generation"], []).append(pause)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self) -> dict[str, Any]:
        return {
            f"gen{gen}": {"collections": len(p), "max_ms": round(max(p), 2)}
            for gen, p in sorted(self.pauses.items())
        }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def role(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


async def turn(session: Session, i: int) -> float:
    """One turn: add_turn then history(). Returns add_turn's latency in ms."""
    start = time.perf_counter()
    await session.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
    latency = (time.perf_counter() - start) * 1000
    await session.history()
    # A request boundary. A server returns to its event loop between requests, so the
    # background (indexing, summary passes) runs as turns arrive; without this, a
    # pairing whose calls never wait (memory+memory) would defer it all to the final
    # drain and batch it, which a service never does.
    await asyncio.sleep(0)
    return latency


async def open_service(servers: Servers, pairing: str, tmp: Path, summaries: bool) -> MemoryService:
    settings = await servers.settings(pairing, tmp)
    return MemoryService.from_settings(settings, auto_summarize=summaries)


GC_FREEZE = False
"""Set by ``--gc-freeze``: freeze the collector's heap after each warm-up."""


async def warm(memory: MemoryService) -> None:
    """Turns of a session of its own, so that what is done once per service (loading the
    tokenizer, compiling rules, preparing statements, loading scripts) is not measured.
    With ``--gc-freeze``, what exists then leaves the collector's generations."""
    session = await memory.session(user_id="bench-warm")
    for i in range(WARM_TURNS):
        await turn(session, i)
    await memory.drain()
    if GC_FREEZE:
        gc.collect()
        gc.freeze()


async def measure_cpu(
    servers: Servers, pairing: str, turns: int, tmp: Path, summaries: bool
) -> dict[str, Any]:
    """CPU per turn, one session, turns one after the other."""
    async with await open_service(servers, pairing, tmp, summaries) as memory:
        await warm(memory)
        session = await memory.session(user_id="bench-cpu")
        redis0 = await servers.redis_cpu_s() if "redis" in pairing else None
        threads = ThreadCpu()
        with GcPauses() as pauses:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(turns):
                await turn(session, i)
            await memory.drain()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        by_thread = threads.per_turn_us(turns)
        redis1 = await servers.redis_cpu_s() if "redis" in pairing else None
    result: dict[str, Any] = {
        "cpu_us_per_turn": round(cpu / turns * 1e6, 1),
        "cpu_us_per_turn_by_thread": by_thread,
        "turns_per_s_sequential": round(turns / wall, 1),
        "gc": pauses.report(),
    }
    if redis0 is not None and redis1 is not None:
        # INFO's counters have 10 ms-ish resolution: fine over thousands of turns.
        result["redis_server_cpu_us_per_turn"] = round((redis1 - redis0) / turns * 1e6, 1)
    return result


async def measure_round_trips(
    servers: Servers, pairing: str, tmp: Path, summaries: bool
) -> dict[str, Any]:
    """Round trips of add_turn, of history(), and of the background work, per turn."""
    async with await open_service(servers, pairing, tmp, summaries) as memory:
        await warm(memory)
        session = await memory.session(user_id="bench-trips")
        await turn(session, 0)
        trips = RoundTrips()
        add: Counter[str] = Counter()
        history: Counter[str] = Counter()
        background: Counter[str] = Counter()
        entity_turns = 0
        entities = (await session.view()).entities
        with trips.counting():
            for i in range(TRIP_SAMPLE):
                await session.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
                add += trips.reset()
                await memory.drain()
                background += trips.reset()
                view = await session.view()  # what history() reads, with the entities
                history += trips.reset()
                entity_turns += view.entities != entities
                entities = view.entities
    per = float(TRIP_SAMPLE)
    return {
        "round_trips_add_turn": round(sum(add.values()) / per, 2),
        "round_trips_history": round(sum(history.values()) / per, 2),
        "round_trips_background": round(sum(background.values()) / per, 2),
        "round_trips_by_call": {k: round(v / per, 2) for k, v in sorted((add + history).items())},
        "entity_changing_turns": f"{entity_turns}/{TRIP_SAMPLE}",
    }


async def measure_load(
    servers: Servers,
    pairing: str,
    concurrency: int,
    turns: int,
    tmp: Path,
    summaries: bool,
) -> dict[str, Any]:
    """add_turn latency and turns/s with ``concurrency`` sessions writing at once."""
    per_session = max(4, turns // concurrency)
    latencies: list[float] = []
    async with await open_service(servers, pairing, tmp, summaries) as memory:
        await warm(memory)
        sessions = [
            await memory.session(user_id=f"bench-user-{i % 50}") for i in range(concurrency)
        ]

        async def drive(session: Session) -> None:
            for i in range(per_session):
                latencies.append(await turn(session, i))

        redis0 = await servers.redis_cpu_s() if "redis" in pairing else None
        threads = ThreadCpu()
        with GcPauses() as pauses:
            cpu0, start = time.process_time(), time.perf_counter()
            await asyncio.gather(*(drive(s) for s in sessions))
            await memory.drain()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        by_thread = threads.per_turn_us(len(latencies))
        redis1 = await servers.redis_cpu_s() if "redis" in pairing else None
    server: dict[str, Any] = {}
    if redis0 is not None and redis1 is not None:
        server["redis_server_cpu_us_per_turn"] = round((redis1 - redis0) / len(latencies) * 1e6, 1)
    return {
        "concurrency": concurrency,
        "turns": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies), 3),
        "turns_per_s": round(len(latencies) / wall, 1),
        "cpu_us_per_turn": round(cpu / len(latencies) * 1e6, 1),
        "cpu_us_per_turn_by_thread": by_thread,
        **server,
        "gc": pauses.report(),
    }


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairings = [r["pairing"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    cpu, trips, thr = axes
    x = list(range(len(runs)))
    cpu.bar(x, [r["cpu_us_per_turn"] for r in runs], 0.6, label="client")
    cpu.bar(
        x,
        [r.get("redis_server_cpu_us_per_turn", 0) for r in runs],
        0.6,
        bottom=[r["cpu_us_per_turn"] for r in runs],
        label="redis-server",
    )
    cpu.set_xticks(x, pairings, fontsize=8, rotation=15)
    cpu.set_ylabel("CPU µs per turn (add_turn + history)")
    cpu.legend()
    trips.bar(
        [i - 0.2 for i in x], [r["round_trips_add_turn"] for r in runs], 0.4, label="add_turn"
    )
    trips.bar([i + 0.2 for i in x], [r["round_trips_history"] for r in runs], 0.4, label="history")
    trips.set_xticks(x, pairings, fontsize=8, rotation=15)
    trips.set_ylabel("round trips per call (response path)")
    trips.legend()
    for r in runs:
        loads = r["load"]
        loads = [run for run in loads if "error" not in run]
        thr.plot(
            [run["concurrency"] for run in loads],
            [run["turns_per_s"] for run in loads],
            marker="o",
            label=r["pairing"],
        )
    thr.set_xscale("log")
    thr.set_yscale("log")
    thr.set_xlabel("concurrent sessions")
    thr.set_ylabel("turns / s")
    thr.legend(fontsize=8)
    fig.suptitle("tiermem turn path (write-through)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    servers = Servers(args.redis_url, args.dynamodb_url)
    runs: list[dict[str, Any]] = []
    concurrencies = [int(c) for c in args.sessions.split(",")]
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for pairing in args.pairings.split(","):
            if pairing not in ALL_PAIRINGS:
                raise SystemExit(f"unknown pairing {pairing!r}; use {', '.join(ALL_PAIRINGS)}")
            why = servers.missing(pairing)
            if why is not None:
                print(f"{pairing:15s} skipped: {why}", flush=True)
                continue
            run: dict[str, Any] = {"pairing": pairing}
            turns = args.turns if "dynamodb" not in pairing else args.dynamodb_turns
            run |= await measure_cpu(servers, pairing, turns, tmp, args.summaries)
            run |= await measure_round_trips(servers, pairing, tmp, args.summaries)
            run["load"] = []
            for concurrency in concurrencies:
                try:
                    load = await measure_load(
                        servers, pairing, concurrency, turns, tmp, args.summaries
                    )
                except TierMemError as exc:  # reported in the results, not hidden
                    load = {"concurrency": concurrency, "error": f"{type(exc).__name__}: {exc}"}
                run["load"].append(load)
            runs.append(run)
            redis = run.get("redis_server_cpu_us_per_turn")
            print(
                f"{pairing:15s} {run['cpu_us_per_turn']:8.1f} µs CPU/turn"
                + (f" (+{redis} µs redis-server)" if redis is not None else "")
                + f" {run['cpu_us_per_turn_by_thread']}"
                + f", round trips add_turn {run['round_trips_add_turn']}"
                f" history {run['round_trips_history']}",
                flush=True,
            )
            for load in run["load"]:
                if "error" in load:
                    print(f"{'':15s} {load['concurrency']:4d} sessions: {load['error']}")
                    continue
                full = load["gc"].get("gen2", {"collections": 0, "max_ms": 0.0})
                print(
                    f"{'':15s} {load['concurrency']:4d} sessions: p50 {load['p50_ms']:8.2f} ms"
                    f"  p99 {load['p99_ms']:8.2f} ms  {load['turns_per_s']:8.1f} turns/s"
                    f"  {load['cpu_us_per_turn']:7.1f} µs CPU/turn"
                    + (
                        f" (+{load['redis_server_cpu_us_per_turn']} µs redis-server)"
                        if "redis_server_cpu_us_per_turn" in load
                        else ""
                    )
                    + f"  full GCs {full['collections']} (longest {full['max_ms']} ms)",
                    flush=True,
                )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairings", default=",".join(ALL_PAIRINGS))
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--dynamodb-url", default=os.environ.get("TIERMEM_TEST_DYNAMODB_URL"))
    parser.add_argument("--turns", type=int, default=2000, help="turns per measurement")
    parser.add_argument(
        "--dynamodb-turns", type=int, default=500, help="turns per measurement on DynamoDB Local"
    )
    parser.add_argument("--sessions", default="1,50,500", help="concurrent sessions to load")
    parser.add_argument(
        "--no-summaries",
        dest="summaries",
        action="store_false",
        help="automatic summaries off (on by default, as in a default service)",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after each warm-up, as a service entrypoint may (module docstring)",
    )
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="JSON only")
    parser.add_argument("--out", type=Path, default=RESULTS / "turns.json")
    add_loop_argument(parser)
    args = parser.parse_args()
    global GC_FREEZE
    GC_FREEZE = args.gc_freeze
    runs = run(collect(args), event_loop=args.loop)
    load = os.getloadavg()
    write_results(
        args.out,
        runs,
        summaries=args.summaries,
        gc_freeze=args.gc_freeze,
        loop=args.loop,
        cpus=os.cpu_count(),
        load_average_1_5_15=[round(v, 2) for v in load],
    )
    if args.plot:
        plot(runs, args.out.with_suffix(".png"))
        print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    else:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
