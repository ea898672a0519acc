"""Where redis-server's CPU goes per turn of a Redis + Redis service (issue #8).

With ``--dynamodb-url`` the durable tier is DynamoDB (Redis + DynamoDB), and the same
figures are the Redis hot tier's alone.

Runs one session's turns (``add_turn`` then ``history()``, background drained, summaries
on as in a default service) and reports per turn:

* the server's CPU (``INFO cpu``: ``used_cpu_user`` + ``used_cpu_sys``) and the client
  process's CPU;
* ``INFO commandstats`` deltas, calls and µs per command (a script's inner commands are
  counted under their own names and inside ``evalsha``'s total);
* per script, by its name in the library, calls and µs, read from the ``SLOWLOG`` with a
  threshold of 0 µs (an ``EVALSHA`` entry's SHA names the script; Redis 7 also logs the
  commands a script runs, under their own names). Logging every command costs the server
  too, so use this split for shares, and ``--no-slowlog`` for totals.

It changes the server's slowlog settings for the run and restores them: use a private
server, with nothing else running against it::

    PYTHONPATH=src:bench python bench/redis_commandstats.py \
        --redis-url redis://127.0.0.1:6379/0 [--turns 2000] [--out redis_commandstats.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from workload import MESSAGES, RESULTS, redis_dynamodb_settings, write_results


async def commandstats(url: str) -> tuple[dict[str, tuple[int, int]], float]:
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        cpu = await client.info("cpu")
    finally:
        await client.aclose()
    out = {}
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        out[name] = (int(value["calls"]), int(value["usec"]))
    return out, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def script_names() -> dict[str, str]:
    """sha1 → script name, for every LuaScript the library defines."""
    import importlib

    from tiermem.store.backends.redis_scripts import LuaScript

    names: dict[str, str] = {}
    for module in (
        "tiermem.store.backends.redis_scripts",
        "tiermem.longterm.index_redis_scripts",
        "tiermem.store.backends.redis_append",
        "tiermem.store.backends.redis_hot",
        "tiermem.store.backends.redis_durable",
    ):
        mod = importlib.import_module(module)
        for value in vars(mod).values():
            if isinstance(value, LuaScript):
                names[value.sha] = value.name
    return names


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    if args.dynamodb_url:
        settings = await redis_dynamodb_settings(
            args.redis_url, args.dynamodb_url, prefix, index_linger_ms=args.index_linger_ms
        )
    else:
        settings = TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=args.redis_url,
            redis_prefix=prefix,
            index_linger_ms=args.index_linger_ms,
        )
    async with MemoryService.from_settings(settings, auto_summarize=args.summaries) as memory:
        assert memory.after_append.linger == args.index_linger_ms / 1000
        warm = await memory.session(user_id="cs-warm")
        for i in range(50):
            await warm.add_turn("user" if i % 2 == 0 else "assistant", MESSAGES[i % len(MESSAGES)])
            await warm.history()
        await memory.drain()
        session = await memory.session(user_id="cs-user")
        admin = Redis.from_url(args.redis_url)
        saved = await admin.config_get("slowlog-*")
        await admin.config_set("slowlog-max-len", str(args.turns * 40))
        if args.slowlog:
            await admin.config_set("slowlog-log-slower-than", "0")
        await admin.slowlog_reset()
        before, cpu0 = await commandstats(args.redis_url)
        client0 = time.process_time()
        for i in range(args.turns):
            await session.add_turn(
                "user" if i % 2 == 0 else "assistant", MESSAGES[i % len(MESSAGES)]
            )
            await session.history()
        await memory.drain()
        client = time.process_time() - client0
        after, cpu1 = await commandstats(args.redis_url)
        log = await admin.execute_command("SLOWLOG", "GET", "-1")
        for key, value in saved.items():
            await admin.config_set(key, value)
        await admin.aclose()
    turns = args.turns
    names = script_names()
    by_script: Counter[str] = Counter()
    usec_by_script: Counter[str] = Counter()
    for entry in log:
        argv = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in entry[3]]
        if not argv:
            continue
        cmd = argv[0].lower()
        if cmd in ("info", "slowlog", "config"):
            continue
        name = names.get(argv[1], argv[1][:8]) if cmd == "evalsha" else cmd
        by_script[name] += 1
        usec_by_script[name] += int(entry[2])
    rows: dict[str, dict[str, float]] = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0 <= 0:
            continue
        rows[name] = {
            "calls_per_turn": round((calls - c0) / turns, 3),
            "usec_per_turn": round((usec - u0) / turns, 2),
        }
    # info commands of this bench itself are counted too: drop them.
    rows.pop("info", None)
    return {
        "pairing": "redis+dynamodb" if args.dynamodb_url else "redis+redis",
        "turns": turns,
        "summaries": args.summaries,
        "index_linger_ms": args.index_linger_ms,
        "client_cpu_us_per_turn": round(client / turns * 1e6, 1),
        "redis_server_cpu_us_per_turn": round((cpu1 - cpu0) / turns * 1e6, 1),
        "top_level_per_turn": {
            name: {
                "calls": round(by_script[name] / turns, 3),
                "usec": round(usec_by_script[name] / turns, 2),
            }
            for name, _ in usec_by_script.most_common()
        },
        "commandstats_per_turn": dict(sorted(rows.items(), key=lambda kv: -kv[1]["usec_per_turn"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument(
        "--dynamodb-url", default=None, help="DynamoDB (Local) endpoint: Redis + DynamoDB"
    )
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument(
        "--index-linger-ms",
        type=float,
        default=5.0,
        help="the service's index_linger_ms setting (default 5, the library's default)",
    )
    parser.add_argument("--no-summaries", dest="summaries", action="store_false")
    parser.add_argument(
        "--no-slowlog",
        dest="slowlog",
        action="store_false",
        help="no per-script split (the slowlog's own cost inflates the server's CPU)",
    )
    parser.add_argument("--out", default=None, help="JSON file name under bench/results/")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    if args.out:
        write_results(RESULTS / args.out, [result])


if __name__ == "__main__":
    main()
