"""REST API benchmark: add_turn and context through the client SDK against a real uvicorn
server process on loopback (embedded default: in-process hot tier + SQLite).

Measures, client side, add_turn latency (p50/p99) and requests/s with 1 session written
sequentially and with 20 sessions written concurrently, and context() latency with and
without a query on a session of 500 turns. Auth is on (one tenant key; verified keys are
cached after the first scrypt). The server is a separate process, so client and server do
not share a GIL; both share this machine's 2 cores. Each scenario also reports the server
process's CPU per request (``/proc/<pid>/stat``, 10 ms ticks). The server runs on the loop
``run_server`` picks (``TIERMEM_EVENT_LOOP``; uvloop when installed), recorded as
``server_event_loop``. Results go to ``bench/results/rest_api.json`` (``--out``)::

    .venv/bin/python bench/rest_api.py
    TIERMEM_EVENT_LOOP=asyncio .venv/bin/python bench/rest_api.py --out /tmp/asyncio.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tiermem.client import AsyncTierMemClient
from tiermem.interfaces.tenancy import KeyStore
from tiermem.runtime import resolve_event_loop
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

SERVER = (
    "import sys; from tiermem.interfaces.api import run_server; "
    "from tiermem.settings import TierMemSettings; "
    "run_server(TierMemSettings(), '127.0.0.1', int(sys.argv[1]), log_level='warning')"
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def server_cpu(pid: int) -> float:
    """The server process's CPU seconds so far (user + system, every thread), from
    ``/proc/<pid>/stat`` (Linux; clock ticks, 10 ms each)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(
    name: str, latencies: list[float], elapsed: float, cpu: float | None = None
) -> dict[str, Any]:
    ms = [v * 1000 for v in latencies]
    row = {
        "scenario": name,
        "requests": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "requests_per_s": round(len(ms) / elapsed, 1),
    }
    if cpu is not None:
        row["server_cpu_us_per_request"] = round(cpu / len(ms) * 1e6, 1)
    return row


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(300):  # up to 30 s
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            await asyncio.sleep(0.1)
    raise RuntimeError("the API server did not become ready in 30 s")


async def timed(call: Any) -> float:
    start = time.perf_counter()
    await call
    return time.perf_counter() - start


async def run(url: str, key: str, turns: int, sessions: int, pid: int) -> list[dict[str, Any]]:
    results = []
    async with AsyncTierMemClient(url, api_key=key) as client:
        # The floor: a request that touches no backend (HTTP, routing, the client).
        http = client._http  # the SDK's own connection pool
        start, cpu = time.perf_counter(), server_cpu(pid)
        latencies = [await timed(http.get("/healthz")) for _ in range(turns // 2)]
        results.append(
            summary(
                "healthz (floor)", latencies, time.perf_counter() - start, server_cpu(pid) - cpu
            )
        )

        session = await client.open_session("bench-user", "single")
        await session.add_turn("user", "warm-up")
        start, cpu = time.perf_counter(), server_cpu(pid)
        latencies = [
            await timed(session.add_turn("user", MESSAGES[n % len(MESSAGES)])) for n in range(turns)
        ]
        results.append(
            summary(
                "add_turn, 1 session", latencies, time.perf_counter() - start, server_cpu(pid) - cpu
            )
        )

        handles = [await client.open_session("bench-user", f"many-{n}") for n in range(sessions)]
        per_session = max(1, turns // sessions)

        async def writer(handle: Any) -> list[float]:
            return [
                await timed(handle.add_turn("user", MESSAGES[n % len(MESSAGES)]))
                for n in range(per_session)
            ]

        start, cpu = time.perf_counter(), server_cpu(pid)
        groups = await asyncio.gather(*(writer(h) for h in handles))
        latencies = [v for group in groups for v in group]
        results.append(
            summary(
                f"add_turn, {sessions} sessions",
                latencies,
                time.perf_counter() - start,
                server_cpu(pid) - cpu,
            )
        )

        for label, query in (("context, no query", None), ("context, query", "berserk stock")):
            start, cpu = time.perf_counter(), server_cpu(pid)
            latencies = [
                await timed(session.context(query, budget=8000)) for _ in range(turns // 2)
            ]
            results.append(
                summary(
                    f"{label} ({turns} turns)",
                    latencies,
                    time.perf_counter() - start,
                    server_cpu(pid) - cpu,
                )
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "rest_api.json")
    args = parser.parse_args()
    # The server's loop, as run_server picks it (TIERMEM_EVENT_LOOP, default: uvloop when
    # installed): recorded with the results.
    server_loop = resolve_event_loop(TierMemSettings().event_loop)
    with tempfile.TemporaryDirectory() as tmp:
        keys_file = Path(tmp) / "keys.json"
        _, key = KeyStore(keys_file).create("bench")
        port = free_port()
        env = {
            **os.environ,
            "TIERMEM_SQLITE_PATH": str(Path(tmp) / "bench.db"),
            "TIERMEM_API_KEYS_FILE": str(keys_file),
            "TIERMEM_API_RATE_LIMIT_PER_MINUTE": "1000000",
            "TIERMEM_API_RATE_LIMIT_BURST": "1000000",
        }
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], env=env)  # noqa: S603 -- our own interpreter and code
        try:
            url = f"http://127.0.0.1:{port}"
            asyncio.run(wait_ready(url))
            results = asyncio.run(run(url, key, args.turns, args.sessions, server.pid))
        finally:
            server.terminate()
            server.wait(timeout=30)
    for row in results:
        print(
            f"{row['scenario']:<32} p50 {row['p50_ms']:>7.2f} ms  p99 {row['p99_ms']:>7.2f} ms  "
            f"{row['requests_per_s']:>7.1f} req/s  "
            f"server {row['server_cpu_us_per_request']:>7.1f} µs CPU/request"
        )
    write_results(
        args.out,
        results,
        pairing="embedded (memory hot + SQLite), uvicorn 1 worker, loopback, auth on",
        server_event_loop=server_loop,
    )


if __name__ == "__main__":
    main()
