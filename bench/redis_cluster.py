"""Turns/s and CPU per turn on a Redis Cluster vs one standalone redis-server, same run.

For each deployment (the 3-master cluster, the standalone server), each pairing (Redis
hot + Redis durable, Redis hot + SQLite durable) and each concurrency (1 and 50 sessions
writing at once), a service built from settings (``TIERMEM_REDIS_CLUSTER`` for the
cluster) runs ``add_turn`` then ``history()`` per turn, and the drain. Measured:

* ``turns_per_s``: turns over wall time;
* ``client_cpu_us_per_turn``: this process's CPU (``time.process_time``, SQLite included);
* ``redis_cpu_us_per_turn``: the ``INFO cpu`` delta (user + sys) summed over every
  redis-server of the deployment (each cluster master), per turn.

Cluster and standalone alternate within each configuration so that the shared machine's
load falls on both alike. Writes ``bench/results/redis_cluster.json``::

    TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh bash -c \\
      '.venv/bin/python bench/redis_cluster.py --redis-url "$TIERMEM_TEST_REDIS_URL" \\
       --cluster-url "$TIERMEM_TEST_REDIS_CLUSTER_URL"'
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, write_results

WARM_TURNS = 30


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


async def servers_cpu_s(urls: list[str]) -> float:
    """CPU seconds so far of every server in ``urls`` (user + sys, all threads)."""
    total = 0.0
    for url in urls:
        client = Redis.from_url(url)
        try:
            info = await client.info("cpu")
        finally:
            await client.aclose()
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def settings_for(url: str, cluster: bool, durable: str, tmp: Path) -> TierMemSettings:
    return TierMemSettings(
        hot_backend="redis",
        durable_backend=durable,
        redis_url=url,
        redis_cluster=cluster,
        redis_prefix=f"bench{uuid.uuid4().hex[:6]}",
        # The SQLite durable tier, or the search index of a Redis deployment without
        # RediSearch.
        sqlite_path=tmp / f"{uuid.uuid4().hex}.db",
    )


async def measure(
    url: str, cluster: bool, durable: str, sessions: int, turns: int, tmp: Path
) -> dict[str, Any]:
    urls = await server_urls(url, cluster)
    per_session = max(4, turns // sessions)
    settings = settings_for(url, cluster, durable, tmp)
    async with MemoryService.from_settings(settings, auto_summarize=False) as memory:
        warm = await memory.session(user_id="bench-warm")
        for i in range(WARM_TURNS):
            await warm.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
            await warm.history()
        await memory.drain()
        opened = [await memory.session(user_id=f"bench-user-{i % 50}") for i in range(sessions)]

        async def drive(session: Session) -> None:
            for i in range(per_session):
                await session.add_turn(role(i), MESSAGES[i % len(MESSAGES)])
                await session.history()

        redis0 = await servers_cpu_s(urls)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(drive(s) for s in opened))
        await memory.drain()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        redis = await servers_cpu_s(urls) - redis0
    done = per_session * sessions
    return {
        "deployment": f"cluster ({len(urls)} masters)" if cluster else "standalone",
        "pairing": f"redis+{durable}",
        "sessions": sessions,
        "turns": done,
        "turns_per_s": round(done / wall, 1),
        "client_cpu_us_per_turn": round(cpu / done * 1e6, 1),
        "redis_cpu_us_per_turn": round(redis / done * 1e6, 1),
        "total_cpu_us_per_turn": round((cpu + redis) / done * 1e6, 1),
    }


async def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for durable in ("redis", "sqlite"):
            for sessions in (1, 50):
                for cluster in (True, False):
                    url = args.cluster_url if cluster else args.redis_url
                    result = await measure(url, cluster, durable, sessions, args.turns, Path(tmp))
                    print(
                        f"{result['deployment']:>20} {result['pairing']:>13} "
                        f"{sessions:>3} sessions: {result['turns_per_s']:8.1f} turns/s, "
                        f"client {result['client_cpu_us_per_turn']:7.1f} µs, "
                        f"redis {result['redis_cpu_us_per_turn']:7.1f} µs CPU/turn",
                        flush=True,
                    )
                    results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True, help="one standalone redis-server")
    parser.add_argument("--cluster-url", required=True, help="a node of the Redis Cluster")
    parser.add_argument("--turns", type=int, default=1000, help="turns per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS / "redis_cluster.json")
    args = parser.parse_args()
    results = asyncio.run(collect(args))
    write_results(args.out, results, turns_per_measurement=args.turns)


if __name__ == "__main__":
    main()
