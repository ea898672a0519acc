"""``bench/turn_cpu.py``'s plain turn on Redis + Redis (issue #8): ``add_turn`` then
``history()`` through the public API, background drained, on a service whose hot tier,
durable tier and search index share one Redis client. ``turn_cpu.py`` has only the
in-process pairings; this probe reuses its measurement loop with a Redis service::

    PYTHONPATH=src:bench python bench/redis_turn_cpu.py \
        --redis-url redis://127.0.0.1:6379/0 [--turns 2000] [--summaries] [--out FILE]

With ``--dynamodb-url`` the durable tier is DynamoDB (a new table on DynamoDB Local): a
Redis + DynamoDB service, as ``bench/turns.py`` builds it.

Prints the client's process CPU µs per turn (redis-server's CPU is not counted: see
``bench/turns.py`` for both). For instructions, run it under ``valgrind --tool=callgrind``
at two turn counts (e.g. 2500 and 500) and divide the difference by the difference in
turns (start-up and warm-up cancel out). Each run uses a fresh key prefix.
"""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path

import turn_cpu
from tiermem.runtime import run
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from workload import RESULTS, WORKLOADS, add_loop_argument, redis_dynamodb_settings, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--dynamodb-url", help="Redis + DynamoDB (DynamoDB Local's URL)")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--summaries", action="store_true")
    parser.add_argument("--workload", choices=WORKLOADS, default="bench")
    parser.add_argument("--out", type=Path, default=RESULTS / "redis_turn_cpu.json")
    add_loop_argument(parser)
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("--redis-url (or TIERMEM_TEST_REDIS_URL) is required")
    prefix = f"rtc{uuid.uuid4().hex[:6]}"

    pairing = "redis+dynamodb" if args.dynamodb_url else "redis+redis"
    if args.dynamodb_url:
        settings = run(
            redis_dynamodb_settings(args.redis_url, args.dynamodb_url, prefix),
            event_loop=args.loop,
        )
    else:
        settings = TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=args.redis_url,
            redis_prefix=prefix,
        )

    def service(pairing: str, tmp: Path, *, summaries: bool = False) -> MemoryService:
        return MemoryService.from_settings(settings, auto_summarize=summaries)

    turn_cpu._service = service  # the loop of turn_cpu.measure, on a Redis service
    result = run(
        turn_cpu.measure(pairing, args.turns, summaries=args.summaries, workload=args.workload),
        event_loop=args.loop,
    )
    print(
        f"{pairing} summaries={args.summaries} loop={args.loop}: "
        f"{result['cpu_us_per_turn']} µs CPU/turn"
    )
    write_results(args.out, [result], loop=args.loop)


if __name__ == "__main__":
    main()
