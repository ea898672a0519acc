"""Chat with any server that speaks OpenAI's chat-completions API: Ollama
(``http://localhost:11434/v1``), vLLM, llama.cpp server, LM Studio, OpenAI itself.

httpx comes with ``pip install 'tiermem[llm]'``. Each attempt is one
``POST {base_url}/chat/completions``; HTTP errors are mapped in :mod:`tiermem.llm.chat_http`
and retried by :func:`tiermem.llm.chat_json.complete_with_retries`.
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
    system_prompt_with_schema,
)
from tiermem.models.base import JsonValue

if TYPE_CHECKING:
    import httpx

__all__ = ["OpenAICompatibleChatModel"]


class OpenAICompatibleChatModel:
    """A :class:`~tiermem.llm.chat.ChatModel` over ``POST {base_url}/chat/completions``.

    The JSON schema goes into the system message. ``json_mode`` also sends
    ``response_format={"type": "json_object"}``, which makes many servers emit valid JSON
    only; it is off by default because not every server accepts it (some answer HTTP 400).

    Args:
        base_url: the API root, ending before ``/chat/completions``.
        model: the model name the server knows.
        api_key: sent as a bearer token when given (local servers need none).
        timeout: seconds per request for our own HTTP client.
        http_client: an ``httpx.AsyncClient`` to use (and not close); default: our own.
        json_mode: send ``response_format`` when a schema is asked for.
        max_attempts: attempts per :meth:`complete`.
        backoff_base, backoff_cap: the retry backoff, in seconds.

    Raises:
        ValidationError: ``base_url`` is not http(s), ``model`` is empty, ``timeout`` <= 0
            or ``max_attempts`` < 1.
        UnsupportedCapabilityError: httpx is not installed.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        http_client: httpx.AsyncClient | None = None,
        json_mode: bool = False,
        max_attempts: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
    ) -> None:
        if not model:
            raise ValidationError("model is empty; name the model the server serves")
        client = open_http_client(
            type(self).__name__,
            base_url=base_url,
            timeout=timeout,
            max_attempts=max_attempts,
            http_client=http_client,
        )
        self.model_id = model
        self.name = f"openai-compatible:{model}"
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._json_mode = json_mode
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
            ValidationError: the request is malformed; nothing was sent.
            ModelFailedError: the server refused, or failed every attempt.
        """
        batch = check_chat_request(
            messages, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )
        system_text = system_prompt_with_schema(system, json_schema)

        async def send(attempt_messages: Sequence[ChatMessage]) -> ChatReply:
            wire: list[dict[str, str]] = []
            if system_text:
                wire.append({"role": "system", "content": system_text})
            wire.extend({"role": m.role, "content": m.text} for m in attempt_messages)
            body: dict[str, Any] = {
                "model": self.model_id,
                "messages": wire,
                "max_tokens": max_tokens,
                "temperature": temperature,
            }
            if self._json_mode and json_schema is not None:
                body["response_format"] = {"type": "json_object"}
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
        try:
            choice = payload["choices"][0]
            content = choice["message"].get("content")
            finish = str(choice.get("finish_reason") or "")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendError(
                f"{self._url} answered without choices[0].message ({exc!r}); is it an "
                "OpenAI-compatible chat-completions endpoint?",
                backend=self.name,
            ) from exc
        if finish == "content_filter":
            raise BackendError(
                f"{self._url}: the content filter blocked the reply; change the input, "
                "retrying will not help",
                backend=self.name,
            )
        if isinstance(content, list):  # content parts, as some servers send them
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        raw_usage = payload.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        return ChatReply(
            text=content if isinstance(content, str) else "",
            input_tokens=int(usage.get("prompt_tokens", 0) or 0),
            output_tokens=int(usage.get("completion_tokens", 0) or 0),
            model=self.name,
            extra={"stop_reason": finish},
        )
