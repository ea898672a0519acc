"""Memory types: what kinds of long-term memory exist, how long they are kept, how much they
matter by default (seed 000's table), and caller-defined types."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from tiermem.errors import ValidationError

__all__ = ["DEFAULT_MEMORY_TYPES", "MemoryType", "MemoryTypeRegistry", "is_internal_type"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class MemoryType:
    name: str
    retention: timedelta | None
    """How long a record of this type is kept; None: until forgotten."""
    importance: float
    """Default importance of a new record of this type."""
    description: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValidationError(
                f"memory type name {self.name!r} must be lower_snake_case, 1-64 characters, "
                "starting with a letter"
            )
        if not 0.0 <= self.importance <= 1.0:
            raise ValidationError(f"importance of {self.name!r} must be in [0, 1]")
        if self.retention is not None and self.retention <= timedelta(0):
            raise ValidationError(f"retention of {self.name!r} must be positive, or None")


DEFAULT_MEMORY_TYPES = (
    MemoryType("preference", None, 0.9, "a stated like, dislike or way to be addressed"),
    MemoryType("interaction_summary", timedelta(days=90), 0.6, "what a past session was about"),
    MemoryType("feedback", timedelta(days=180), 0.7, "praise or complaint about the service"),
    MemoryType("behavioral_pattern", timedelta(days=30), 0.4, "an observed habit"),
    MemoryType("fact", None, 0.7, "something true about the user or their world"),
    MemoryType("episode", timedelta(days=90), 0.5, "something that happened"),
)


def is_internal_type(name: str) -> bool:
    """Types starting with '_' are tiermem's own bookkeeping (the change log), never recalled."""
    return name.startswith("_")


class MemoryTypeRegistry:
    """The memory types a deployment knows. Unknown types are rejected with advice."""

    def __init__(self, types: Iterable[MemoryType] = DEFAULT_MEMORY_TYPES) -> None:
        self._types = {t.name: t for t in types}

    def register(self, memory_type: MemoryType) -> None:
        """Add a caller-defined type, or replace a default's retention and importance."""
        self._types[memory_type.name] = memory_type

    def get(self, name: str) -> MemoryType:
        try:
            return self._types[name]
        except KeyError:
            known = ", ".join(sorted(self._types))
            raise ValidationError(
                f"unknown memory type {name!r}; known: {known}. Register your own with "
                f"MemoryTypeRegistry.register(MemoryType({name!r}, retention=None, "
                "importance=0.5))"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._types)
