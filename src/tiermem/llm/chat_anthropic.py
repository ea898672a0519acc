"""Chat with Anthropic's models through the Messages API (``POST /v1/messages``), over httpx.

No SDK is needed: httpx comes with ``pip install 'tiermem[llm]'``. HTTP errors are mapped in
:mod:`tiermem.llm.chat_http` (429 rate limits, 5xx and 529 "overloaded" are retried; 400,
401, 403 and 404 are not) and retried by
:func:`tiermem.llm.chat_json.complete_with_retries`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tiermem.errors import BackendError, ValidationError
from tiermem.llm.chat import ChatMessage, ChatReply
from tiermem.llm.chat_http import open_http_client, post_json
from tiermem.llm.chat_json import (
    check_chat_request,
    complete_with_retries,
    merge_consecutive_roles,
    system_prompt_with_schema,
)
from tiermem.models.base import JsonValue

if TYPE_CHECKING:
    import httpx

__all__ = ["ANTHROPIC_API_URL", "ANTHROPIC_VERSION", "AnthropicChatModel"]

ANTHROPIC_API_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header: the Messages API's stable version."""


class AnthropicChatModel:
    """A :class:`~tiermem.llm.chat.ChatModel` over Anthropic's Messages API.

    Args:
        model: e.g. ``claude-3-5-haiku-latest``.
        api_key: sent as ``x-api-key``.
        base_url: the API root, before ``/v1/messages`` (a proxy or gateway may differ).
        timeout: seconds per request for our own HTTP client.
        http_client: an ``httpx.AsyncClient`` to use (and not close); default: our own.
        max_attempts: attempts per :meth:`complete`.
        backoff_base, backoff_cap: the retry backoff, in seconds.

    Raises:
        ValidationError: ``model`` or ``api_key`` is empty, ``base_url`` is not http(s),
            ``timeout`` <= 0 or ``max_attempts`` < 1.
        UnsupportedCapabilityError: httpx is not installed.
    """

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str = ANTHROPIC_API_URL,
        timeout: float = 30.0,
        *,
        http_client: httpx.AsyncClient | None = None,
        max_attempts: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
    ) -> None:
        if not model:
            raise ValidationError("model is empty; name an Anthropic model")
        if not api_key:
            raise ValidationError("api_key is empty; set TIERMEM_LLM_API_KEY")
        client = open_http_client(
            type(self).__name__,
            base_url=base_url,
            timeout=timeout,
            max_attempts=max_attempts,
            http_client=http_client,
        )
        self.model_id = model
        self.name = f"anthropic:{model}"
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._headers = {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}
        self._max_attempts = max_attempts
        self._backoff = (backoff_base, backoff_cap)
        self._owns_client = http_client is None
        self._client = client

    async def aclose(self) -> None:
        """Close the HTTP client if this model made it."""
        if self._owns_client:
            await self._client.aclose()

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
            ValidationError: the request is malformed (Anthropic takes temperature in
                [0, 1]); nothing was sent.
            ModelFailedError: Anthropic refused, or failed every attempt.
        """
        batch = check_chat_request(
            messages, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )
        if temperature > 1.0:
            raise ValidationError(f"Anthropic takes temperature in [0, 1], got {temperature}")
        system_text = system_prompt_with_schema(system, json_schema)

        async def send(attempt_messages: Sequence[ChatMessage]) -> ChatReply:
            body: dict[str, Any] = {
                "model": self.model_id,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "messages": [
                    {"role": m.role, "content": m.text}
                    for m in merge_consecutive_roles(attempt_messages)
                ],
            }
            if system_text:
                body["system"] = system_text
            payload = await post_json(
                self._client, self._url, body, headers=self._headers, backend=self.name
            )
            return self._reply(payload)

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

    def _reply(self, payload: dict[str, Any]) -> ChatReply:
        content = payload.get("content")
        if not isinstance(content, list):
            raise BackendError(
                f"{self._url} answered without a content list; is base_url the Anthropic API?",
                backend=self.name,
            )
        text = "".join(
            block["text"]
            for block in content
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )
        stop = str(payload.get("stop_reason") or "")
        if stop == "refusal":
            raise BackendError(
                f"{self.name} refused to answer (stop_reason refusal); change the input, "
                "retrying will not help",
                backend=self.name,
            )
        raw_usage = payload.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        return ChatReply(
            text=text,
            input_tokens=int(usage.get("input_tokens", 0) or 0),
            output_tokens=int(usage.get("output_tokens", 0) or 0),
            model=self.name,
            extra={"stop_reason": stop},
        )
