"""SQLite writes of the turn path (issue #8): CPU per write, one session alone and many
sessions at once.

* ``--what direct``: one session appends turn after turn (``--sessions`` × ``--rounds``
  appends), each alone, so each runs directly on the caller's thread with a commit of its
  own (the one-session path of ``bench/turn_cpu.py``).
* ``--what append``: ``--sessions`` sessions each append one turn, all in one event-loop
  turn, so the appends reach the file's worker thread as one batch and commit in one
  transaction (as with many concurrent sessions in ``bench/turns.py``).
* ``--what index``: one recall-index upsert of one turn document per session, each session
  of its own user (what the background indexes when many sessions write at once: one
  chunk on the worker thread holding many users' documents).

Each repeats ``--rounds`` times. Reported: CPU time per write of the worker thread
(``tiermem-sqlite``), of the other threads (the event loop) and of the process
(``time.process_time``), so old and new code can be compared on the same load::

    PYTHONPATH=src:bench .venv/bin/python bench/sqlite_group_commit.py [--what index]

Run the old tree the same way with its own ``PYTHONPATH`` and alternate the two: the
machine is shared, so pair runs and quote ranges. Writes
``bench/results/sqlite_group_commit.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.models import NewTurn, TextBlock
from tiermem.store.backends.sqlite import SQLiteDurableStore
from workload import MESSAGES, RESULTS, write_results


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads: the SQLite worker's and the others'."""
    totals = {"sqlite": 0.0, "other": 0.0}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):
            continue
        totals["sqlite" if thread.name.startswith("tiermem-sqlite") else "other"] += seconds
    return totals


async def measure(what: str, sessions: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteDurableStore(Path(tmp) / "bench.db")
        index = SQLiteIndex(Path(tmp) / "bench.db")
        ids = [f"s-{i}" for i in range(sessions)]
        now = datetime.now(UTC)
        expires = now + timedelta(hours=24)  # the default durable_ttl: expiring turns
        turns = [
            NewTurn(role="user", content=(TextBlock(text=text),), timestamp=now)
            for text in MESSAGES
        ]

        async def round_(n: int) -> None:
            if what == "direct":
                for i in range(sessions):
                    turn = turns[(n + i) % len(turns)]
                    await store.append_turns("s-direct", [turn], expires_at=expires)
                return
            if what == "index":
                text = MESSAGES[n % len(MESSAGES)]
                await index.upsert(
                    [
                        IndexedDoc(
                            user_id=f"user-{sid}",
                            doc_id=f"{sid}#{n}",
                            kind="turn",
                            text=text,
                            created_at=now,
                            expires_at=expires,
                        )
                        for sid in ids
                    ]
                )
                return
            turn = turns[n % len(turns)]
            await asyncio.gather(
                *(store.append_turns(sid, [turn], expires_at=expires) for sid in ids)
            )

        try:
            for n in range(20):  # open the file, warm the caches
                await round_(n)
            before, cpu0, wall0 = _thread_cpu(), time.process_time(), time.perf_counter()
            transactions0 = store._db.transactions
            for n in range(rounds):
                await round_(n)
            after, cpu, wall = (
                _thread_cpu(),
                time.process_time() - cpu0,
                time.perf_counter() - wall0,
            )
            transactions = store._db.transactions - transactions0
        finally:
            await index.aclose()
            await store.aclose()
    appends = sessions * rounds
    return {
        "what": what,
        "sessions": sessions,
        "rounds": rounds,
        "cpu_us_per_write": round(cpu / appends * 1e6, 1),
        "cpu_us_per_write_by_thread": {
            role: round((after[role] - before[role]) / appends * 1e6, 1) for role in before
        },
        "writes_per_transaction": round(appends / max(transactions, 1), 1),
        "writes_per_s": round(appends / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", choices=["direct", "append", "index"], default="append")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "sqlite_group_commit.json")
    args = parser.parse_args()
    result = asyncio.run(measure(args.what, args.sessions, args.rounds))
    print(
        f"{args.what}, {args.sessions} sessions: {result['cpu_us_per_write']} µs CPU/write "
        f"{result['cpu_us_per_write_by_thread']}, "
        f"{result['writes_per_transaction']} writes/transaction, "
        f"{result['writes_per_s']} writes/s"
    )
    write_results(args.out, [result])


if __name__ == "__main__":
    main()
