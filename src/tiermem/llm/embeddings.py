"""Embedding engines: a small protocol and its adapters.

Embeddings are optional: without them recall is BM25 + recency + importance + access.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Embedder"]


@runtime_checkable
class Embedder(Protocol):
    model_id: str
    dimensions: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit-length vector per text, in order.

        Raises:
            BackendError: the model or endpoint failed (retryable when it may pass later).
        """
        ...
