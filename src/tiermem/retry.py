"""The one retry policy for compare-and-set loops and throttled requests.

Every loop that re-reads and retries after losing a race (tier records, hot-tier ordering,
long-term preference slots, DynamoDB transactions and throttling) waits with
:func:`backoff_delay`: exponential growth with *full jitter* (a uniform draw between 0 and
the exponential bound), so writers that collided do not collide again in lockstep.
"""

from __future__ import annotations

import asyncio
import random

__all__ = ["CAS_ATTEMPTS", "backoff_delay", "pause"]

CAS_ATTEMPTS = 32
"""How often a compare-and-set loop re-reads before it gives up with ConflictError."""


def backoff_delay(attempt: int, *, base: float = 0.002, cap: float = 0.25) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): uniform in
    ``[0, min(cap, base * 2**attempt)]``."""
    return random.uniform(0.0, min(cap, base * (2 ** min(attempt, 30))))  # noqa: S311 -- jitter, not crypto


async def pause(attempt: int, *, base: float = 0.002, cap: float = 0.25) -> None:
    """Sleep for :func:`backoff_delay`."""
    await asyncio.sleep(backoff_delay(attempt, base=base, cap=cap))
