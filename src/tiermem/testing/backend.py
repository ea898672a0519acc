"""What the conformance suite needs from a backend under test."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tiermem.clock import FakeClock
from tiermem.models import NewTurn, TextBlock
from tiermem.store.contract import DurableStore, HotStore

__all__ = ["BackendUnderTest", "fresh_id", "text_turn"]


@dataclass
class BackendUnderTest:
    hot: HotStore
    durable: DurableStore
    clock: FakeClock

    def later(self, seconds: float) -> datetime:
        """A time ``seconds`` after the fake clock's now."""
        return self.clock.now() + timedelta(seconds=seconds)


def fresh_id(prefix: str = "id") -> str:
    """A random id, so tests sharing one server never see each other's data."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def text_turn(text: str, *, role: str = "user", at: datetime | None = None) -> NewTurn:
    return NewTurn.model_validate(
        {
            "role": role,
            "content": [TextBlock(text=text)],
            "timestamp": at or datetime(2030, 1, 1, tzinfo=UTC),
        }
    )
