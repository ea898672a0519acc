"""Client-side cost of the Redis stores' turn path alone (issue #8): per turn, one
``append_through`` (an entity change on every third) and one ``load``, straight on the
stores, with no session, background work or summaries around them, so that instruction
counts under callgrind vary little from run to run::

    python bench/redis_client_path.py --redis-url redis://127.0.0.1:6379/0 --turns 1000

Prints process CPU µs per turn. For instructions, run it under
``valgrind --tool=callgrind`` at two turn counts and divide the difference by the
difference in turns (start-up cancels out).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from datetime import timedelta

from tiermem.clock import SystemClock
from tiermem.models import ActiveEntity, NewTurn
from tiermem.models.content import TextBlock
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.contract import EntityChange
from workload import MESSAGES


async def run(url: str, turns: int) -> float:
    clock = SystemClock()
    prefix = f"rcp{uuid.uuid4().hex[:6]}"
    hot = RedisHotStore.from_url(url, clock=clock, prefix=prefix)
    durable = RedisDurableStore(hot.client, clock=clock, prefix=prefix)
    session_id = "bench-session"
    try:

        async def one(i: int) -> None:
            now = clock.now()
            turn = NewTurn(
                role="user" if i % 2 == 0 else "assistant",
                content=(TextBlock(text=MESSAGES[i % len(MESSAGES)]),),
                timestamp=now,
                token_count=20,
            )
            change = None
            if i % 3 == 0:
                entity = ActiveEntity(kind="topic", value=f"v{i % 7}", turn_index=i, updated_at=now)
                change = EntityChange(upsert={"topic": entity})
            await hot.append_through(
                durable,
                session_id,
                [turn],
                window=50,
                hot_expires_at=now + timedelta(minutes=30),
                durable_expires_at=None,
                entities=change,
            )
            await hot.load(session_id)

        for i in range(60):  # scripts loaded, caches warm, the window full
            await one(i)
        cpu0 = time.process_time()
        for i in range(60, 60 + turns):
            await one(i)
        return (time.process_time() - cpu0) / turns * 1e6
    finally:
        await hot.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("no --redis-url (or TIERMEM_TEST_REDIS_URL)")
    print(f"cpu_us_per_turn {asyncio.run(run(args.redis_url, args.turns)):.1f}")


if __name__ == "__main__":
    main()
