"""What the session benchmarks share: the chat lines they replay and how results are written.

Imported by the scripts in this folder (``python bench/<name>.py`` puts it on the path).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

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
