"""Chat with any Amazon Bedrock model through the Converse API (boto3 ``bedrock-runtime``).

boto3 comes with ``pip install 'tiermem[llm]'`` and is imported when the model is built.
Calls run in a worker thread because boto3 blocks. The client we build has botocore's own
retries switched off, so :func:`tiermem.llm.chat_json.complete_with_retries` is the one
retry policy. Errors are mapped at this boundary::

    ThrottlingException, ServiceUnavailable, InternalServer,
    ModelNotReady, ModelTimeout, ModelError, HTTP 429/5xx   -> retried
    read/connect timeouts, cannot connect                   -> retried
    AccessDenied, ResourceNotFound, Validation, no creds    -> ModelFailedError at once
    guardrail or content filter, context window exceeded    -> ModelFailedError at once
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.llm.chat import ChatMessage, ChatReply
from tiermem.llm.chat_json import (
    check_chat_request,
    complete_with_retries,
    merge_consecutive_roles,
    system_prompt_with_schema,
)
from tiermem.models.base import JsonValue

__all__ = ["BedrockConverseModel"]

_INSTALL = "pip install 'tiermem[llm]'"
_RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "ModelTimeoutException",
        "ModelErrorException",
    }
)
_ADVICE = {
    "ThrottlingException": "slow down or ask for a higher Bedrock quota",
    "AccessDeniedException": (
        "enable access to the model in the Bedrock console and allow bedrock:InvokeModel on it"
    ),
    "ResourceNotFoundException": "check llm_model and that the region offers it",
    "ValidationException": (
        "check llm_model (some models need an inference profile id such as us.anthropic...) "
        "and max_tokens"
    ),
}
_BLOCKED_STOPS = {
    "guardrail_intervened": "a Bedrock guardrail blocked the reply",
    "content_filtered": "the model's content filter blocked the reply",
    "model_context_window_exceeded": "the prompt does not fit the model's context window",
}


class BedrockConverseModel:
    """A :class:`~tiermem.llm.chat.ChatModel` over Bedrock ``Converse``.

    Args:
        model_id: a Bedrock model id or inference profile, e.g.
            ``us.anthropic.claude-3-5-haiku-20241022-v1:0``.
        region_name: the Bedrock region; default: boto3's configuration.
        client: a ready ``bedrock-runtime`` client (boto3 or botocore); built lazily, off
            the event loop, when omitted.
        timeout: seconds to wait for one answer (the client's read timeout).
        max_attempts: attempts per :meth:`complete` (the retry loop's budget).
        backoff_base, backoff_cap: the retry backoff, in seconds.

    Raises:
        ValidationError: ``timeout`` <= 0 or ``max_attempts`` < 1.
        UnsupportedCapabilityError: no ``client`` was given and boto3 is not installed.
    """

    def __init__(
        self,
        model_id: str,
        region_name: str | None = None,
        client: Any = None,
        *,
        timeout: float = 30.0,
        max_attempts: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
    ) -> None:
        if not model_id:
            raise ValidationError("model_id is empty; name a Bedrock model or inference profile")
        if timeout <= 0:
            raise ValidationError(f"timeout must be > 0 seconds, got {timeout}")
        if max_attempts < 1:
            raise ValidationError(f"max_attempts must be >= 1, got {max_attempts}")
        # Fail now, at the composition root, rather than in the middle of a job.
        if client is None and importlib.util.find_spec("boto3") is None:
            raise UnsupportedCapabilityError(
                f"BedrockConverseModel needs boto3; install it with `{_INSTALL}`"
            )
        self.model_id = model_id
        self.name = f"bedrock:{model_id}"
        self._region_name = region_name
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._backoff = (backoff_base, backoff_cap)
        self._client = client
        self._client_lock = asyncio.Lock()

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        system: str | None = None,
        json_schema: Mapping[str, JsonValue] | None = None,
        max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> ChatReply:
        """The model's reply (see :meth:`tiermem.llm.chat.ChatModel.complete`).

        Raises:
            ValidationError: the request is malformed; nothing was sent.
            ModelFailedError: Bedrock refused, or failed every attempt.
        """
        batch = check_chat_request(
            messages, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )
        system_text = system_prompt_with_schema(system, json_schema)
        client = await self._get_client()

        async def send(attempt_messages: Sequence[ChatMessage]) -> ChatReply:
            request: dict[str, Any] = {
                "modelId": self.model_id,
                "messages": [
                    {"role": m.role, "content": [{"text": m.text}]}
                    for m in merge_consecutive_roles(attempt_messages)
                ],
                "inferenceConfig": {"maxTokens": max_tokens, "temperature": temperature},
            }
            if system_text:
                request["system"] = [{"text": system_text}]
            response = await asyncio.to_thread(self._converse, client, request)
            return self._reply(response)

        base, cap = self._backoff
        return await complete_with_retries(
            send,
            batch,
            model=self.name,
            json_schema=json_schema,
            max_attempts=self._max_attempts,
            backoff_base=base,
            backoff_cap=cap,
        )

    async def _get_client(self) -> Any:
        async with self._client_lock:
            if self._client is None:
                # Building a boto3 client reads credentials and service models from disk.
                self._client = await asyncio.to_thread(self._build_client)
            return self._client

    def _build_client(self) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            read_timeout=self._timeout,
            connect_timeout=min(self._timeout, 10.0),
            # One retry policy: ours. botocore's would multiply the attempts.
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
        return boto3.client("bedrock-runtime", region_name=self._region_name, config=config)

    def _converse(self, client: Any, request: dict[str, Any]) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        try:
            return client.converse(**request)
        except ClientError as exc:
            raise self._map_client_error(exc) from exc
        except (ConnectTimeoutError, ReadTimeoutError) as exc:
            raise BackendTimeoutError(
                f"Bedrock {self.model_id} did not answer in {self._timeout}s: {exc}",
                backend=self.name,
            ) from exc
        except EndpointConnectionError as exc:
            raise BackendUnavailableError(
                f"cannot reach Bedrock for {self.model_id}: {exc}; check the region and network",
                backend=self.name,
            ) from exc
        except NoCredentialsError as exc:
            raise BackendError(
                "no AWS credentials for Bedrock; configure them (environment, profile or "
                "role) or pass a ready client=",
                backend=self.name,
            ) from exc
        except BotoCoreError as exc:
            raise BackendError(
                f"Bedrock {self.model_id} call failed: {exc}", backend=self.name
            ) from exc

    def _map_client_error(self, exc: Any) -> BackendError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        message = str(error.get("Message", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        retryable = code in _RETRYABLE_CODES or status in (408, 429) or status >= 500
        advice = _ADVICE.get(code, "retry later" if retryable else "check the request")
        text = f"Bedrock {self.model_id} answered {code} (HTTP {status})"
        if message:
            text += f": {message}"
        return BackendError(f"{text}; {advice}", backend=self.name, retryable=retryable)

    def _reply(self, response: Any) -> ChatReply:
        try:
            blocks = response["output"]["message"]["content"]
            text = "".join(block["text"] for block in blocks if isinstance(block.get("text"), str))
            stop = str(response.get("stopReason", ""))
            usage = response.get("usage") or {}
        except (KeyError, TypeError, AttributeError) as exc:
            raise BackendError(
                f"Bedrock {self.model_id} answered without a message ({exc!r}); is it a "
                "model that supports Converse?",
                backend=self.name,
            ) from exc
        if stop in _BLOCKED_STOPS:
            raise BackendError(
                f"Bedrock {self.model_id}: {_BLOCKED_STOPS[stop]} (stopReason {stop}); "
                "change the input or the guardrail, retrying will not help",
                backend=self.name,
            )
        return ChatReply(
            text=text,
            input_tokens=int(usage.get("inputTokens", 0) or 0),
            output_tokens=int(usage.get("outputTokens", 0) or 0),
            model=self.name,
            extra={"stop_reason": stop},
        )
