"""BedrockConverseModel against a real botocore ``bedrock-runtime`` client.

Bedrock cannot be reached from CI (no AWS account, no network), so its answers come from
botocore's :class:`~botocore.stub.Stubber`: each request still goes through botocore's
parameter validation for ``Converse`` and is compared with the exact parameters we expect;
the stubbed answers must match the service model's response shape. One test points the
client at a closed loopback port to see a real connection failure.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import botocore.session as botocore_session
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber

from tiermem.llm import ChatMessage, ChatModel, ModelFailedError
from tiermem.llm.chat_bedrock import BedrockConverseModel
from tiermem.llm.chat_json import system_prompt_with_schema

MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
SESSION = botocore_session.get_session()  # one session: it caches the service model
ASK = [ChatMessage("user", "I want One Piece volume 105, budget 1500 yen.")]
SCHEMA = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
    "required": ["facts"],
}


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


@pytest.fixture
def stub(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def model_for(client: Any, **kwargs: Any) -> BedrockConverseModel:
    return BedrockConverseModel(MODEL, client=client, backoff_base=0.0, **kwargs)


def answer(text: str, *, stop: str = "end_turn", tokens: tuple[int, int] = (40, 12)) -> Any:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
        "usage": {
            "inputTokens": tokens[0],
            "outputTokens": tokens[1],
            "totalTokens": sum(tokens),
        },
        "metrics": {"latencyMs": 321},
    }


def expected(messages: list[dict[str, Any]] | Any, *, max_tokens: int = 1024) -> dict[str, Any]:
    return {
        "modelId": MODEL,
        "messages": messages,
        "system": [{"text": system_prompt_with_schema("Extract facts.", SCHEMA)}],
        "inferenceConfig": {"maxTokens": max_tokens, "temperature": 0.0},
    }


WIRE_ASK = [{"role": "user", "content": [{"text": ASK[0].text}]}]


async def test_sends_a_converse_request_and_parses_the_json(client: Any, stub: Stubber) -> None:
    reply_text = '```json\n{"facts": ["One Piece volume 105", "budget 1500 yen"]}\n```'
    stub.add_response("converse", answer(reply_text), expected(WIRE_ASK, max_tokens=300))
    model = model_for(client)
    assert isinstance(model, ChatModel)

    reply = await model.complete(ASK, system="Extract facts.", json_schema=SCHEMA, max_tokens=300)

    assert reply.data == {"facts": ["One Piece volume 105", "budget 1500 yen"]}
    assert reply.text == reply_text
    assert (reply.input_tokens, reply.output_tokens) == (40, 12)
    assert reply.model == model.name == f"bedrock:{MODEL}"
    assert reply.extra["stop_reason"] == "end_turn"
    assert reply.attempts == 1


async def test_the_schema_is_in_the_system_prompt() -> None:
    system = system_prompt_with_schema("Extract facts.", SCHEMA)
    assert system is not None
    assert system.startswith("Extract facts.")
    assert json.dumps(SCHEMA, indent=2, sort_keys=True) in system
    assert "exactly one JSON object" in system
    assert system_prompt_with_schema("Plain.", None) == "Plain."


async def test_throttling_is_retried_then_succeeds(client: Any, stub: Stubber) -> None:
    stub.add_client_error(
        "converse",
        service_error_code="ThrottlingException",
        service_message="Too many requests, please wait before trying again.",
        http_status_code=429,
        expected_params=expected(WIRE_ASK),
    )
    stub.add_response("converse", answer('{"facts": []}', tokens=(40, 5)), expected(WIRE_ASK))
    reply = await model_for(client).complete(ASK, system="Extract facts.", json_schema=SCHEMA)
    assert reply.data == {"facts": []}  # nothing to extract: a result
    assert reply.attempts == 2
    assert reply.input_tokens == 40  # a throttled call reports no usage


async def test_access_denied_is_a_model_failure_and_not_retried(client: Any, stub: Stubber) -> None:
    stub.add_client_error(
        "converse",
        service_error_code="AccessDeniedException",
        service_message="You don't have access to the model with the specified model ID.",
        http_status_code=403,
    )
    model = model_for(client, max_attempts=3)
    with pytest.raises(ModelFailedError, match="AccessDeniedException") as info:
        await model.complete(ASK, system="Extract facts.", json_schema=SCHEMA)
    assert info.value.retryable is False
    assert info.value.attempts == 1
    assert "enable access to the model in the Bedrock console" in str(info.value)
    # The fixture's assert_no_pending_responses shows one call was made; a retry would
    # have found no stubbed answer and failed with a different error.


async def test_unparseable_json_then_good_json(client: Any, stub: Stubber) -> None:
    prose = "I found a budget and a volume number."
    stub.add_response("converse", answer(prose), expected(WIRE_ASK))
    corrected = [
        *WIRE_ASK,
        {"role": "assistant", "content": [{"text": prose}]},
        {"role": "user", "content": [{"text": ANY}]},
    ]
    stub.add_response(
        "converse", answer('{"facts": ["budget 1500 yen"]}', tokens=(90, 9)), expected(corrected)
    )
    reply = await model_for(client).complete(ASK, system="Extract facts.", json_schema=SCHEMA)
    assert reply.data == {"facts": ["budget 1500 yen"]}
    assert reply.attempts == 2
    assert (reply.input_tokens, reply.output_tokens) == (130, 21)


async def test_unparseable_json_on_every_attempt_fails(client: Any, stub: Stubber) -> None:
    for _ in range(2):
        stub.add_response("converse", answer("no JSON, sorry"), None)
    with pytest.raises(ModelFailedError, match="no usable JSON object in 2 attempts"):
        await model_for(client, max_attempts=2).complete(ASK, json_schema=SCHEMA)


async def test_a_guardrail_block_is_not_retried(client: Any, stub: Stubber) -> None:
    stub.add_response("converse", answer("Sorry.", stop="guardrail_intervened"), None)
    with pytest.raises(ModelFailedError, match="guardrail blocked the reply") as info:
        await model_for(client).complete(ASK, json_schema=SCHEMA)
    assert info.value.retryable is False


async def test_runs_of_one_role_are_merged_for_converse(client: Any, stub: Stubber) -> None:
    messages = [
        ChatMessage("user", "first"),
        ChatMessage("user", "second"),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "third"),
    ]
    wire = [
        {"role": "user", "content": [{"text": "first\n\nsecond"}]},
        {"role": "assistant", "content": [{"text": "ok"}]},
        {"role": "user", "content": [{"text": "third"}]},
    ]
    stub.add_response(
        "converse",
        answer("plain text"),
        {"modelId": MODEL, "messages": wire, "inferenceConfig": ANY},
    )
    reply = await model_for(client).complete(messages)
    assert reply.text == "plain text"
    assert reply.data is None


async def test_a_closed_port_is_retried_then_a_retryable_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = bedrock_client(
        endpoint_url=f"http://127.0.0.1:{port}",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2),
    )
    with pytest.raises(ModelFailedError, match="failed 2 times in a row") as info:
        await model_for(client, max_attempts=2).complete(ASK)
    assert info.value.retryable is True
    assert "cannot reach Bedrock" in str(info.value)
    client.close()


def test_the_client_it_builds_leaves_retries_to_tiermem() -> None:
    model = BedrockConverseModel(MODEL, region_name="us-east-1", timeout=12.0)
    built = model._build_client()
    assert built.meta.config.retries["total_max_attempts"] == 1
    assert built.meta.config.read_timeout == 12.0
    assert built.meta.region_name == "us-east-1"
