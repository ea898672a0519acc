"""Statements of a durable append in SQLite (issue #8): does fewer statements cost less?

A write-through turn's durable append runs ``BEGIN IMMEDIATE``, a read of the session's
header (joined with the idempotency key), the insert of the turn, an upsert of the header
and ``COMMIT``. This compares, on a real file in WAL mode with ``synchronous=NORMAL`` and
the tiermem schema, CPU time per append (``time.process_time``) of:

* ``select_upsert``: the statements the store runs (the turn inserted with
  ``executemany``);
* ``select_upsert_execute``: the same with ``execute`` for the one turn;
* ``update_returning``: one ``UPDATE sessions SET next_index = next_index + ? ...
  RETURNING next_index`` (lifetime, liveness and expected index checked in its WHERE)
  instead of the read and the upsert;
* ``update_returning_key``: the same, with the idempotency key checked in the WHERE
  (``NOT EXISTS``);
* ``insert_only`` / ``header_only`` / ``empty``: the turn's insert alone, the header's
  update alone, and an empty write transaction: where the time goes.

Variants alternate in rounds of 1,024 appends (a passive checkpoint every 256, as the
store's direct writes get), so a loaded machine blurs them all alike; the JSON gives each
round. Run::

    .venv/bin/python bench/sqlite_append_statements.py [--rounds 12]

What it showed (2 cores, load 5-15): every full variant within 1 µs of the others, about
41 µs per append, of which about 5 µs is the empty transaction and most of the rest the
commit writing the four pages an append dirties (the turns table, its primary key, its
expiry index and the sessions row) to the WAL, checksums included; each statement itself
costs 2-5 µs. Instruction counts (callgrind) agreed: ``update_returning`` +5 %,
``select_upsert_execute`` +0.5 %.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from tiermem.store.backends.sqlite._open import open_worker_connection
from workload import RESULTS, write_results

ROUND = 1024
CHECKPOINT_EVERY = 256
NOW_US = 1_700_000_000_000_000
EXPIRES_US = NOW_US + 10**12
SESSION = "s-1"
PAYLOAD = '{"role":"user","content":"' + "x" * 300 + '","index":%d}'

READ = (
    "SELECT s.next_index, s.expires_at_us, k.first_index, k.turn_count "
    "FROM sessions AS s LEFT JOIN idempotency_keys AS k "
    "ON k.session_id = s.session_id AND k.idempotency_key = ? WHERE s.session_id = ?"
)
INSERT = "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)"
UPSERT = (
    "INSERT INTO sessions (session_id, next_index, expires_at_us) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET next_index = excluded.next_index, "
    "expires_at_us = excluded.expires_at_us"
)
_UPDATE = (
    "UPDATE sessions SET next_index = next_index + ?1, expires_at_us = CASE "
    "WHEN expires_at_us IS NULL OR ?2 IS NULL THEN NULL ELSE max(expires_at_us, ?2) END "
    "WHERE session_id = ?3 AND (expires_at_us IS NULL OR expires_at_us > ?4) "
    "AND (?5 IS NULL OR next_index = ?5)"
)
UPDATE_RETURNING = _UPDATE + " RETURNING next_index"
UPDATE_RETURNING_KEY = (
    _UPDATE + " AND NOT EXISTS (SELECT 1 FROM idempotency_keys "  # noqa: S608 -- constants
    "WHERE session_id = ?3 AND idempotency_key = ?6) RETURNING next_index"
)


def variants(conn: sqlite3.Connection) -> dict[str, Callable[[int], None]]:
    """Each variant appends the turn at index ``n`` (the session's next index)."""

    def select_upsert(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(READ, (None, SESSION)).fetchone()
        start = row[0]
        conn.executemany(INSERT, [(SESSION, start, PAYLOAD % start, EXPIRES_US)])
        conn.execute(UPSERT, (SESSION, start + 1, max(row[1], EXPIRES_US)))
        conn.execute("COMMIT")

    def select_upsert_execute(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(READ, (None, SESSION)).fetchone()
        start = row[0]
        conn.execute(INSERT, (SESSION, start, PAYLOAD % start, EXPIRES_US))
        conn.execute(UPSERT, (SESSION, start + 1, max(row[1], EXPIRES_US)))
        conn.execute("COMMIT")

    def update_returning(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(UPDATE_RETURNING, (1, EXPIRES_US, SESSION, NOW_US, n)).fetchone()
        start = row[0] - 1
        conn.execute(INSERT, (SESSION, start, PAYLOAD % start, EXPIRES_US))
        conn.execute("COMMIT")

    def update_returning_key(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        bound = (1, EXPIRES_US, SESSION, NOW_US, n, None)
        row = conn.execute(UPDATE_RETURNING_KEY, bound).fetchone()
        start = row[0] - 1
        conn.execute(INSERT, (SESSION, start, PAYLOAD % start, EXPIRES_US))
        conn.execute("COMMIT")

    def insert_only(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT, (SESSION, n, PAYLOAD % n, EXPIRES_US))
        conn.execute("UPDATE sessions SET next_index = ? WHERE session_id = ?", (n + 1, SESSION))
        conn.execute("COMMIT")

    def header_only(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(UPDATE_RETURNING, (0, EXPIRES_US, SESSION, NOW_US, None)).fetchone()
        conn.execute("COMMIT")

    def empty(n: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")

    return {
        "select_upsert": select_upsert,
        "select_upsert_execute": select_upsert_execute,
        "update_returning": update_returning,
        "update_returning_key": update_returning_key,
        "insert_only": insert_only,
        "header_only": header_only,
        "empty": empty,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=str, default=str(RESULTS / "sqlite_append_statements.json"))
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="tiermem-bench-"), "append.db")
    conn = open_worker_connection(path, timedelta(seconds=5), "NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints every 256, as below
    conn.execute(
        "INSERT INTO sessions (session_id, next_index, expires_at_us) VALUES (?, 0, ?)",
        (SESSION, EXPIRES_US),
    )
    runs = variants(conn)
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, append in runs.items():
            (n,) = conn.execute(
                "SELECT next_index FROM sessions WHERE session_id = ?", (SESSION,)
            ).fetchone()
            started = time.process_time()
            for i in range(ROUND):
                append(n + i)
                if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            per_round[name].append((time.process_time() - started) / ROUND * 1e6)
    conn.close()
    results = []
    for name, rounds in per_round.items():
        results.append(
            {
                "variant": name,
                "cpu_us_per_append_min": round(min(rounds), 1),
                "cpu_us_per_append_median": round(statistics.median(rounds), 1),
                "rounds": [round(value, 1) for value in rounds],
            }
        )
        print(f"{name:22s} min {min(rounds):6.1f}  median {statistics.median(rounds):6.1f} µs")
    write_results(
        Path(args.out),
        results,
        load_average_1_5_15=list(os.getloadavg()),
        appends_per_round=ROUND,
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
