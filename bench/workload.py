"""What the session benchmarks share: the chat lines they replay and how results are written.

Imported by the scripts in this folder (``python bench/<name>.py`` puts it on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Literal

from tiermem.settings import TierMemSettings
from tiermem.testing.conversations import generate_conversation

RESULTS = Path(__file__).parent / "results"

MESSAGES = [
    "Hello!",
    "I prefer seinen, nothing with horror please.",
    "Do you have Berserk vol 42 in stock?",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "Your order ORD-12345 ships tomorrow.",
    "ok thanks",
]
"""A manga-store conversation: greeting, a preference (EN and JA), entities, filler."""

WORKLOADS = ("bench", "conversation")
"""``bench``: :data:`MESSAGES` in turn, so every text recurs every six turns and any cache
keyed by text hits (the cheapest case). ``conversation``: generated conversations
(``tiermem.testing.conversations``: planted facts, corrections, tool calls with large
outputs), one after another, with hardly a repeated text (closer to a real session)."""


def workload_turns(workload: str, count: int) -> list[tuple[str, Any]]:
    """``count`` (role, content) pairs of ``workload`` (one of :data:`WORKLOADS`); the
    same pairs on every call. A ``conversation`` content may be a list of content blocks
    (text, tool calls, tool results)."""
    if workload == "bench":
        return [
            ("user" if i % 2 == 0 else "assistant", MESSAGES[i % len(MESSAGES)])
            for i in range(count)
        ]
    if workload == "conversation":
        out: list[tuple[str, Any]] = []
        seed = 11
        while len(out) < count:  # a long session: several generated conversations in a row
            conv = generate_conversation(seed, turns=300, facts=24, corrections=8)
            out += [(t.role, list(t.content)) for t in conv.turns]
            seed += 1
        return out[:count]
    raise SystemExit(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


_REFERENCE_LOOP = """
import time


def loop():
    start = time.process_time()
    total = 0
    for i in range(5_000_000):
        total += i
    return time.process_time() - start


print(round(min(loop() for _ in range(ROUNDS)) * 1000, 1))
"""


def reference_loop_ms(rounds: int = 5) -> float | None:
    """CPU time of a fixed pure-Python loop (5M additions), the best of ``rounds``, in ms.

    Recorded beside each run's results: the same code reads 20-40 % apart on two days of a
    shared machine (another host, other tenants), and this figure says how fast the day was,
    so µs figures from two days can be compared through it (instruction counts need no such
    correction). It runs in a fresh interpreter: in the bench's own process its cost would
    depend on the heap the run left (pymalloc's arena list), and a run under callgrind would
    count it (a child process is not traced unless asked). None if it cannot run.
    """
    code = _REFERENCE_LOOP.replace("ROUNDS", str(int(rounds)))
    try:
        done = subprocess.run(  # noqa: S603 -- our own interpreter and code
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        return float(done.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


LOOPS = ("asyncio", "uvloop")


def add_loop_argument(parser: argparse.ArgumentParser) -> None:
    """``--loop asyncio|uvloop``: the event loop the bench runs on (asyncio's by default, as
    every figure before session 22; ``tiermem serve`` and the other entry points take uvloop
    when it is installed, ``tiermem.runtime``)."""
    parser.add_argument(
        "--loop", choices=LOOPS, default="asyncio", help="the event loop (default: asyncio)"
    )


def loop_of_argv(argv: list[str] | None = None) -> Literal["asyncio", "uvloop"]:
    """The ``--loop`` of the command line, read before a loop starts (the rest of the
    arguments are the bench's own parser's)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_loop_argument(parser)
    loop: Literal["asyncio", "uvloop"] = parser.parse_known_args(argv)[0].loop
    return loop


def write_results(path: Path, results: list[dict[str, Any]], **extra: Any) -> None:
    """Write ``{"machine", "cpu_model", "reference_loop_ms", "python", **extra, "results"}``."""
    report = {
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "reference_loop_ms": reference_loop_ms(),
        "python": platform.python_version(),
        **extra,
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


async def redis_dynamodb_settings(
    redis_url: str, dynamodb_url: str, prefix: str, **extra: Any
) -> TierMemSettings:
    """Settings of a Redis + DynamoDB service on a new table of DynamoDB Local (``extra``:
    any other setting)."""
    from tiermem.store.backends.dynamodb import create_table

    # DynamoDB Local accepts any credentials; real ones are never needed here.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    table = f"tiermem-bench-{uuid.uuid4().hex[:6]}"
    await create_table(table, endpoint_url=dynamodb_url, region_name="us-east-1")
    return TierMemSettings(
        hot_backend="redis",
        durable_backend="dynamodb",
        redis_url=redis_url,
        redis_prefix=prefix,
        dynamodb_table=table,
        dynamodb_endpoint_url=dynamodb_url,
        aws_region="us-east-1",
        **extra,
    )
