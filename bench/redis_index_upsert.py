"""redis-server's cost of the search index's upsert script (issue #8), alone.

Indexes the benchmark conversation's turns as a session indexes them (one document per
turn with its date terms, expiring, ``--batch`` documents per upsert as the background
batches them) into a fresh user of a :class:`~tiermem.longterm.index_redis.RedisIndex`,
and reports per script call and per document: ``EVALSHA`` µs inside Redis (``INFO
commandstats``) and redis-server CPU (``INFO cpu``), over ``--rounds`` rounds. Run the
former and the current code alternately to compare (the script is told apart by its SHA,
so both can run against one server)::

    PYTHONPATH=src:bench python bench/redis_index_upsert.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from tiermem.longterm.index_redis import RedisIndex
from tiermem.longterm.recall import turn_docs
from tiermem.models import Turn
from tiermem.testing.backend import text_turn
from workload import MESSAGES, RESULTS, write_results


def turns(count: int) -> list[Turn]:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    return [
        text_turn(
            MESSAGES[i % len(MESSAGES)],
            role="user" if i % 2 == 0 else "assistant",
            at=start + timedelta(seconds=i),
        ).with_index(i)
        for i in range(count)
    ]


async def server(url: str) -> tuple[int, int, float]:
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        cpu = await client.info("cpu")
    finally:
        await client.aclose()
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return (
        int(evalsha["calls"]),
        int(evalsha["usec"]),
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    index = RedisIndex.from_url(args.redis_url, prefix=f"bench{uuid.uuid4().hex[:6]}")
    expires = datetime(2031, 1, 1, tzinfo=UTC)
    history = turns(args.docs)
    rounds = []
    try:
        for r in range(args.rounds):
            docs = turn_docs(f"user{r}", "01M82ZQ9WEDFQP5WG85NH3BTAB", history, expires_at=expires)
            batches = [docs[i : i + args.batch] for i in range(0, len(docs), args.batch)]
            calls0, usec0, cpu0 = await server(args.redis_url)
            client0 = time.process_time()
            for batch in batches:
                await index.upsert(batch)
            client = time.process_time() - client0
            calls1, usec1, cpu1 = await server(args.redis_url)
            calls = calls1 - calls0
            rounds.append(
                {
                    "script_calls": calls,
                    "evalsha_us_per_call": round((usec1 - usec0) / calls, 1),
                    "evalsha_us_per_doc": round((usec1 - usec0) / len(docs), 2),
                    "server_cpu_us_per_doc": round((cpu1 - cpu0) / len(docs) * 1e6, 2),
                    "client_cpu_us_per_doc": round(client / len(docs) * 1e6, 2),
                }
            )
    finally:
        await index.aclose()
    return {"docs": args.docs, "batch": args.batch, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--docs", type=int, default=1200, help="documents per round")
    parser.add_argument("--batch", type=int, default=8, help="documents per upsert")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("pass --redis-url or set TIERMEM_TEST_REDIS_URL")
    result = asyncio.run(run(args))
    for row in result["rounds"]:
        print(row)
    if args.out:
        write_results(RESULTS / args.out, [result])


if __name__ == "__main__":
    main()
