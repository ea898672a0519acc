"""BedrockTitanEmbedder against a real botocore ``bedrock-runtime`` client.

A real Bedrock endpoint cannot be reached from CI (no AWS account, no network), so the
client's answers come from botocore's :class:`~botocore.stub.Stubber`: the request still
goes through botocore's parameter validation for ``InvokeModel``, and the stub checks the
exact body we send (``inputText``, ``dimensions``, ``normalize``) against Titan V2's
documented request shape. One test points the client at a closed port on loopback to see a
real connection failure.
"""

from __future__ import annotations

import io
import json
import math
import socket
from collections.abc import Iterator
from typing import Any

import botocore.session as botocore_session
import pytest
from botocore.config import Config
from botocore.response import StreamingBody
from botocore.stub import Stubber

from tiermem.errors import (
    BackendError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.llm.embeddings import Embedder
from tiermem.llm.embeddings_remote import BedrockTitanEmbedder

MODEL = "amazon.titan-embed-text-v2:0"
SESSION = botocore_session.get_session()  # one session: it caches the service model


def bedrock_client(**kwargs: Any) -> Any:
    return SESSION.create_client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        **kwargs,
    )


@pytest.fixture
def client() -> Iterator[Any]:
    client = bedrock_client()
    yield client
    client.close()


def titan_answer(vector: list[float]) -> dict[str, Any]:
    raw = json.dumps(
        {"embedding": vector, "inputTextTokenCount": 3, "embeddingsByType": {"float": vector}}
    ).encode()
    return {"body": StreamingBody(io.BytesIO(raw), len(raw)), "contentType": "application/json"}


def expect_request(stubber: Stubber, text: str, dimensions: int, vector: list[float]) -> None:
    stubber.add_response(
        "invoke_model",
        titan_answer(vector),
        {
            "modelId": MODEL,
            "body": json.dumps({"inputText": text, "dimensions": dimensions, "normalize": True}),
            "contentType": "application/json",
            "accept": "application/json",
        },
    )


def ramp(n: int, scale: float = 1.0) -> list[float]:
    return [scale * (i + 1) for i in range(n)]


async def test_embeds_each_text_in_order_and_normalizes(client: Any) -> None:
    embedder = BedrockTitanEmbedder(dimensions=256, client=client, max_concurrency=1)
    assert isinstance(embedder, Embedder)
    assert (embedder.model_id, embedder.dimensions) == (MODEL, 256)
    with Stubber(client) as stubber:
        expect_request(stubber, "manga returns", 256, ramp(256))
        expect_request(stubber, "配送について", 256, ramp(256, scale=-2.0))
        vectors = await embedder.embed(["manga returns", "配送について"])
        stubber.assert_no_pending_responses()
    assert [len(v) for v in vectors] == [256, 256]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0) for v in vectors)
    assert vectors[0][0] > 0 > vectors[1][0]  # the second answer went to the second text


async def test_empty_input_makes_no_request(client: Any) -> None:
    embedder = BedrockTitanEmbedder(client=client)
    with Stubber(client) as stubber:
        assert await embedder.embed([]) == []
        stubber.assert_no_pending_responses()


async def test_wrong_vector_size_is_a_backend_error(client: Any) -> None:
    embedder = BedrockTitanEmbedder(dimensions=512, client=client)
    with Stubber(client) as stubber:
        expect_request(stubber, "text", 512, ramp(1024))
        with pytest.raises(BackendError, match="1024 embedding values, expected 512"):
            await embedder.embed(["text"])


@pytest.mark.parametrize(
    ("code", "status", "retryable", "advice"),
    [
        ("ThrottlingException", 429, True, "quota"),
        ("ServiceUnavailableException", 503, True, "retry later"),
        ("ModelTimeoutException", 408, True, "retry later"),
        ("AccessDeniedException", 403, False, "enable access to the model"),
        ("ValidationException", 400, False, "check the text"),
        ("ResourceNotFoundException", 404, False, "check model_id"),
    ],
)
async def test_bedrock_errors_map_to_backend_errors(
    client: Any, code: str, status: int, retryable: bool, advice: str
) -> None:
    embedder = BedrockTitanEmbedder(client=client)
    with Stubber(client) as stubber:
        stubber.add_client_error(
            "invoke_model",
            service_error_code=code,
            service_message="said the stub",
            http_status_code=status,
        )
        with pytest.raises(BackendError, match=f"{code}.*said the stub.*{advice}") as caught:
            await embedder.embed(["text"])
    assert caught.value.retryable is retryable
    assert caught.value.backend == f"bedrock:{MODEL}"


async def test_an_unreachable_endpoint_is_backend_unavailable() -> None:
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = bedrock_client(
        endpoint_url=f"http://127.0.0.1:{port}",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=2),
    )
    embedder = BedrockTitanEmbedder(client=client)
    with pytest.raises(BackendUnavailableError) as caught:
        await embedder.embed(["text"])
    assert caught.value.retryable
    client.close()


@pytest.mark.parametrize("texts", [[""], ["   "], ["x" * 50_001]])
async def test_texts_titan_cannot_take_are_rejected_before_any_request(
    client: Any, texts: list[str]
) -> None:
    embedder = BedrockTitanEmbedder(client=client)
    with Stubber(client) as stubber, pytest.raises(ValidationError):
        await embedder.embed(texts)
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize("kwargs", [{"dimensions": 384}, {"max_concurrency": 0}])
def test_bad_settings_are_rejected(client: Any, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        BedrockTitanEmbedder(client=client, **kwargs)  # type: ignore[arg-type]
