"""Embeddings from a remote model: Amazon Bedrock (Titan Text Embeddings V2) and any
OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama, vLLM, LM Studio).

Both come with ``pip install 'tiermem[llm]'`` (boto3, httpx); each client library is
imported when its embedder is built, so tiermem imports without them.

Errors of the client libraries are mapped to tiermem's at this boundary::

    throttling (HTTP 429), server errors (5xx), model not ready  -> BackendError, retryable
    timeouts                                                      -> BackendTimeoutError
    cannot connect                                                -> BackendUnavailableError
    bad request, access denied, unknown model, bad response       -> BackendError, not retryable

No retries happen here: botocore already retries throttling with its own policy, and the
caller decides whether a retryable error is worth another try.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.llm.embeddings import check_texts, unit_normalize

if TYPE_CHECKING:
    import httpx

__all__ = ["BedrockTitanEmbedder", "OpenAICompatibleEmbedder"]

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'tiermem[llm]'"
_TITAN_DIMENSIONS = (1024, 512, 256)
_TITAN_MAX_CHARS = 50_000
_RETRYABLE_BEDROCK_CODES = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "ModelTimeoutException",
    }
)


def _retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


# ---------------------------------------------------------------------- Bedrock Titan


class BedrockTitanEmbedder:
    """Amazon Titan Text Embeddings V2 through Bedrock ``InvokeModel``.

    Titan embeds one text per request: :meth:`embed` sends up to ``max_concurrency``
    requests at a time, each in a worker thread because boto3 blocks. The request asks
    Titan to normalize; vectors are normalized again here, so every embedder's output is
    unit length to float64 precision.

    Args:
        model_id: a Titan V2 model id or an inference profile for it.
        dimensions: 1024 (the model's default), 512 or 256.
        region_name: the Bedrock region; default: boto3's configuration.
        client: a ready ``bedrock-runtime`` client (boto3 or botocore); built lazily,
            off the event loop, when omitted.
        max_concurrency: requests in flight at once.

    Raises:
        ValidationError: ``dimensions`` is not one Titan V2 offers, or ``max_concurrency`` < 1.
        UnsupportedCapabilityError: no ``client`` was given and boto3 is not installed.
    """

    def __init__(
        self,
        model_id: str = "amazon.titan-embed-text-v2:0",
        dimensions: int = 1024,
        region_name: str | None = None,
        client: Any = None,
        *,
        max_concurrency: int = 4,
    ) -> None:
        if dimensions not in _TITAN_DIMENSIONS:
            raise ValidationError(
                f"Titan Text Embeddings V2 offers {', '.join(map(str, _TITAN_DIMENSIONS))} "
                f"dimensions, not {dimensions}"
            )
        if max_concurrency < 1:
            raise ValidationError(f"max_concurrency must be >= 1, got {max_concurrency}")
        # Fail now, at the composition root, rather than in the middle of a request.
        if client is None and importlib.util.find_spec("boto3") is None:
            raise UnsupportedCapabilityError(
                f"BedrockTitanEmbedder needs boto3; install it with `{_INSTALL}`"
            )
        self.model_id = model_id
        self.dimensions = dimensions
        self._region_name = region_name
        self._client = client
        self._client_lock = asyncio.Lock()
        self._limit = asyncio.Semaphore(max_concurrency)

    @property
    def _backend(self) -> str:
        return f"bedrock:{self.model_id}"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector of ``dimensions`` values per text, in order.

        Raises:
            ValidationError: a text is empty or longer than Titan's 50,000 characters.
            BackendError: Bedrock failed (see the module docstring for which are retryable).
        """
        batch = check_texts(texts, what="BedrockTitanEmbedder")
        for i, text in enumerate(batch):
            if not text.strip():
                raise ValidationError(f"text {i} is empty; Titan cannot embed empty text")
            if len(text) > _TITAN_MAX_CHARS:
                raise ValidationError(
                    f"text {i} has {len(text)} characters; Titan V2 takes at most "
                    f"{_TITAN_MAX_CHARS} (and 8,192 tokens): split it into chunks"
                )
        if not batch:
            return []
        client = await self._get_client()
        return list(await asyncio.gather(*(self._embed_one(client, t) for t in batch)))

    async def _get_client(self) -> Any:
        async with self._client_lock:
            if self._client is None:
                # Building a boto3 client reads credentials and service models from disk.
                self._client = await asyncio.to_thread(self._build_client)
            return self._client

    def _build_client(self) -> Any:
        import boto3

        return boto3.client("bedrock-runtime", region_name=self._region_name)

    async def _embed_one(self, client: Any, text: str) -> list[float]:
        body = json.dumps({"inputText": text, "dimensions": self.dimensions, "normalize": True})
        async with self._limit:
            payload = await asyncio.to_thread(self._invoke, client, body)
        vector = payload.get("embedding") if isinstance(payload, dict) else None
        if not isinstance(vector, list) or len(vector) != self.dimensions:
            size = len(vector) if isinstance(vector, list) else "no"
            raise BackendError(
                f"Bedrock {self.model_id} returned {size} embedding values, expected "
                f"{self.dimensions}; is model_id a Titan Text Embeddings V2 model?",
                backend=self._backend,
            )
        return unit_normalize(vector, backend=self._backend)

    def _invoke(self, client: Any, body: str) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        try:
            response = client.invoke_model(
                modelId=self.model_id,
                body=body,
                contentType="application/json",
                accept="application/json",
            )
            raw = response["body"].read()
        except ClientError as exc:
            raise self._map_client_error(exc) from exc
        except (ConnectTimeoutError, ReadTimeoutError) as exc:
            raise BackendTimeoutError(
                f"Bedrock {self.model_id} did not answer in time: {exc}", backend=self._backend
            ) from exc
        except EndpointConnectionError as exc:
            raise BackendUnavailableError(
                f"cannot reach Bedrock for {self.model_id}: {exc}; check the region and network",
                backend=self._backend,
            ) from exc
        except NoCredentialsError as exc:
            raise BackendError(
                "no AWS credentials for Bedrock; configure them (environment, profile or "
                "role) or pass a ready client=",
                backend=self._backend,
            ) from exc
        except BotoCoreError as exc:
            raise BackendError(
                f"Bedrock {self.model_id} call failed: {exc}", backend=self._backend
            ) from exc
        try:
            return json.loads(raw)
        except (ValueError, TypeError) as exc:
            raise BackendError(
                f"Bedrock {self.model_id} answered with a body that is not JSON: {exc}",
                backend=self._backend,
            ) from exc

    def _map_client_error(self, exc: Any) -> BackendError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        message = str(error.get("Message", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        retryable = code in _RETRYABLE_BEDROCK_CODES or _retryable_status(status)
        advice = {
            "ThrottlingException": "slow down or ask for a higher Bedrock quota",
            "AccessDeniedException": (
                "enable access to the model in the Bedrock console and allow "
                "bedrock:InvokeModel on it"
            ),
            "ResourceNotFoundException": "check model_id and the region it is offered in",
            "ValidationException": "check the text and that dimensions is 1024, 512 or 256",
        }.get(code, "retry later" if retryable else "check the request")
        text = f"Bedrock {self.model_id} refused the request: {code} (HTTP {status})"
        if message:
            text += f": {message}"
        return BackendError(f"{text}; {advice}", backend=self._backend, retryable=retryable)


# ------------------------------------------------------------------ OpenAI-compatible


class OpenAICompatibleEmbedder:
    """Embeddings from ``POST {base_url}/embeddings`` in OpenAI's format.

    Works with OpenAI (``https://api.openai.com/v1``), Ollama (``http://localhost:11434/v1``),
    vLLM and LM Studio. Texts are sent ``batch_size`` at a time; vectors are normalized here
    because not every server normalizes.

    Args:
        base_url: the API root, ending before ``/embeddings``.
        model: the model name the server knows; also this embedder's ``model_id``.
        api_key: sent as a bearer token when given.
        dimensions: when given, sent as ``dimensions`` (for models that can shorten their
            vectors) and checked on every answer. When None it is not sent, and
            ``self.dimensions`` is 0 until the first answer sets it from the vector size.
        http_client: an ``httpx.AsyncClient`` to use (and not close); default: one of our own.
        batch_size: texts per request.
        timeout: seconds per request for our own client.

    Raises:
        ValidationError: ``dimensions`` or ``batch_size`` < 1, or ``base_url`` is not http(s).
        UnsupportedCapabilityError: httpx is not installed.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        http_client: httpx.AsyncClient | None = None,
        *,
        batch_size: int = 64,
        timeout: float = 30.0,
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise UnsupportedCapabilityError(
                f"OpenAICompatibleEmbedder needs httpx; install it with `{_INSTALL}`"
            ) from exc
        if not base_url.startswith(("http://", "https://")):
            raise ValidationError(f"base_url must start with http:// or https://, got {base_url!r}")
        if dimensions is not None and dimensions < 1:
            raise ValidationError(f"dimensions must be >= 1 or None, got {dimensions}")
        if batch_size < 1:
            raise ValidationError(f"batch_size must be >= 1, got {batch_size}")
        self.model_id = model
        self.dimensions = dimensions or 0
        self._send_dimensions = dimensions
        self._url = base_url.rstrip("/") + "/embeddings"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._batch_size = batch_size
        self._owns_client = http_client is None
        self._client = http_client or httpx.AsyncClient(timeout=timeout)

    @property
    def _backend(self) -> str:
        return f"openai-compatible:{self.model_id}"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order.

        Raises:
            ValidationError: ``texts`` is a lone str or holds a non-string.
            BackendError: the endpoint failed or answered in an unexpected shape.
        """
        batch = check_texts(texts, what="OpenAICompatibleEmbedder")
        vectors: list[list[float]] = []
        for start in range(0, len(batch), self._batch_size):
            vectors.extend(await self._embed_batch(batch[start : start + self._batch_size]))
        return vectors

    async def aclose(self) -> None:
        """Close the HTTP client if this embedder made it."""
        if self._owns_client:
            await self._client.aclose()

    async def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        import httpx

        request: dict[str, Any] = {"model": self.model_id, "input": texts}
        if self._send_dimensions is not None:
            request["dimensions"] = self._send_dimensions
        try:
            response = await self._client.post(self._url, json=request, headers=self._headers)
        except httpx.TimeoutException as exc:
            raise BackendTimeoutError(
                f"{self._url} did not answer in time: {exc!r}", backend=self._backend
            ) from exc
        except httpx.TransportError as exc:
            raise BackendUnavailableError(
                f"cannot reach {self._url}: {exc!r}; is the server running?",
                backend=self._backend,
            ) from exc
        if response.status_code != 200:
            raise BackendError(
                f"{self._url} answered HTTP {response.status_code} for model "
                f"{self.model_id!r}: {response.text[:300]}",
                backend=self._backend,
                retryable=_retryable_status(response.status_code),
            )
        return self._parse(response, count=len(texts))

    def _parse(self, response: httpx.Response, *, count: int) -> list[list[float]]:
        try:
            data = response.json()["data"]
            items = sorted(data, key=lambda item: int(item["index"]))
            raw = [item["embedding"] for item in items]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(
                f"{self._url} answered with something that is not an embeddings response "
                f"({exc!r}): {response.text[:300]}",
                backend=self._backend,
            ) from exc
        if len(raw) != count or not all(isinstance(v, list) for v in raw):
            raise BackendError(
                f"{self._url} returned {len(raw)} embeddings for {count} texts",
                backend=self._backend,
            )
        expected = self.dimensions or len(raw[0])
        if any(len(v) != expected for v in raw):
            raise BackendError(
                f"{self._url} returned vectors of {sorted({len(v) for v in raw})} values for "
                f"model {self.model_id!r}, expected {expected}; vectors of different sizes "
                "cannot be compared (did the model behind the endpoint change?)",
                backend=self._backend,
            )
        self.dimensions = expected
        return [unit_normalize(v, backend=self._backend) for v in raw]
