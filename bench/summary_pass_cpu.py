"""CPU of the automatic summary passes alone, at the cadence a background pass runs, and a
digest of everything they wrote (issue #8).

Turns are added with automatic summaries off; after every turn at which the background
would find a pass due (20 unsummarized turns, 6 kept raw: one pass per 14 turns), the
pass runs inline exactly as the background runs it (``SummaryJobs.run`` with the turn
count the appends reported), so it uses the same in-process caches. Only the passes' CPU
(``time.process_time``: every thread, SQLite's included) is counted.

Workloads: ``bench`` (``bench/workload.py``'s messages, what ``bench/turn_cpu.py`` adds)
and ``conversation`` (a generated conversation: planted facts, corrections, tool calls
with large outputs). After each pass the summary and structured records (timestamps
left out) go into a SHA-256 digest, so old and new code can be compared byte for byte::

    PYTHONPATH=src:bench .venv/bin/python bench/summary_pass_cpu.py \
        [--pairing embedded] [--workload bench] [--turns 3000] [--dump passes.jsonl]

Instruction counts (steadier than CPU time on a shared machine): run it under
``valgrind --tool=callgrind`` with and without ``--no-passes`` and subtract.

Prints one JSON line per pairing and workload (``--out`` writes them as a results file).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from turn_cpu import _service as turn_cpu_service
from workload import workload_turns, write_results

FIRST_PASS = 20
"""Turns before the first pass is due (``every_turns``)."""
PASS_STRIDE = 14
"""Turns between passes: ``every_turns`` minus the 6 turns kept raw."""


def _service(pairing: str, tmp: Path) -> MemoryService:
    return turn_cpu_service(pairing, tmp)  # passes are run by hand here, not in the background


def _timeless(value: Any) -> Any:
    """``value`` without the fields that differ run to run: wall-clock times and the job
    key (it names the session, whose id is random)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_at") and k != "job"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


async def measure(
    pairing: str, workload: str, count: int, dump: Path | None = None, *, passes_on: bool = True
) -> dict[str, Any]:
    digest = hashlib.sha256()
    passes = 0
    cpu = 0.0
    dump_file = dump.open("a", encoding="utf-8") if dump else None
    with tempfile.TemporaryDirectory() as tmp:
        async with _service(pairing, Path(tmp)) as memory:
            session = await memory.session(user_id="bench-passes")
            jobs = memory.summaries
            for n, (role, content) in enumerate(workload_turns(workload, count), start=1):
                await session.add_turn(role, content)
                if not passes_on or n < FIRST_PASS or (n - FIRST_PASS) % PASS_STRIDE:
                    continue
                await memory.drain()
                cpu0 = time.process_time()
                outcome = await jobs.run(session.id, next_index=n)
                cpu += time.process_time() - cpu0
                passes += 1
                summary = await jobs.durable.get_record(session.id, "summary")
                structured = await jobs.durable.get_record(session.id, "structured")
                row = {
                    "n": n,
                    "outcome": outcome.value,
                    "summary": _timeless(summary.data) if summary else None,
                    "structured": _timeless(structured.data) if structured else None,
                }
                line = json.dumps(row, sort_keys=True, ensure_ascii=False)
                digest.update(line.encode())
                if dump_file:
                    dump_file.write(line + "\n")
    if dump_file:
        dump_file.close()
    return {
        "pairing": pairing,
        "workload": workload,
        "turns": count,
        "passes": passes,
        "pass_cpu_us_per_turn": round(cpu / count * 1e6, 1),
        "cpu_us_per_pass": round(cpu / max(passes, 1) * 1e6, 1),
        "digest": digest.hexdigest(),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--pairing", action="append")
    parser.add_argument("--workload", action="append")
    parser.add_argument("--dump", type=Path, help="append each pass's records as JSON lines")
    parser.add_argument("--out", type=Path, help="write the results here")
    parser.add_argument(
        "--no-passes",
        action="store_true",
        help="add the turns only: the baseline to subtract from a callgrind count of a run",
    )
    args = parser.parse_args()
    results = []
    for pairing in args.pairing or ["embedded", "memory+memory"]:
        for workload in args.workload or ["bench", "conversation"]:
            result = await measure(
                pairing, workload, args.turns, args.dump, passes_on=not args.no_passes
            )
            print(json.dumps(result))
            results.append(result)
    if args.out:
        await asyncio.to_thread(write_results, args.out, results)


if __name__ == "__main__":
    asyncio.run(main())
