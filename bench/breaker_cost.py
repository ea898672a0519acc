"""What a circuit-breaker check costs on the hot path: a closed, healthy tool.

For each hot store, ``SharedBreakers.check`` + ``record_success`` is run N times and we
report process CPU per check (``time.process_time``: every thread), wall time, shared-
keyspace calls per check, and, on Redis, the commands the server actually executed
(``INFO commandstats`` before and after, minus the INFO calls themselves). The same is
measured for a whole ``ToolDispatcher.call`` of a trivial in-process tool, to show the
tracking overhead around the check. Writes ``bench/results/breaker_cost.json``::

    python bench/breaker_cost.py [--checks 20000]

Stores: ``memory`` (the embedded default's hot tier) and ``redis`` when
``TIERMEM_TEST_REDIS_URL`` is set (scripts/test.sh exports it:
``TIERMEM_TEST_SERVICES_ONLY=1 TIERMEM_TEST_SKIP_INSTALL=1 scripts/test.sh \
.venv/bin/python bench/breaker_cost.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tiermem.models import JsonValue, StateBlob
from tiermem.store.backends.memory import MemoryHotStore
from tiermem.store.contract import HotStore
from tiermem.tools import (
    BreakerPolicy,
    FunctionInvoker,
    PartialSink,
    SharedBreakers,
    ToolDispatcher,
    ToolRegistry,
    ToolSpec,
)

RESULTS = Path(__file__).parent / "results"
POLICY = BreakerPolicy()


class CountingKeyspace:
    """Counts shared-keyspace calls on their way to the store."""

    def __init__(self, inner: HotStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    async def get_shared(self, name: str) -> StateBlob | None:
        self.calls["get_shared"] += 1
        return await self.inner.get_shared(name)

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        self.calls["put_shared"] += 1
        return await self.inner.put_shared(
            name, data, expires_at=expires_at, expected_version=expected_version
        )

    async def delete_shared(self, name: str) -> bool:
        self.calls["delete_shared"] += 1
        return await self.inner.delete_shared(name)


class RedisCommandCounter:
    """Commands the Redis server executed, from INFO commandstats."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self._client = aioredis.from_url(url)

    async def total(self) -> int:
        stats = await self._client.info("commandstats")
        return sum(
            int(value["calls"])
            for key, value in stats.items()
            if key.startswith("cmdstat_") and key != "cmdstat_info"
        )

    async def aclose(self) -> None:
        await self._client.aclose()


async def _ok(arguments: Mapping[str, JsonValue], emit: PartialSink) -> str:
    return "ok"


async def measure(store_name: str, hot: HotStore, checks: int, url: str | None) -> dict[str, Any]:
    keyspace = CountingKeyspace(hot)
    breakers = SharedBreakers(keyspace, namespace=f"bench{uuid.uuid4().hex[:6]}")
    registry = ToolRegistry()
    registry.register(ToolSpec("search"), FunctionInvoker({"search": _ok}))
    tools = ToolDispatcher(registry, breakers)
    counter = RedisCommandCounter(url) if url else None
    try:
        for _ in range(200):  # warm up connections, caches, code paths
            permit = await breakers.check("search", POLICY)
            await breakers.record_success(permit, POLICY)
            await tools.call("search")

        keyspace.calls.clear()
        commands0 = await counter.total() if counter else 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(checks):
            permit = await breakers.check("search", POLICY)
            await breakers.record_success(permit, POLICY)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        commands = (await counter.total() - commands0) if counter else None
        check_calls = dict(keyspace.calls)

        keyspace.calls.clear()
        cpu1 = time.process_time()
        wall1 = time.perf_counter()
        calls = max(1, checks // 4)
        for _ in range(calls):
            await tools.call("search", {"q": "Berserk"})
        call_cpu, call_wall = time.process_time() - cpu1, time.perf_counter() - wall1
        call_calls = dict(keyspace.calls)
    finally:
        if counter:
            await counter.aclose()
    return {
        "store": store_name,
        "checks": checks,
        "check_cpu_us": round(cpu / checks * 1e6, 2),
        "check_wall_us": round(wall / checks * 1e6, 2),
        "check_store_calls": {k: round(v / checks, 3) for k, v in check_calls.items()},
        "check_redis_commands": None if commands is None else round(commands / checks, 3),
        "dispatch_calls": calls,
        "dispatch_cpu_us": round(call_cpu / calls * 1e6, 2),
        "dispatch_wall_us": round(call_wall / calls * 1e6, 2),
        "dispatch_store_calls": {k: round(v / calls, 3) for k, v in call_calls.items()},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checks", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=RESULTS / "breaker_cost.json")
    args = parser.parse_args()
    results = []
    memory = MemoryHotStore()
    results.append(await measure("memory", memory, args.checks, None))
    await memory.aclose()
    url = os.environ.get("TIERMEM_TEST_REDIS_URL")
    if url:
        from tiermem.store.backends.redis_hot import RedisHotStore

        redis_store = RedisHotStore.from_url(url, prefix=f"bench{uuid.uuid4().hex[:6]}")
        try:
            results.append(await measure("redis", redis_store, args.checks, url))
        finally:
            await redis_store.aclose()
    else:
        print("TIERMEM_TEST_REDIS_URL is not set: Redis skipped (see the module docstring)")
    for r in results:
        print(
            f"{r['store']:>7}: check {r['check_cpu_us']} us CPU, {r['check_wall_us']} us wall, "
            f"store calls {r['check_store_calls']}, redis commands {r['check_redis_commands']}; "
            f"dispatch {r['dispatch_cpu_us']} us CPU, {r['dispatch_wall_us']} us wall"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "results": results,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
