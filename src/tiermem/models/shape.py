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


def check_shape(value: Any, *, what: str) -> None:
    """Raise :class:`ValidationError` if ``value`` nests deeper than :data:`MAX_JSON_DEPTH`
    or holds a string with a lone surrogate. Walks models, mappings and sequences."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                raise ValidationError(
                    f"{what} holds a lone surrogate ({_SURROGATE.search(item)!r}), which "
                    "cannot be stored as UTF-8; decode your input with errors='replace'"
                )
            continue
        if isinstance(item, BaseModel):
            children: Any = item.__dict__.values()
        elif isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise ValidationError(
                f"{what} nests deeper than {MAX_JSON_DEPTH} levels; flatten it or store it "
                "by reference (a document id) instead of inline"
            )
        stack.extend((child, depth + 1) for child in children)
