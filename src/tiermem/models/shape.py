"""Shape limits checked at the edge, before a turn is prepared or stored.

Two things the size limit cannot catch make a stored turn unreadable later, so they are
refused where the data comes in (:meth:`tiermem.service.MemoryService.prepare_turns`):

* **nesting depth**: JSON decoders have recursion limits (pydantic's parser refuses about
  200 levels) below what an encoder happily writes, so a tool input nested 200 deep would
  be archived and then fail every read of the session. :data:`MAX_JSON_DEPTH` is far below
  any decoder's limit and far above what real tool inputs use.
* **lone surrogates** (``"\\ud800"``): valid in a Python ``str``, not encodable as UTF-8,
  so every store would fail to serialize them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from tiermem.errors import ValidationError

__all__ = ["MAX_JSON_DEPTH", "check_shape"]

MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a turn (content blocks included)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


_LEAVES = frozenset({int, float, bool, type(None), bytes})
"""Types that hold nothing to walk (checked by exact type: the common case, no isinstance)."""


def check_shape(value: Any, *, what: str) -> None:
    """Raise :class:`ValidationError` if ``value`` nests deeper than :data:`MAX_JSON_DEPTH`
    or holds a string with a lone surrogate. Walks models, mappings and sequences.

    Level by level, so a flat value (a turn's text blocks, its metadata) costs one pass
    over its items and no per-item bookkeeping."""
    if type(value) is dict and not value:  # a turn's usual metadata
        return
    level: list[Any] = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or isinstance(item, str):
                if not item.isascii() and _SURROGATE.search(item):
                    raise ValidationError(
                        f"{what} holds a lone surrogate ({_SURROGATE.search(item)!r}), "
                        "which cannot be stored as UTF-8; decode your input with "
                        "errors='replace'"
                    )
                continue
            if kind in _LEAVES:
                continue
            if isinstance(item, BaseModel):
                below += item.__dict__.values()
            elif isinstance(item, dict):
                below += item.keys()
                below += item.values()
            elif isinstance(item, list | tuple):
                below += item
            else:
                continue
            if depth > MAX_JSON_DEPTH:
                raise ValidationError(
                    f"{what} nests deeper than {MAX_JSON_DEPTH} levels; flatten it or store "
                    "it by reference (a document id) instead of inline"
                )
        level = below
        depth += 1
