"""The SQLite part of an embedded turn alone (issue #8): the durable append and recall's
index upsert, as the service issues them, without the rest of the turn.

One session appends ``--turns`` turns one at a time through
:class:`~tiermem.store.backends.sqlite.SQLiteDurableStore` (a 24-hour retention, as the
service's default ``durable_ttl``, and an entity change on every third turn, as the
``bench`` workload gives), and every ``--index-every`` turns
:class:`~tiermem.longterm.index_sqlite.SQLiteIndex` indexes those turns' documents in one
upsert (the background queue gathers them so). Both share the file and its worker, as in
the service. Prints process CPU per turn (every thread); under callgrind, the difference of
two runs of different lengths divided by the difference of their turns is the
steady-state instructions per turn (``strace -c -f`` the same way gives the WAL writes)::

    .venv/bin/python bench/sqlite_turn_write.py [--turns 2000] [--index-every 5]
    valgrind --tool=callgrind .venv/bin/python bench/sqlite_turn_write.py --turns 500

``--no-index`` leaves the index out (the append alone). Measured at session 13 (no index):
424.5k instructions per append at 10b85d4, 414.6k with the parsed entities records kept
(``_durable._EntitiesCache``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.models import ActiveEntity, Entity, NewTurn, TextBlock
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.store.contract import EntityChange
from workload import MESSAGES

USER = "bench-user"
SESSION = "01M84Y7EC5A8H1DKB0G78YFEZN"
RETENTION = timedelta(hours=24)


def _turn(i: int, now: datetime) -> NewTurn:
    text = MESSAGES[i % len(MESSAGES)]
    entities = (Entity(kind="order_id", value="ORD-12345"),) if i % 6 == 4 else ()
    return NewTurn(
        role="user" if i % 2 == 0 else "assistant",
        content=(TextBlock(text=text),),
        timestamp=now,
        token_count=len(text) // 4 + 1,
        importance=0.5,
        entities=entities,
    )


def _change(i: int, now: datetime) -> EntityChange | None:
    if i % 3:
        return None
    entity = ActiveEntity(kind="order_id", value=f"ORD-{i % 7}", turn_index=i, updated_at=now)
    return EntityChange(upsert={"order_id": entity})


async def run(turns: int, index_every: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = SQLiteDurableStore(path)
        index = SQLiteIndex(path) if index_every else None
        try:
            warm = 50
            cpu0 = 0.0
            pending: list[IndexedDoc] = []
            for i in range(warm + turns):
                if i == warm:
                    cpu0 = time.process_time()
                now = datetime.now(UTC)
                [stored] = await store.append_turns(
                    SESSION, [_turn(i, now)], expires_at=now + RETENTION, entities=_change(i, now)
                )
                pending.append(
                    IndexedDoc(
                        user_id=USER,
                        doc_id=f"{SESSION}#{stored.index}",
                        kind="turn",
                        text=stored.text,
                        created_at=stored.timestamp,
                        expires_at=now + RETENTION,
                    )
                )
                if index is not None and len(pending) >= index_every:
                    await index.upsert(pending)
                    pending = []
                await asyncio.sleep(0)
            cpu = time.process_time() - cpu0
        finally:
            if index is not None:
                await index.aclose()
            await store.aclose()
    return {"turns": turns, "cpu_us_per_turn": round(cpu / turns * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--index-every", type=int, default=5)
    parser.add_argument("--no-index", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.turns, 0 if args.no_index else args.index_every))
    print(result)


if __name__ == "__main__":
    main()
