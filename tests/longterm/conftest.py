"""Fixtures for long-term memory: every durable backend, a fake clock, the in-process index.

``durable`` is parametrized over memory, sqlite, redis, redis-cluster and dynamodb (real
servers from scripts/test.sh; see tests/conftest.py), so every behaviour of
:class:`~tiermem.longterm.memory.LongTermMemory` is checked on every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import BACKENDS, open_backend
from tiermem.clock import FakeClock, UlidFactory
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.memory import LongTermMemory, MemoryRecaller
from tiermem.testing import BackendUnderTest
from tiermem.testing.backend import fresh_id
from tiermem.tokens import TiktokenCounter

_COUNTER = TiktokenCounter()


@pytest.fixture(params=BACKENDS)
async def durable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BackendUnderTest]:
    under_test = await open_backend(request.param, FakeClock(), tmp_path)
    try:
        yield under_test
    finally:
        await under_test.hot.aclose()
        await under_test.durable.aclose()


@dataclass
class LongTerm:
    """A LongTermMemory on one backend, with its index and clock at hand for assertions."""

    memory: LongTermMemory
    index: InProcessIndex
    backend: BackendUnderTest
    user: str = field(default_factory=lambda: fresh_id("u"))

    @property
    def clock(self) -> FakeClock:
        return self.backend.clock

    async def indexed(self, query: str, user: str | None = None) -> list[str]:
        """Doc ids the index finds for ``query`` (BM25), best first."""
        hits = await self.index.search(user or self.user, query, kinds=("memory",), limit=20)
        return [h.doc_id for h in hits]


def make_longterm(
    backend: BackendUnderTest, *, recaller: MemoryRecaller | None = None, **options: object
) -> LongTerm:
    index = InProcessIndex()
    memory = LongTermMemory(
        backend.durable,
        index,
        clock=backend.clock,
        ids=UlidFactory(),
        tokens=_COUNTER,
        recaller=recaller,
        **options,  # type: ignore[arg-type]
    )
    return LongTerm(memory, index, backend)


@pytest.fixture
def lt(durable: BackendUnderTest) -> LongTerm:
    return make_longterm(durable)


class FakeRecaller:
    """Stands in for tiermem.longterm.recall.Recaller where a test needs fixed hits (e.g.
    exact scores for the context budget); other tests use the real Recaller."""

    def __init__(self, hits: Sequence[RecallHit] = ()) -> None:
        self.hits = list(hits)
        self.calls: list[dict[str, object]] = []

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        types: Collection[str] | None = None,
        min_importance: float = 0.0,
        since: datetime | None = None,
        until: datetime | None = None,
        k: int = 5,
        scope: Collection[DocKind] = ("memory",),
    ) -> list[RecallHit]:
        self.calls.append({"user_id": user_id, "query": query, "types": types, "k": k})
        return self.hits[:k]

    async def aclose(self) -> None:
        return None


class CountingEmbedder:
    """A deterministic embedder that counts its calls."""

    model_id = "fake-embed-3"
    dimensions = 3

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        out = []
        for text in texts:
            raw = [float(len(text) % 7 + 1), float(text.count("e") + 1), 1.0]
            norm = sum(v * v for v in raw) ** 0.5
            out.append([v / norm for v in raw])
        return out
