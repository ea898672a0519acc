"""The shared retry loop and the two outcomes, driven through ScriptedChatModel.

ScriptedChatModel is the library's own deterministic model: it runs the real request
checks, parsing and retry loop, and only the provider call is scripted. Faults a real
provider would produce (throttling, refusals, prose instead of JSON) are queued as replies.
Where a test needs to see the backoff waits, ``pause`` is replaced by a recorder so the test
observes them without sleeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tiermem.errors import BackendError, BackendTimeoutError, ValidationError
from tiermem.llm import (
    ChatMessage,
    ChatModel,
    ChatReply,
    ModelFailedError,
    ScriptedChatModel,
    ScriptExhaustedError,
    chat_json,
)
from tiermem.llm.chat_json import complete_with_retries

ASK = [ChatMessage("user", "Summarize: I want volume 3 of Naruto, budget 2000 yen.")]
SCHEMA = {
    "type": "object",
    "properties": {"facts": {"type": "array"}},
    "required": ["facts"],
}


def throttled() -> BackendError:
    return BackendError("HTTP 429: slow down", backend="scripted", retryable=True)


async def test_a_throttled_attempt_is_retried_and_the_reply_parsed() -> None:
    model = ScriptedChatModel([throttled(), '```json\n{"facts": ["volume 3"],}\n```'])
    reply = await model.complete(ASK, json_schema=SCHEMA)
    assert reply.data == {"facts": ["volume 3"]}
    assert reply.attempts == 2
    assert len(model.calls) == 2
    assert model.calls[1].messages == tuple(ASK)  # a transport retry resends as it was


async def test_nothing_to_extract_is_a_reply_not_a_failure() -> None:
    model = ScriptedChatModel([{"facts": []}])
    reply = await model.complete(ASK, json_schema=SCHEMA)
    assert reply.data == {"facts": []}
    assert reply.attempts == 1


async def test_a_refusal_is_not_retried() -> None:
    denied = BackendError("HTTP 403: access denied", backend="scripted", retryable=False)
    model = ScriptedChatModel([denied, {"facts": []}])
    with pytest.raises(ModelFailedError, match="refused the request: HTTP 403") as info:
        await model.complete(ASK, json_schema=SCHEMA)
    assert info.value.retryable is False
    assert info.value.attempts == 1
    assert info.value.__cause__ is denied
    assert model.pending == 1  # the good reply was never asked for


async def test_transient_failures_on_every_attempt_end_in_a_retryable_model_failure() -> None:
    model = ScriptedChatModel(
        [throttled(), BackendTimeoutError("no answer", backend="scripted"), throttled()],
        name="scripted:m",
    )
    with pytest.raises(ModelFailedError, match="failed 3 times in a row") as info:
        await model.complete(ASK, json_schema=SCHEMA)
    assert info.value.retryable is True
    assert info.value.attempts == 3
    assert info.value.model == "scripted:m"
    assert "run the job again later" in str(info.value)


async def test_unparseable_json_is_retried_with_the_bad_reply_and_a_correction() -> None:
    model = ScriptedChatModel(["Sorry, I cannot format that.", {"facts": ["budget 2000 yen"]}])
    reply = await model.complete(ASK, system="Extract facts.", json_schema=SCHEMA)
    assert reply.data == {"facts": ["budget 2000 yen"]}
    assert reply.attempts == 2
    second = model.calls[1].messages
    assert second[: len(ASK)] == tuple(ASK)
    assert second[-2] == ChatMessage("assistant", "Sorry, I cannot format that.")
    assert second[-1].role == "user"
    assert "holds no JSON object" in second[-1].text
    assert model.calls[1].system == "Extract facts."


async def test_an_object_missing_required_properties_counts_as_a_failed_attempt() -> None:
    model = ScriptedChatModel([{"summary": "no facts key"}, {"facts": []}])
    reply = await model.complete(ASK, json_schema=SCHEMA)
    assert reply.attempts == 2
    assert "lacks required properties" in model.calls[1].messages[-1].text


async def test_unparseable_json_on_every_attempt_is_a_model_failure() -> None:
    model = ScriptedChatModel(["no", "still no", "[1, 2]"], max_attempts=3)
    with pytest.raises(ModelFailedError, match="no usable JSON object in 3 attempts") as info:
        await model.complete(ASK, json_schema=SCHEMA)
    assert info.value.retryable is True
    assert "list, not an object" in str(info.value)


async def test_an_empty_reply_is_retried_without_a_correction() -> None:
    model = ScriptedChatModel(["", {"facts": []}])
    await model.complete(ASK, json_schema=SCHEMA)
    assert model.calls[1].messages == tuple(ASK)


async def test_a_queued_model_failure_ends_the_call_at_once() -> None:
    model = ScriptedChatModel([ModelFailedError("down for maintenance"), {"facts": []}])
    with pytest.raises(ModelFailedError, match="down for maintenance"):
        await model.complete(ASK, json_schema=SCHEMA)
    assert len(model.calls) == 1


async def test_a_bug_is_not_disguised_as_a_model_failure() -> None:
    model = ScriptedChatModel([RuntimeError("bug in the caller")])
    with pytest.raises(RuntimeError, match="bug in the caller"):
        await model.complete(ASK)


async def test_without_a_schema_the_text_is_returned_as_is() -> None:
    model = ScriptedChatModel(["Plain prose {not json}."])
    reply = await model.complete(ASK)
    assert reply.text == "Plain prose {not json}."
    assert reply.data is None


async def test_respond_computes_replies_from_the_request() -> None:
    def respond(messages: Sequence[ChatMessage], system: str | None) -> dict[str, list[str]]:
        return {"facts": [f"{system}: {messages[-1].text[:9]}"]}

    model = ScriptedChatModel(["first from the queue"], respond=respond)
    first = await model.complete(ASK)
    second = await model.complete(ASK, system="S", json_schema=SCHEMA, max_tokens=50)
    assert first.text == "first from the queue"
    assert second.data == {"facts": ["S: Summarize"]}
    assert model.calls[1].max_tokens == 50
    assert model.calls[1].json_schema == SCHEMA


async def test_an_exhausted_script_is_a_test_error() -> None:
    model = ScriptedChatModel(["only one"])
    await model.complete(ASK)
    with pytest.raises(ScriptExhaustedError, match="no reply left"):
        await model.complete(ASK)


async def test_token_usage_is_summed_over_attempts() -> None:
    model = ScriptedChatModel(["not json here", {"facts": []}])
    reply = await model.complete(ASK, json_schema=SCHEMA)
    first_prompt = sum(len(m.text.split()) for m in model.calls[0].messages)
    second_prompt = sum(len(m.text.split()) for m in model.calls[1].messages)
    assert reply.input_tokens == first_prompt + second_prompt
    assert reply.output_tokens == 3 + 2  # words of "not json here" and of {"facts": []}


@pytest.mark.parametrize(
    ("messages", "kwargs", "reason"),
    [
        ([], {}, "messages is empty"),
        ([ChatMessage("assistant", "hi")], {}, "first message must be the user's"),
        (ASK, {"max_tokens": 0}, "max_tokens must be >= 1"),
        (ASK, {"temperature": 2.5}, "temperature must be within"),
        (ASK, {"json_schema": {"type": "array"}}, "describe an object"),
        (["just a string"], {}, "expected ChatMessage"),
    ],
)
async def test_malformed_requests_are_refused_before_any_call(
    messages: list[ChatMessage], kwargs: dict[str, object], reason: str
) -> None:
    model = ScriptedChatModel([{"facts": []}])
    with pytest.raises(ValidationError, match=reason):
        await model.complete(messages, **kwargs)  # type: ignore[arg-type]
    assert model.calls == []


def test_the_scripted_model_is_a_chat_model() -> None:
    assert isinstance(ScriptedChatModel(), ChatModel)


async def test_waits_between_attempts_use_the_shared_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[tuple[int, float, float]] = []

    async def record(attempt: int, *, base: float, cap: float) -> None:
        waits.append((attempt, base, cap))

    monkeypatch.setattr(chat_json, "pause", record)
    outcomes: list[ChatReply | BackendError] = [
        throttled(),
        ChatReply(text="prose"),
        ChatReply(text='{"facts": []}'),
    ]

    async def send(messages: Sequence[ChatMessage]) -> ChatReply:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    reply = await complete_with_retries(
        send, ASK, model="m", json_schema=SCHEMA, max_attempts=4, backoff_base=0.5, backoff_cap=8
    )
    assert reply.attempts == 3
    assert waits == [(0, 0.5, 8), (1, 0.5, 8)]  # none after the successful attempt


async def test_a_reply_cut_off_at_max_tokens_says_so() -> None:
    async def send(messages: Sequence[ChatMessage]) -> ChatReply:
        return ChatReply(text='{"facts": ["a", "b', extra={"stop_reason": "max_tokens"})

    with pytest.raises(ModelFailedError, match="cut off at max_tokens: raise max_tokens"):
        await complete_with_retries(
            send, ASK, model="m", json_schema=SCHEMA, max_attempts=2, backoff_base=0.0
        )


async def test_max_attempts_must_be_positive() -> None:
    async def send(messages: Sequence[ChatMessage]) -> ChatReply:
        raise AssertionError("must not be called")

    with pytest.raises(ValidationError, match="max_attempts"):
        await complete_with_retries(send, ASK, model="m", json_schema=None, max_attempts=0)
