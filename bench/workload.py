"""What the session benchmarks share: the chat lines they replay and how results are written.

Imported by the scripts in this folder (``python bench/<name>.py`` puts it on the path).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

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


def write_results(path: Path, results: list[dict[str, Any]], **extra: Any) -> None:
    """Write ``{"machine", "python", **extra, "results"}`` as JSON to ``path``."""
    report = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        **extra,
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
