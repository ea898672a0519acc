"""AnthropicChatModel against a fake Messages API (httpx.MockTransport).

Anthropic's API is remote and CI has no network, so a fake transport is the only offline
way to exercise the adapter; it answers in the documented Messages API shapes (success,
``overloaded_error`` 529, ``authentication_error`` 401, a timeout) and records every
request so the tests check the exact URL, headers and body sent. The real HTTP path is
exercised by the OpenAI-compatible test against a real local server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tiermem.errors import ValidationError
from tiermem.llm import ChatMessage, ChatModel, ModelFailedError
from tiermem.llm.chat_anthropic import ANTHROPIC_VERSION, AnthropicChatModel
from tiermem.llm.chat_json import system_prompt_with_schema

MODEL = "claude-3-5-haiku-latest"
ASK = [ChatMessage("user", "Remember: my favourite series is Frieren.")]
SCHEMA = {"type": "object", "properties": {"facts": {"type": "array"}}, "required": ["facts"]}


def message(text: str, *, stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 31, "output_tokens": 7},
    }


def error(status: int, kind: str, text: str) -> httpx.Response:
    body = {"type": "error", "error": {"type": kind, "message": text}}
    return httpx.Response(status, json=body)


class FakeMessagesApi:
    """Answers requests in order from ``outcomes`` and records them."""

    def __init__(self, *outcomes: httpx.Response | Exception) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]


def model_for(
    handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any
) -> AnthropicChatModel:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return AnthropicChatModel(
        MODEL, api_key="sk-ant-test", http_client=client, backoff_base=0.0, **kwargs
    )


async def test_posts_a_messages_request_and_parses_the_json() -> None:
    api = FakeMessagesApi(httpx.Response(200, json=message('{"facts": ["likes Frieren"]}')))
    model = model_for(api)
    assert isinstance(model, ChatModel)
    reply = await model.complete(
        ASK, system="Extract facts.", json_schema=SCHEMA, max_tokens=200, temperature=0.2
    )

    [request] = api.requests
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test"
    assert request.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert api.bodies() == [
        {
            "model": MODEL,
            "max_tokens": 200,
            "temperature": 0.2,
            "system": system_prompt_with_schema("Extract facts.", SCHEMA),
            "messages": [{"role": "user", "content": ASK[0].text}],
        }
    ]
    assert reply.data == {"facts": ["likes Frieren"]}
    assert (reply.input_tokens, reply.output_tokens) == (31, 7)
    assert reply.model == f"anthropic:{MODEL}"


async def test_overloaded_is_retried_then_succeeds() -> None:
    api = FakeMessagesApi(
        error(529, "overloaded_error", "Overloaded"),
        httpx.Response(200, json=message('{"facts": []}')),
    )
    reply = await model_for(api).complete(ASK, json_schema=SCHEMA)
    assert reply.data == {"facts": []}
    assert reply.attempts == 2
    assert len(api.requests) == 2


async def test_a_bad_api_key_is_not_retried() -> None:
    api = FakeMessagesApi(
        error(401, "authentication_error", "invalid x-api-key"),
        httpx.Response(200, json=message('{"facts": []}')),
    )
    with pytest.raises(ModelFailedError, match="authentication_error: invalid x-api-key") as info:
        await model_for(api).complete(ASK, json_schema=SCHEMA)
    assert info.value.retryable is False
    assert "check the API key" in str(info.value)
    assert len(api.requests) == 1


async def test_timeouts_on_every_attempt_are_a_retryable_failure() -> None:
    api = FakeMessagesApi(httpx.ReadTimeout("slow"), httpx.ReadTimeout("slow"))
    with pytest.raises(ModelFailedError, match="did not answer in time") as info:
        await model_for(api, max_attempts=2).complete(ASK)
    assert info.value.retryable is True
    assert info.value.attempts == 2


async def test_a_refusal_is_not_retried() -> None:
    api = FakeMessagesApi(httpx.Response(200, json=message("", stop="refusal")))
    with pytest.raises(ModelFailedError, match="refused to answer"):
        await model_for(api).complete(ASK, json_schema=SCHEMA)


async def test_a_body_that_is_not_json_points_at_the_base_url() -> None:
    api = FakeMessagesApi(httpx.Response(200, text="<html>gateway</html>"))
    with pytest.raises(ModelFailedError, match="is llm_base_url the API root"):
        await model_for(api).complete(ASK)
    assert len(api.requests) == 1


async def test_temperature_above_one_is_refused_before_sending() -> None:
    api = FakeMessagesApi()
    with pytest.raises(ValidationError, match=r"temperature in \[0, 1\]"):
        await model_for(api).complete(ASK, temperature=1.5)
    assert api.requests == []


def test_an_api_key_is_required() -> None:
    with pytest.raises(ValidationError, match="TIERMEM_LLM_API_KEY"):
        AnthropicChatModel(MODEL, api_key="")
