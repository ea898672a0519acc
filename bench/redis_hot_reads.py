"""The hot read of a Redis session after each turn (issue #8), straight on the stores: per
turn one ``append_through`` (an entity change on every third, a state put on every tenth)
and one ``load``, by the writing store (``--reader same``: it holds the session as its
append left it) or by a second store, as another worker of the same service would
(``--reader other``: every read follows a write it did not see)::

    PYTHONPATH=src:bench python bench/redis_hot_reads.py --redis-url redis://127.0.0.1:6379/0 \\
        --turns 1000 --reader other

Prints process CPU µs per turn and the bytes the loads received per turn. For
instructions: the server's with ``bench/redis_hot_reads_callgrind.sh``, the client's by
running this under ``valgrind --tool=callgrind``; each at two turn counts, the difference
divided by the difference in turns (start-up and warm-up cancel out). Besides the
stores' API it touches only their snapshot cache's ``loaded`` (wrapped, to count the
bytes), so it runs against a former tree as well (its ``src`` first on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from datetime import timedelta
from typing import Any

from tiermem.clock import SystemClock
from tiermem.models import ActiveEntity, NewTurn
from tiermem.models.content import TextBlock
from tiermem.store.backends.redis import RedisDurableStore, RedisHotStore
from tiermem.store.contract import EntityChange
from workload import MESSAGES


def _size(reply: Any) -> int:
    if isinstance(reply, bytes):
        return len(reply)
    if isinstance(reply, list):
        return sum(_size(part) for part in reply)
    return 0


async def run(url: str, turns: int, reader_kind: str) -> tuple[float, float]:
    clock = SystemClock()
    prefix = f"rhr{uuid.uuid4().hex[:6]}"
    hot = RedisHotStore.from_url(url, clock=clock, prefix=prefix)
    durable = RedisDurableStore(hot.client, clock=clock, prefix=prefix)
    reader = hot
    if reader_kind == "other":
        reader = RedisHotStore.from_url(url, clock=clock, prefix=prefix)
    received = 0
    cache = reader._snapshots
    inner = cache.loaded

    def counted(session_id: str, cached: Any, reply: Any) -> Any:
        nonlocal received
        received += _size(reply)
        return inner(session_id, cached, reply)

    cache.loaded = counted  # type: ignore[method-assign]
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
            expires = now + timedelta(minutes=30)
            await hot.append_through(
                durable,
                session_id,
                [turn],
                window=50,
                hot_expires_at=expires,
                durable_expires_at=None,
                entities=change,
            )
            if i % 10 == 0:
                await hot.put_state(session_id, "task", {"step": i}, expires_at=expires)
            await reader.load(session_id)

        for i in range(60):  # scripts loaded, caches warm, the window full
            await one(i)
        received = 0
        cpu0 = time.process_time()
        for i in range(60, 60 + turns):
            await one(i)
        return (time.process_time() - cpu0) / turns * 1e6, received / turns
    finally:
        if reader is not hot:
            await reader.aclose()
        await hot.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--reader", choices=["same", "other"], default="other")
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("no --redis-url (or TIERMEM_TEST_REDIS_URL)")
    cpu, received = asyncio.run(run(args.redis_url, args.turns, args.reader))
    print(f"cpu_us_per_turn {cpu:.1f} load_bytes_per_turn {received:.0f}")


if __name__ == "__main__":
    main()
