"""Fakes and sample data shared by the knowledge tests."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

from tiermem.errors import BackendError
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.knowledge import KnowledgeBase
from tiermem.store.contract import DurableStore
from tiermem.testing import FakeClock

USER = "user-1"
OTHER = "user-2"


def _section(title: str, sentence: str) -> str:
    return title + " " + " ".join(sentence.format(i=i) for i in range(12))


POLICY = "\n\n".join(
    [
        _section("Returns.", "Rule {i}: manga volumes may be returned within 30 days."),
        _section("Shipping.", "Note {i}: orders ship from the Osaka warehouse."),
        _section("Digital.", "Point {i}: e-books cannot be refunded after download."),
    ]
)


class SequentialIds:
    def __init__(self, prefix: str = "doc") -> None:
        self._prefix = prefix
        self._n = 0

    def new_id(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n:04d}"


class WordHashEmbedder:
    """A deterministic bag-of-words embedder: texts sharing words have close vectors."""

    model_id = "word-hash-64"
    dimensions = 64

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        out = []
        for text in texts:
            vector = [0.0] * self.dimensions
            for word in text.lower().split():
                vector[zlib.crc32(word.strip(".,:").encode()) % self.dimensions] += 1.0
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            out.append([x / norm for x in vector])
        return out


class FailingEmbedder(WordHashEmbedder):
    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise BackendError("model is overloaded", backend="fake", retryable=True)


class FailingIndex(InProcessIndex):
    """Accepts the first ``ok`` upserts, then fails like a Redis index that went away."""

    def __init__(self, ok: int = 0) -> None:
        super().__init__()
        self._ok = ok

    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        if self._ok <= 0:
            raise BackendError("index unavailable", backend="fake", retryable=True)
        self._ok -= 1
        await super().upsert(docs)


def knowledge(
    durable: DurableStore, index: InProcessIndex, clock: FakeClock, **kwargs: Any
) -> KnowledgeBase:
    kwargs.setdefault("chunk_tokens", 60)
    kwargs.setdefault("overlap_tokens", 15)
    return KnowledgeBase(durable, index, clock=clock, ids=SequentialIds(), **kwargs)
