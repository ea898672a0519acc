from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiermem.models import ContentBlock, Role, TextBlock, Turn
from tiermem.tokens import TiktokenCounter

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def turn(
    index: int,
    role: Role,
    content: str | tuple[ContentBlock, ...],
    *,
    importance: float = 0.5,
    pinned: bool = False,
) -> Turn:
    blocks = (TextBlock(text=content),) if isinstance(content, str) else content
    return Turn(
        index=index,
        role=role,
        content=blocks,
        timestamp=T0 + timedelta(minutes=index),
        importance=importance,
        pinned=pinned,
    )


@pytest.fixture(scope="session")
def counter() -> TiktokenCounter:
    return TiktokenCounter()
