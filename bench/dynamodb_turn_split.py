"""Where a Redis + DynamoDB turn's client CPU goes (issue #8).

Two measurements on one session, add_turn then history() per turn, summaries on (as
``bench/turns.py`` does), the background drained only at the end so that background record
writes and appends cross as they do in a service:

* **requests per turn by operation** (``dynamodb:<Operation>``, ``redis``...), counted at
  the clients' doors (:class:`tiermem.testing.round_trips.RoundTrips`), and the process
  CPU per turn (no counting wrapper active);
* **CPU per DynamoDB request**, by itself: GetItem of a missing key and a TransactWriteItems
  of two small puts, through :class:`~tiermem.store.backends.dynamodb_table.DynamoDBTable`
  (botocore serialise, endpoint resolution, SigV4, aiohttp, parse).

Needs the servers: run it under ``scripts/test.sh`` (``TIERMEM_TEST_SERVICES_ONLY=1``), e.g.
``PYTHONPATH=src:bench .venv/bin/python bench/dynamodb_turn_split.py --turns 400``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import turns as bench_turns
from tiermem.store.backends.dynamodb_table import DynamoDBTable, create_table
from tiermem.testing.round_trips import RoundTrips


async def turn_split(servers: bench_turns.Servers, turns: int) -> dict[str, Any]:
    """Requests per turn by operation, and the process CPU per turn (a separate run)."""
    result: dict[str, Any] = {}
    for counting in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            service = await bench_turns.open_service(servers, "redis+dynamodb", Path(tmp), True)
            async with service as memory:
                await bench_turns.warm(memory)
                session = await memory.session(user_id="bench-split")
                await bench_turns.turn(session, 0)
                trips = RoundTrips()
                cpu0 = time.process_time()
                if counting:
                    with trips.counting():
                        for i in range(turns):
                            await bench_turns.turn(session, i)
                        await memory.drain()
                    result["requests_per_turn"] = {
                        k: round(v / turns, 3) for k, v in sorted(trips.counts.items())
                    }
                else:
                    for i in range(turns):
                        await bench_turns.turn(session, i)
                    await memory.drain()
                    cpu = time.process_time() - cpu0
                    result["cpu_us_per_turn"] = round(cpu / turns * 1e6, 1)
    dynamodb = sum(v for k, v in result["requests_per_turn"].items() if k.startswith("dynamodb"))
    result["dynamodb_requests_per_turn"] = round(dynamodb, 3)
    return result


async def request_cpu(url: str, requests: int) -> dict[str, float]:
    """CPU µs per request of two request shapes, through the store's one client door."""
    name = "split" + secrets.token_hex(4)
    await create_table(name, endpoint_url=url, region_name="us-east-1")
    table = DynamoDBTable(name, endpoint_url=url, region_name="us-east-1")

    def item(i: int) -> dict[str, Any]:
        return {"pk": {"S": "S#x"}, "sk": {"S": f"T#{i:08d}"}, "d": {"S": "hello " * 40}}

    async def get_item(i: int) -> None:
        await table.call("get_item", TableName=name, Key={"pk": {"S": "S#x"}, "sk": {"S": "M"}})

    async def transact_two_puts(i: int) -> None:
        puts = [{"Put": {"TableName": name, "Item": item(2 * i + j)}} for j in (0, 1)]
        await table.call("transact_write_items", TransactItems=puts)

    out: dict[str, float] = {}
    ops: tuple[Callable[[int], Awaitable[None]], ...] = (get_item, transact_two_puts)
    try:
        for op in ops:
            for i in range(50):  # warm: connection, models, caches
                await op(i)
            cpu0 = time.process_time()
            for i in range(requests):
                await op(i)
            out[f"{op.__name__}_cpu_us"] = round((time.process_time() - cpu0) / requests * 1e6)
    finally:
        await table.aclose()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--dynamodb-url", default=os.environ.get("TIERMEM_TEST_DYNAMODB_URL"))
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON")
    args = parser.parse_args()
    if not args.redis_url or not args.dynamodb_url:
        parser.error("needs --redis-url and --dynamodb-url (or run under scripts/test.sh)")
    servers = bench_turns.Servers(args.redis_url, args.dynamodb_url)
    result = await turn_split(servers, args.turns)
    result |= await request_cpu(args.dynamodb_url, args.requests)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
