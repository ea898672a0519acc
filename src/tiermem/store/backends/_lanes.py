"""One lane per key: in-process writers of the same key take turns instead of racing.

An optimistic write (a conditional DynamoDB transaction) that loses retries at once, so
several tasks of one process appending to the same session only race each other: each
round one wins and the rest resend, and a task can lose many rounds in a row. A lane makes
them queue (``asyncio.Lock`` wakes waiters in arrival order), so optimistic retries are
left for writers in other processes.

Bounded: a key's lock exists only while a task holds or waits for it, so the map holds at
most as many entries as there are writes in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["Lanes"]


class Lanes:
    """Per-key ``asyncio.Lock`` that exists only while in use."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def lane(self, key: str) -> AsyncIterator[None]:
        entry = self._held.get(key)
        if entry is None:
            entry = self._held[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._held[key]

    def __len__(self) -> int:
        """Keys with a write in flight or waiting."""
        return len(self._held)
