"""Injected time and ids.

Nothing in tiermem calls ``datetime.now()`` or ``uuid4()`` directly: components take a
:class:`Clock` and an :class:`IdFactory`, so tests advance a fake clock instead of sleeping
and imports can replay history with their own timestamps.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

__all__ = ["Clock", "FakeClock", "IdFactory", "SystemClock", "UlidFactory"]


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The wall clock."""

    now = staticmethod(partial(datetime.now, UTC))
    """The current time, timezone-aware, in UTC (``datetime.now(UTC)`` called directly: the
    turn path reads the clock several times per turn, and a method frame costs a third)."""


class FakeClock:
    """A clock that moves only when told to. Shipped for tests of any tiermem component."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2030, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by a timedelta or a number of seconds; returns the new time."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("a clock does not go backwards; advance by a positive amount")
        self._now += step
        return self._now

    def set(self, value: datetime) -> None:
        self._now = value.astimezone(UTC)


class IdFactory(Protocol):
    def new_id(self) -> str:
        """A new unique id, safe to use in any key segment."""
        ...


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class UlidFactory:
    """ULIDs: 26 characters, unique, and sortable by creation time (48-bit ms + 80 random bits)."""

    def new_id(self) -> str:
        value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
        chars = []
        for _ in range(26):
            chars.append(_CROCKFORD[value & 31])
            value >>= 5
        return "".join(reversed(chars))
