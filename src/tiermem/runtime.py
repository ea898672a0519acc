"""Process-level tuning for a long-running tiermem process.

:func:`freeze_startup_heap` moves every object alive now (imported modules, pydantic
schemas, the tokenizer's tables, the service's clients) out of the garbage collector's
view, so a full collection later only walks what the process allocated since. Without
it a full collection in a service walks ~50,000 start-up objects: 15–20 ms of CPU on a
quiet core and 90–150 ms of pause on a loaded one, which is what set the embedded
default's p99 at 50 concurrent sessions (~100 ms with, ~20 ms without; ``bench/turns.py
--gc-freeze``). The library never calls it on import: the collector is the application's.
``tiermem serve`` and ``tiermem mcp`` call it once their app is built.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect once, then freeze the survivors (:func:`gc.freeze`); returns how many
    objects were frozen. Call it once, after start-up (imports done, the service built)
    and before serving; frozen objects are never collected, so do not call it in a loop
    (``gc.unfreeze()`` undoes it)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
