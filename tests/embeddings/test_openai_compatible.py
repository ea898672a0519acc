"""OpenAICompatibleEmbedder against an in-process fake server (httpx.MockTransport).

No network: the transport answers the way OpenAI, Ollama (``/v1/embeddings``) and vLLM do,
and records every request so the tests can check what was sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.llm.embeddings import Embedder
from tiermem.llm.embeddings_remote import OpenAICompatibleEmbedder

BASE = "http://ollama.test:11434/v1/"


class FakeServer:
    """Answers each text with a vector derived from its length, at ``size`` values."""

    def __init__(self, size: int = 4, *, shuffle: bool = False) -> None:
        self.size = size
        self.shuffle = shuffle
        self.requests: list[httpx.Request] = []

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        texts = json.loads(request.content)["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": [len(t) + 1.0] * self.size}
            for i, t in enumerate(texts)
        ]
        if self.shuffle:
            data.reverse()
        return httpx.Response(200, json={"object": "list", "data": data, "model": "m"})


def embedder_for(
    handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any
) -> OpenAICompatibleEmbedder:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return OpenAICompatibleEmbedder(BASE, "nomic-embed-text", http_client=client, **kwargs)


async def test_posts_openai_shaped_requests_and_normalizes_in_order() -> None:
    server = FakeServer(size=3, shuffle=True)
    embedder = embedder_for(server, api_key="sk-test")
    assert isinstance(embedder, Embedder)
    vectors = await embedder.embed(["a", "abc"])

    [request] = server.requests
    assert request.method == "POST"
    assert str(request.url) == "http://ollama.test:11434/v1/embeddings"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert server.bodies() == [{"model": "nomic-embed-text", "input": ["a", "abc"]}]
    third = 1 / math.sqrt(3)
    assert vectors == [pytest.approx([third] * 3), pytest.approx([third] * 3)]
    assert embedder.model_id == "nomic-embed-text"
    assert embedder.dimensions == 3  # learned from the first answer


async def test_answers_are_put_back_in_input_order_by_index() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "data": [
                    {"index": 1, "embedding": [0.0, 1.0]},
                    {"index": 0, "embedding": [1.0, 0.0]},
                ]
            },
        )

    vectors = await embedder_for(handler).embed(["first", "second"])
    assert vectors == [[1.0, 0.0], [0.0, 1.0]]


async def test_configured_dimensions_are_sent_and_enforced() -> None:
    server = FakeServer(size=8)
    embedder = embedder_for(server, dimensions=8)
    assert embedder.dimensions == 8
    await embedder.embed(["x"])
    assert server.bodies()[0]["dimensions"] == 8
    server.size = 16
    with pytest.raises(BackendError, match=r"\[16\] values.*expected 8"):
        await embedder.embed(["x"])


async def test_a_changed_vector_size_is_caught_without_configured_dimensions() -> None:
    server = FakeServer(size=4)
    embedder = embedder_for(server)
    await embedder.embed(["x"])
    assert "dimensions" not in server.bodies()[0]
    server.size = 5
    with pytest.raises(BackendError, match="cannot be compared"):
        await embedder.embed(["x"])


async def test_texts_are_sent_in_batches() -> None:
    server = FakeServer()
    vectors = await embedder_for(server, batch_size=2).embed([f"t{i}" for i in range(5)])
    assert len(vectors) == 5
    assert [len(b["input"]) for b in server.bodies()] == [2, 2, 1]


async def test_empty_input_sends_nothing() -> None:
    server = FakeServer()
    assert await embedder_for(server).embed([]) == []
    assert server.requests == []


@pytest.mark.parametrize(
    ("status", "retryable"), [(429, True), (500, True), (503, True), (400, False), (404, False)]
)
async def test_http_errors_map_to_backend_errors(status: int, retryable: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text='{"error": "model \\"x\\" not found"}')

    with pytest.raises(BackendError, match=f"HTTP {status}.*not found") as caught:
        await embedder_for(handler).embed(["x"])
    assert caught.value.retryable is retryable


async def test_timeouts_and_connection_failures_are_typed() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(BackendTimeoutError) as slow:
        await embedder_for(timeout).embed(["x"])
    assert slow.value.retryable
    with pytest.raises(BackendUnavailableError, match="is the server running") as down:
        await embedder_for(refused).embed(["x"])
    assert down.value.retryable


@pytest.mark.parametrize(
    "answer",
    [
        "not json",
        {"data": "nope"},
        {"result": []},
        {"data": [{"index": 0, "embedding": [1.0]}]},  # one vector for two texts
        {"data": [{"index": 0, "embedding": [0.0]}, {"index": 1, "embedding": [0.0]}]},
    ],
    ids=["not-json", "data-not-list", "no-data", "too-few", "zero-vectors"],
)
async def test_malformed_answers_are_backend_errors(answer: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, str):
            return httpx.Response(200, text=answer)
        return httpx.Response(200, json=answer)

    with pytest.raises(BackendError) as caught:
        await embedder_for(handler).embed(["a", "b"])
    assert not caught.value.retryable


async def test_a_given_client_is_not_closed_but_an_own_one_is() -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(FakeServer()))
    shared = OpenAICompatibleEmbedder(BASE, "m", http_client=client)
    await shared.aclose()
    assert not client.is_closed
    await client.aclose()

    own = OpenAICompatibleEmbedder(BASE, "m")
    await own.aclose()
    assert own._client.is_closed


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("localhost:11434", "m"), {}),
        ((BASE, "m"), {"dimensions": 0}),
        ((BASE, "m"), {"batch_size": 0}),
    ],
)
def test_bad_settings_are_rejected(args: tuple[str, str], kwargs: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        OpenAICompatibleEmbedder(*args, **kwargs)  # type: ignore[arg-type]


async def test_a_lone_string_is_rejected_rather_than_embedded_per_character() -> None:
    with pytest.raises(ValidationError, match="not one str"):
        await embedder_for(FakeServer()).embed("hello")
