"""REST API benchmark: add_turn and context through the client SDK against a real uvicorn
server process on loopback (embedded default: in-process hot tier + SQLite).

Measures, client side, add_turn latency (p50/p99) and requests/s with 1 session written
sequentially and with 20 sessions written concurrently, and context() latency with and
without a query on a session of 500 turns. Auth is on (one tenant key; verified keys are
cached after the first scrypt). The server is a separate process, so client and server do
not share a GIL; both share this machine's 2 cores. Results go to
``bench/results/rest_api.json``::

    .venv/bin/python bench/rest_api.py
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
from workload import MESSAGES, RESULTS, write_results

SERVER = (
    "import sys; from tiermem.interfaces.api import run_server; "
    "from tiermem.settings import TierMemSettings; "
    "run_server(TierMemSettings(), '127.0.0.1', int(sys.argv[1]), log_level='warning')"
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(name: str, latencies: list[float], elapsed: float) -> dict[str, Any]:
    ms = [v * 1000 for v in latencies]
    return {
        "scenario": name,
        "requests": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "requests_per_s": round(len(ms) / elapsed, 1),
    }


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


async def run(url: str, key: str, turns: int, sessions: int) -> list[dict[str, Any]]:
    results = []
    async with AsyncTierMemClient(url, api_key=key) as client:
        # The floor: a request that touches no backend (HTTP, routing, the client).
        http = client._http  # the SDK's own connection pool
        start = time.perf_counter()
        latencies = [await timed(http.get("/healthz")) for _ in range(turns // 2)]
        results.append(summary("healthz (floor)", latencies, time.perf_counter() - start))

        session = await client.open_session("bench-user", "single")
        await session.add_turn("user", "warm-up")
        start = time.perf_counter()
        latencies = [
            await timed(session.add_turn("user", MESSAGES[n % len(MESSAGES)])) for n in range(turns)
        ]
        results.append(summary("add_turn, 1 session", latencies, time.perf_counter() - start))

        handles = [await client.open_session("bench-user", f"many-{n}") for n in range(sessions)]
        per_session = max(1, turns // sessions)

        async def writer(handle: Any) -> list[float]:
            return [
                await timed(handle.add_turn("user", MESSAGES[n % len(MESSAGES)]))
                for n in range(per_session)
            ]

        start = time.perf_counter()
        groups = await asyncio.gather(*(writer(h) for h in handles))
        latencies = [v for group in groups for v in group]
        results.append(
            summary(f"add_turn, {sessions} sessions", latencies, time.perf_counter() - start)
        )

        for label, query in (("context, no query", None), ("context, query", "berserk stock")):
            start = time.perf_counter()
            latencies = [
                await timed(session.context(query, budget=8000)) for _ in range(turns // 2)
            ]
            results.append(
                summary(f"{label} ({turns} turns)", latencies, time.perf_counter() - start)
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=20)
    args = parser.parse_args()
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
            results = asyncio.run(run(url, key, args.turns, args.sessions))
        finally:
            server.terminate()
            server.wait(timeout=30)
    for row in results:
        print(
            f"{row['scenario']:<32} p50 {row['p50_ms']:>7.2f} ms  p99 {row['p99_ms']:>7.2f} ms  "
            f"{row['requests_per_s']:>7.1f} req/s"
        )
    write_results(
        RESULTS / "rest_api.json",
        results,
        pairing="embedded (memory hot + SQLite), uvicorn 1 worker, loopback, auth on",
    )


if __name__ == "__main__":
    main()
