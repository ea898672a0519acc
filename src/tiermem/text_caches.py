"""The process's caches keyed by text, and one way to empty them after an erasure.

The rule engines, the search tokenizer, context assembly and the summary passes keep
analyses of the texts they read again (every :class:`~tiermem.summaries._lru.Lru`, the
memo token counters, the shared entity and term tables): bounded, never written anywhere,
keyed by the text itself. Each registers here when it is made (:func:`track`, or
:func:`track_table` for a module's table); :func:`forget_texts` empties them all, and
``purge_user`` and ``redact_turn`` call it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["forget_texts", "track", "track_table"]


_CACHES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""Caches alive, each with the name of its method that empties it (weak: a cache goes
with its owner)."""
_TABLES: list[Callable[[], Any]] = []
"""The ``clear`` of module-level tables (they live as long as the process)."""


def track(cache: object, method: str = "clear") -> None:
    """Have :func:`forget_texts` empty ``cache`` (its ``method()``) while it is alive."""
    _CACHES[cache] = method


def track_table(clear: Callable[[], Any]) -> None:
    """Have :func:`forget_texts` call ``clear``, the emptying of a module-level table."""
    _TABLES.append(clear)


def forget_texts() -> None:
    """Empty every cache keyed by text, after an erasure: they are bounded and never written
    anywhere, but a purged user's sentences must not stay in memory until they are
    evicted. The caches are shared by every session of the process, so the next turns and
    passes compute again what they read (a purge or a redaction is rare)."""
    for cache, method in list(_CACHES.items()):
        getattr(cache, method)()
    for clear in _TABLES:
        clear()
