"""OpenAICompatibleChatModel over real HTTP, against a local server started by the test.

The server is a small FastAPI app speaking OpenAI's chat-completions API, run by uvicorn on
a free loopback port in a background thread. It answers from a script (including a 503
and a reply whose JSON is wrapped in a ```json fence) and records each request, so the
adapter's real path runs: httpx connection, JSON encoding, status handling, parsing.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tiermem.llm import ChatMessage, ChatModel, ModelFailedError, open_chat_model
from tiermem.llm.chat_json import system_prompt_with_schema
from tiermem.llm.chat_openai import OpenAICompatibleChatModel
from tiermem.settings import TierMemSettings

MODEL = "llama3.1:8b"
ASK = [ChatMessage("user", "I'm looking for Spy x Family volume 12, under 800 yen.")]
SCHEMA = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
    "required": ["facts"],
}


def completion(content: str, *, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 52, "completion_tokens": 14, "total_tokens": 66},
    }


@dataclass
class Script:
    """What the server answers, in order, and what it was sent."""

    answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def build_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        script.bodies.append(await request.json())
        script.headers.append(dict(request.headers))
        if not script.answers:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=500)
        status, body = script.answers.pop(0)
        return JSONResponse(body, status_code=status)

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(script), log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test's uvicorn server did not start")
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1", script
    uv.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def script(server: tuple[str, Script]) -> Script:
    _, script = server
    script.answers.clear()
    script.bodies.clear()
    script.headers.clear()
    return script


@pytest.fixture
def base_url(server: tuple[str, Script]) -> str:
    return server[0]


async def test_a_503_then_a_fenced_json_reply_over_real_http(base_url: str, script: Script) -> None:
    fenced = 'Here you go:\n```json\n{"facts": ["Spy x Family volume 12", "under 800 yen"]}\n```'
    script.answers += [
        (503, {"error": {"message": "model is loading", "type": "server_error"}}),
        (200, completion(fenced)),
    ]
    model = OpenAICompatibleChatModel(base_url, MODEL, api_key="sk-local", backoff_base=0.0)
    assert isinstance(model, ChatModel)
    try:
        reply = await model.complete(
            ASK, system="Extract facts.", json_schema=SCHEMA, max_tokens=256
        )
    finally:
        await model.aclose()

    assert reply.data == {"facts": ["Spy x Family volume 12", "under 800 yen"]}
    assert reply.text == fenced
    assert reply.attempts == 2
    assert (reply.input_tokens, reply.output_tokens) == (52, 14)
    assert reply.extra["stop_reason"] == "stop"
    sent = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system_prompt_with_schema("Extract facts.", SCHEMA)},
            {"role": "user", "content": ASK[0].text},
        ],
        "max_tokens": 256,
        "temperature": 0.0,
    }
    assert script.bodies == [sent, sent]  # no response_format unless json_mode is on
    assert script.headers[0]["authorization"] == "Bearer sk-local"


async def test_json_mode_sends_response_format(base_url: str, script: Script) -> None:
    script.answers.append((200, completion('{"facts": []}')))
    model = OpenAICompatibleChatModel(base_url, MODEL, json_mode=True)
    try:
        reply = await model.complete(ASK, json_schema=SCHEMA)
    finally:
        await model.aclose()
    assert reply.data == {"facts": []}
    assert script.bodies[0]["response_format"] == {"type": "json_object"}
    assert "authorization" not in script.headers[0]  # a local server needs no key


async def test_a_400_is_not_retried(base_url: str, script: Script) -> None:
    script.answers += [
        (400, {"error": {"message": "response_format is not supported", "type": "invalid"}}),
        (200, completion('{"facts": []}')),
    ]
    model = OpenAICompatibleChatModel(base_url, MODEL, json_mode=True, backoff_base=0.0)
    try:
        with pytest.raises(ModelFailedError, match="HTTP 400: invalid: response_format") as info:
            await model.complete(ASK, json_schema=SCHEMA)
    finally:
        await model.aclose()
    assert info.value.retryable is False
    assert "turn json_mode off" in str(info.value)
    assert len(script.bodies) == 1


async def test_the_factory_builds_a_working_model_from_settings(
    base_url: str, script: Script
) -> None:
    script.answers.append((200, completion('{"facts": ["from settings"]}')))
    settings = TierMemSettings(llm="openai", llm_model=MODEL, llm_base_url=base_url)
    model = open_chat_model(settings)
    assert isinstance(model, OpenAICompatibleChatModel)
    try:
        reply = await model.complete(ASK, json_schema=SCHEMA)
    finally:
        await model.aclose()
    assert reply.data == {"facts": ["from settings"]}


async def test_a_server_that_is_not_running_is_a_retryable_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = OpenAICompatibleChatModel(
        f"http://127.0.0.1:{port}/v1", MODEL, max_attempts=2, backoff_base=0.0
    )
    try:
        with pytest.raises(ModelFailedError, match="is the server running") as info:
            await model.complete(ASK)
    finally:
        await model.aclose()
    assert info.value.retryable is True
    assert info.value.attempts == 2
