"""Turns/s and CPU per turn on a Redis Cluster vs one standalone redis-server, same run.

Two sections, both through the public :class:`~tiermem.service.MemoryService` API built
from settings (``TIERMEM_REDIS_CLUSTER`` for the cluster), each turn being ``add_turn``
then ``history()``, summaries off, the drain included:

* ``single`` (``results`` in the JSON): one client process, each pairing (Redis hot +
  Redis durable, Redis hot + SQLite durable) at 1 and 50 sessions writing at once.
* ``multi`` (``multi_process``): ``--processes`` client processes (default 1, 2, 4), each
  with its own service driving ``--sessions-per-process`` sessions, all on the same key
  prefix (and, for Redis + SQLite, the same SQLite file, as worker processes of one host
  share it). The processes start, warm up and open their sessions, then are released
  together; ``--turns`` is the total per measurement, split evenly. Repeated ``--rounds``
  times; ``summary`` gives min, median and max per configuration.

Measured: ``turns_per_s`` (turns over the wall time of the timed part: for several
processes, from the first one's start to the last one's drain);
``client_cpu_us_per_turn`` (CPU of the client process(es), ``time.process_time``, SQLite
included, summed); ``redis_cpu_us_per_turn`` (the ``INFO cpu`` delta, user + sys, summed
over every redis-server of the deployment: each cluster master, or the one server);
``cores_busy`` ((client + redis CPU) / wall: how much of the machine the run kept busy);
``load_before`` (the 1-minute load average, a sign of other work on the machine).

Cluster and standalone alternate within each configuration (and swap order every round) so
that the shared machine's load falls on both alike. The JSON is merged: a section not run
keeps its previous figures. Writes ``bench/results/redis_cluster.json`` and, for the
multi-process section, ``bench/results/redis_cluster.png``::

    TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh bash -c \\
      '.venv/bin/python bench/redis_cluster.py --redis-url "$TIERMEM_TEST_REDIS_URL" \\
       --cluster-url "$TIERMEM_TEST_REDIS_CLUSTER_URL" --processes 1,2,4'

What this cannot show on a small machine: every client process and every redis-server
shares the same cores, so once ``cores_busy`` reaches the core count, more client
processes (or more masters) cannot add throughput; the cluster's own cost (per-node
connections, routing, three servers' fixed work) still shows in CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import traceback
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

WARM_TURNS = 30
USERS = 50
START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 600.0


def role(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


async def server_urls(url: str, cluster: bool) -> list[str]:
    """Every redis-server of the deployment: the masters of a cluster, or the one server."""
    if not cluster:
        return [url]
    client = Redis.from_url(url, decode_responses=True)
    try:
        nodes = await client.execute_command("CLUSTER NODES")
    finally:
        await client.aclose()
    return [
        f"redis://{address.split('@')[0]}"
        for address, fields in nodes.items()
        if "master" in fields["flags"] and "fail" not in fields["flags"]
    ]


async def servers_cpu_s(urls: list[str]) -> list[float]:
    """CPU seconds so far of each server in ``urls`` (user + sys, all threads)."""
    totals = []
    for url in urls:
        client = Redis.from_url(url)
        try:
            info = await client.info("cpu")
        finally:
            await client.aclose()
        totals.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return totals


def settings_for(url: str, cluster: bool, durable: str, tmp: Path) -> TierMemSettings:
    return TierMemSettings(
        hot_backend="redis",
        durable_backend=durable,
        redis_url=url,
        redis_cluster=cluster,
        redis_prefix=f"bench{uuid.uuid4().hex[:6]}",
        # The SQLite durable tier (shared by every client process of a measurement).
        sqlite_path=tmp / f"{uuid.uuid4().hex}.db",
    )


async def warm_up(memory: MemoryService) -> None:
    warm = await memory.session(user_id=f"bench-warm-{os.getpid()}")
    for i in range(WARM_TURNS):
        await warm.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
        await warm.history()
    await memory.drain()


async def drive(session: Session, turns: int) -> None:
    for i in range(turns):
        await session.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
        await session.history()


def deployment_name(cluster: bool, masters: int) -> str:
    return f"cluster ({masters} masters)" if cluster else "standalone"


# -- one client process -------------------------------------------------------------------


async def measure(
    url: str, cluster: bool, durable: str, sessions: int, turns: int, tmp: Path
) -> dict[str, Any]:
    urls = await server_urls(url, cluster)
    per_session = max(4, turns // sessions)
    settings = settings_for(url, cluster, durable, tmp)
    async with MemoryService.from_settings(settings, auto_summarize=False) as memory:
        await warm_up(memory)
        opened = [await memory.session(user_id=f"bench-user-{i % USERS}") for i in range(sessions)]
        redis0 = sum(await servers_cpu_s(urls))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(drive(s, per_session) for s in opened))
        await memory.drain()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        redis = sum(await servers_cpu_s(urls)) - redis0
    done = per_session * sessions
    return {
        "deployment": deployment_name(cluster, len(urls)),
        "pairing": f"redis+{durable}",
        "sessions": sessions,
        "turns": done,
        "turns_per_s": round(done / wall, 1),
        "client_cpu_us_per_turn": round(cpu / done * 1e6, 1),
        "redis_cpu_us_per_turn": round(redis / done * 1e6, 1),
        "total_cpu_us_per_turn": round((cpu + redis) / done * 1e6, 1),
    }


async def collect_single(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for durable in ("redis", "sqlite"):
        for sessions in (1, 50):
            for cluster in (True, False):
                url = args.cluster_url if cluster else args.redis_url
                result = await measure(url, cluster, durable, sessions, args.turns, tmp)
                print(
                    f"{result['deployment']:>20} {result['pairing']:>13} "
                    f"{sessions:>3} sessions: {result['turns_per_s']:8.1f} turns/s, "
                    f"client {result['client_cpu_us_per_turn']:7.1f} µs, "
                    f"redis {result['redis_cpu_us_per_turn']:7.1f} µs CPU/turn",
                    flush=True,
                )
                results.append(result)
    return results


# -- several client processes -------------------------------------------------------------


async def client_process(
    settings: TierMemSettings,
    number: int,
    sessions: int,
    per_session: int,
    ready: Queue[tuple[str, int, str]],
    go: Event,
    done: Queue[tuple[str, int, Any]],
) -> None:
    """One client process: its own service and sessions; timed from ``go`` to its drain."""
    async with MemoryService.from_settings(settings, auto_summarize=False) as memory:
        await warm_up(memory)
        opened = [
            await memory.session(user_id=f"bench-user-{(number * sessions + i) % USERS}")
            for i in range(sessions)
        ]
        ready.put(("ready", number, ""))
        await asyncio.to_thread(go.wait)
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        cpu0, start = time.process_time(), time.monotonic()
        await asyncio.gather(*(drive(s, per_session) for s in opened))
        await memory.drain()
        cpu, end = time.process_time() - cpu0, time.monotonic()
        report = {"cpu_s": cpu, "turns": per_session * sessions, "start": start, "end": end}
        done.put(("done", number, report))


def run_client_process(
    settings: TierMemSettings,
    number: int,
    sessions: int,
    per_session: int,
    ready: Queue[tuple[str, int, str]],
    go: Event,
    done: Queue[tuple[str, int, Any]],
) -> None:
    """The entry point of a spawned client process; a failure is reported, not hidden."""
    try:
        asyncio.run(client_process(settings, number, sessions, per_session, ready, go, done))
    except BaseException:
        message = traceback.format_exc()
        ready.put(("error", number, message))
        done.put(("error", number, message))
        raise


def _take(queue: Queue[tuple[str, int, Any]], count: int, timeout: float) -> list[Any]:
    out = []
    deadline = time.monotonic() + timeout
    for _ in range(count):
        kind, number, payload = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        if kind == "error":
            raise RuntimeError(f"client process {number} failed:\n{payload}")
        out.append(payload)
    return out


async def measure_processes(
    url: str, cluster: bool, durable: str, processes: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    urls = await server_urls(url, cluster)
    sessions = args.sessions_per_process
    per_session = max(4, args.turns // (processes * sessions))
    settings = settings_for(url, cluster, durable, tmp)
    ctx = multiprocessing.get_context("spawn")  # no event loop or sockets inherited
    ready: Queue[tuple[str, int, Any]] = ctx.Queue()
    done: Queue[tuple[str, int, Any]] = ctx.Queue()
    go = ctx.Event()
    workers = [
        ctx.Process(
            target=run_client_process,
            args=(settings, n, sessions, per_session, ready, go, done),
            daemon=True,
        )
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        _take(ready, processes, START_TIMEOUT_S)
        load = os.getloadavg()[0]
        redis0 = await servers_cpu_s(urls)
        go.set()
        reports = await asyncio.to_thread(_take, done, processes, RUN_TIMEOUT_S)
        # From the first process's start to the last one's drain (not the queues' latency).
        wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        redis_by_server = [b - a for a, b in zip(redis0, await servers_cpu_s(urls), strict=True)]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
    turns = sum(r["turns"] for r in reports)
    client = sum(r["cpu_s"] for r in reports)
    redis = sum(redis_by_server)
    return {
        "deployment": deployment_name(cluster, len(urls)),
        "pairing": f"redis+{durable}",
        "processes": processes,
        "sessions": processes * sessions,
        "turns": turns,
        "turns_per_s": round(turns / wall, 1),
        "client_cpu_us_per_turn": round(client / turns * 1e6, 1),
        "redis_cpu_us_per_turn": round(redis / turns * 1e6, 1),
        "total_cpu_us_per_turn": round((client + redis) / turns * 1e6, 1),
        "redis_cpu_share_by_server": [
            round(r / redis, 3) if redis else 0.0 for r in redis_by_server
        ],
        "cores_busy": round((client + redis) / wall, 2),
        "load_before": round(load, 2),
    }


SUMMED = (
    "turns_per_s",
    "client_cpu_us_per_turn",
    "redis_cpu_us_per_turn",
    "total_cpu_us_per_turn",
    "cores_busy",
    "load_before",
)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Min, median and max of each figure per (deployment, pairing, processes)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["deployment"], run["pairing"], run["processes"]), []).append(run)
    out = []
    for (deployment, pairing, processes), group in groups.items():
        row: dict[str, Any] = {
            "deployment": deployment,
            "pairing": pairing,
            "processes": processes,
            "rounds": len(group),
        }
        for name in SUMMED:
            values = [r[name] for r in group]
            row[name] = {
                "min": min(values),
                "median": round(statistics.median(values), 2),
                "max": max(values),
            }
        out.append(row)
    return out


async def collect_multi(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for durable in ("redis", "sqlite"):
        for processes in args.processes:
            for round_ in range(args.rounds):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for cluster in order:
                    url = args.cluster_url if cluster else args.redis_url
                    run = await measure_processes(url, cluster, durable, processes, args, tmp)
                    run["round"] = round_
                    print(
                        f"{run['deployment']:>20} {run['pairing']:>13} "
                        f"{processes} proc × {args.sessions_per_process} sessions "
                        f"(round {round_}): {run['turns_per_s']:8.1f} turns/s, "
                        f"client {run['client_cpu_us_per_turn']:7.1f} µs, "
                        f"redis {run['redis_cpu_us_per_turn']:7.1f} µs CPU/turn, "
                        f"{run['cores_busy']:.2f} cores busy, load {run['load_before']}",
                        flush=True,
                    )
                    runs.append(run)
    return runs


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """Turns/s (median, min-max bars) and CPU per turn against client processes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairings = sorted({row["pairing"] for row in summary})
    counts = sorted({row["processes"] for row in summary})
    fig, axes = plt.subplots(2, len(pairings), figsize=(5.5 * len(pairings), 7), squeeze=False)
    for column, pairing in enumerate(pairings):
        rate, cpu = axes[0][column], axes[1][column]
        for color, deployment in enumerate(sorted({row["deployment"] for row in summary})):
            rows = sorted(
                (r for r in summary if r["pairing"] == pairing and r["deployment"] == deployment),
                key=lambda r: r["processes"],
            )
            x = [r["processes"] for r in rows]
            med = [r["turns_per_s"]["median"] for r in rows]
            spread = [
                [m - r["turns_per_s"]["min"] for m, r in zip(med, rows, strict=True)],
                [r["turns_per_s"]["max"] - m for m, r in zip(med, rows, strict=True)],
            ]
            c = f"C{color}"
            rate.errorbar(x, med, yerr=spread, marker="o", capsize=4, color=c, label=deployment)
            redis = [r["redis_cpu_us_per_turn"]["median"] for r in rows]
            total = [r["total_cpu_us_per_turn"]["median"] for r in rows]
            cpu.plot(x, total, marker="o", color=c, label=f"{deployment}: client + redis")
            cpu.plot(x, redis, "x--", color=c, label=f"{deployment}: redis-server only")
        rate.set_title(f"{pairing}: turns/s (median, min–max)", fontsize=9)
        cpu.set_title(f"{pairing}: CPU µs per turn (median)", fontsize=9)
        for ax in (rate, cpu):
            ax.set_xlabel("client processes")
            ax.set_xticks(counts)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    loads = [row["load_before"][end] for row in summary for end in ("min", "max")]
    fig.suptitle(
        f"tiermem on a Redis Cluster vs one server: clients and servers share "
        f"{os.cpu_count()} cores with other work (load average {min(loads):.0f}–"
        f"{max(loads):.0f}), so turns/s is the CPU share the run got, not a capacity",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def note(cores: int | None) -> str:
    return (
        f"All client processes and every redis-server share this machine's {cores} cores "
        "(and other work: see load_before). When cores_busy approaches the core count the "
        "machine, not Redis, is the limit, so more client processes or masters cannot add "
        "throughput and this bench cannot show a cluster scaling out; what it does show is "
        "the cluster's cost per turn (client and server CPU) at equal load, and whether "
        "turns/s holds as client processes are added."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True, help="one standalone redis-server")
    parser.add_argument("--cluster-url", required=True, help="a node of the Redis Cluster")
    parser.add_argument("--turns", type=int, default=3000, help="turns per measurement")
    parser.add_argument(
        "--sections", default="single,multi", help="which sections to run: single, multi"
    )
    parser.add_argument(
        "--processes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 4],
        help="client process counts of the multi-process section, e.g. 1,2,4",
    )
    parser.add_argument("--sessions-per-process", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the multi section")
    parser.add_argument("--out", type=Path, default=RESULTS / "redis_cluster.json")
    args = parser.parse_args()
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not sections <= {"single", "multi"}:
        parser.error(f"unknown section(s): {sorted(sections - {'single', 'multi'})}")
    previous: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    report: dict[str, Any] = {
        "turns_per_measurement": previous.get("turns_per_measurement", args.turns),
        "multi_process": previous.get("multi_process"),
    }
    results: list[dict[str, Any]] = previous.get("results", [])
    with tempfile.TemporaryDirectory() as tmp:
        if "single" in sections:
            results = asyncio.run(collect_single(args, Path(tmp)))
            report["turns_per_measurement"] = args.turns
        if "multi" in sections:
            runs = asyncio.run(collect_multi(args, Path(tmp)))
            summary = summarize(runs)
            report["multi_process"] = {
                "cpus": os.cpu_count(),
                "turns_per_measurement": args.turns,
                "sessions_per_process": args.sessions_per_process,
                "note": note(os.cpu_count()),
                "summary": summary,
                "runs": runs,
            }
            plot(summary, args.out.with_suffix(".png"))
    write_results(args.out, results, **{k: v for k, v in report.items() if v is not None})


if __name__ == "__main__":
    main()
