"""What ``TIERMEM_REDIS_WAIT_REPLICAS=1`` costs a turn: latency, throughput and CPU, with
WAIT off and on, same run, Redis hot + Redis durable on a standalone master with one replica.

The script starts its own master and replica (``redis-server`` on free loopback ports, no
persistence) and drives them through the public service built from settings
(``open_service``; indexing, detection and summaries off, so a turn is the one-script
append). Two loads per setting:

* ``sequential``: one session, ``--turns`` turns one after the other: per-turn latency
  (p50, p95, max of ``add_turn``);
* ``concurrent``: ``--sessions`` sessions appending at once, ``--turns`` in total:
  ``turns_per_s``.

CPU per turn: the client process (``time.process_time``) and the master and replica
(``INFO cpu`` deltas, user + sys). WAIT off and on alternate within every round (and swap
order each round) so the shared machine's load falls on both alike; ``summary`` gives
min / median / max over ``--rounds``. Writes ``bench/results/redis_wait.json``::

    .venv/bin/python bench/redis_wait.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from tiermem.composition import open_service
from tiermem.settings import TierMemSettings

RESULTS = Path(__file__).parent / "results" / "redis_wait.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(server: str, port: int, home: Path, *extra: str) -> subprocess.Popen[bytes]:
    home.mkdir()
    return subprocess.Popen(  # noqa: S603 -- fixed binary and arguments
        [
            server,
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--repl-diskless-sync-delay", "0", "--dir", str(home), *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _until_synced(replica: int) -> None:
    for _ in range(400):
        try:
            async with Redis(host="127.0.0.1", port=replica, decode_responses=True) as client:
                if (await client.info("replication")).get("master_link_status") == "up":
                    return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the replica did not sync")


async def _cpu(port: int) -> float:
    async with Redis(host="127.0.0.1", port=port) as client:
        info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _measure(
    master: int, replica: int, wait: int, turns: int, sessions: int, timeout_ms: int
) -> dict[str, Any]:
    settings = TierMemSettings(
        hot_backend="redis",
        durable_backend="redis",
        redis_url=f"redis://127.0.0.1:{master}/0",
        redis_prefix=f"bw{os.urandom(3).hex()}",
        redis_wait_replicas=wait,
        redis_wait_timeout_ms=timeout_ms,
    )
    memory = open_service(settings, index_turns=False, auto_detect=False, auto_summarize=False)
    try:
        one = await memory.session(user_id="u-seq")
        await one.add_turn("user", "warm up")
        latencies = []
        cpu0, m0, r0 = time.process_time(), await _cpu(master), await _cpu(replica)
        for n in range(turns):
            started = time.perf_counter()
            await one.add_turn("user", f"sequential turn {n}")
            latencies.append((time.perf_counter() - started) * 1e6)
        cpu1, m1, r1 = time.process_time(), await _cpu(master), await _cpu(replica)
        latencies.sort()

        many = [await memory.session(user_id=f"u-{n}") for n in range(sessions)]
        per_session = max(1, turns // sessions)

        async def load(session: Any) -> None:
            for n in range(per_session):
                await session.add_turn("user", f"concurrent turn {n}")

        started = time.perf_counter()
        await asyncio.gather(*(load(s) for s in many))
        wall = time.perf_counter() - started
        await memory.drain()
        return {
            "wait_replicas": wait,
            "sequential_p50_us": latencies[len(latencies) // 2],
            "sequential_p95_us": latencies[int(len(latencies) * 0.95)],
            "sequential_max_us": latencies[-1],
            "client_cpu_us_per_turn": (cpu1 - cpu0) * 1e6 / turns,
            "master_cpu_us_per_turn": (m1 - m0) * 1e6 / turns,
            "replica_cpu_us_per_turn": (r1 - r0) * 1e6 / turns,
            "concurrent_turns_per_s": per_session * sessions / wall,
        }
    finally:
        await memory.aclose()


def _summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key in runs[0]:
        if key == "wait_replicas":
            continue
        values = [run[key] for run in runs]
        out[key] = {
            "min": round(min(values), 1),
            "median": round(statistics.median(values), 1),
            "max": round(max(values), 1),
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--timeout-ms", type=int, default=1000)
    args = parser.parse_args()
    server = os.environ.get("TIERMEM_TEST_REDIS_SERVER_BIN") or shutil.which("redis-server")
    if not server:
        raise SystemExit("redis-server is not installed")
    master, replica = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            _start(server, master, Path(tmp) / "master"),
            _start(server, replica, Path(tmp) / "replica", "--replicaof", "127.0.0.1", str(master)),
        ]
        try:
            await _until_synced(replica)
            runs: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
            for n in range(args.rounds):
                for wait in (0, 1) if n % 2 == 0 else (1, 0):
                    run = await _measure(
                        master, replica, wait, args.turns, args.sessions, args.timeout_ms
                    )
                    runs[wait].append(run)
                    print(json.dumps(run))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)
    result = {
        "what": "add_turn, Redis hot + Redis durable, standalone master + 1 replica, loopback",
        "turns": args.turns,
        "sessions": args.sessions,
        "rounds": args.rounds,
        "load_before": os.getloadavg()[0],
        "summary": {"wait_0": _summary(runs[0]), "wait_1": _summary(runs[1])},
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    asyncio.run(main())
