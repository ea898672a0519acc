"""A deterministic chat model for tests and demos: it answers from a script.

It runs the same request checks, JSON parsing and retry loop as the real adapters
(:mod:`tiermem.llm.chat_json`), so code written against it meets the same two outcomes:
:class:`~tiermem.llm.chat.ModelFailedError` when the script makes the model fail, and a
reply whose ``data`` may be an empty result. Each attempt takes the next scripted reply::

    model = ScriptedChatModel([
        BackendError("throttled", backend="scripted", retryable=True),  # attempt 1: retried
        "```json\\n{\\"facts\\": [],}\\n```",                          # attempt 2: parsed
    ])
    reply = await model.complete([ChatMessage("user", "...")], json_schema=schema)
    assert reply.data == {"facts": []} and reply.attempts == 2
    model.calls[-1].messages  # what it was asked

A queued reply is a ``str`` (the model's text), a ``Mapping`` (sent as its JSON text) or an
exception (raised by that attempt: a retryable :class:`~tiermem.errors.BackendError` is
retried, a :class:`ModelFailedError` ends the call at once). When the queue is empty,
``respond(messages, system)`` computes the reply; with neither, the script is exhausted and
the call raises :class:`ScriptExhaustedError` -- a mistake in the test, not a model failure.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tiermem.llm.chat import ChatMessage, ChatReply
from tiermem.llm.chat_json import check_chat_request, complete_with_retries
from tiermem.models.base import JsonValue

__all__ = ["ScriptExhaustedError", "ScriptedCall", "ScriptedChatModel"]

ScriptedReply = str | Mapping[str, JsonValue] | Exception
Responder = Callable[[Sequence[ChatMessage], str | None], str | Mapping[str, JsonValue]]


class ScriptExhaustedError(LookupError):
    """The scripted model was called more often than its script allows (a test bug)."""


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One attempt the scripted model received, as the adapter would have sent it."""

    messages: tuple[ChatMessage, ...]
    system: str | None
    json_schema: Mapping[str, JsonValue] | None
    max_tokens: int
    temperature: float


class ScriptedChatModel:
    """A :class:`~tiermem.llm.chat.ChatModel` that replies from a queue or a function.

    Args:
        replies: answers for successive attempts (see the module docstring).
        respond: computes an answer from ``(messages, system)`` once the queue is empty.
        name: this model's ``name`` (and ``ChatReply.model``).
        max_attempts: attempts per :meth:`complete`, as ``llm_max_attempts`` for real ones.

    ``system`` given to ``respond`` and recorded in :attr:`calls` is the caller's system
    prompt, without the schema instructions the real adapters append.
    """

    def __init__(
        self,
        replies: Sequence[ScriptedReply] = (),
        *,
        respond: Responder | None = None,
        name: str = "scripted",
        max_attempts: int = 3,
    ) -> None:
        self.name = name
        self.calls: list[ScriptedCall] = []
        self._replies: deque[ScriptedReply] = deque(replies)
        self._respond = respond
        self._max_attempts = max_attempts

    @property
    def pending(self) -> int:
        """Queued replies not used yet."""
        return len(self._replies)

    def add_replies(self, *replies: ScriptedReply) -> None:
        """Queue more answers."""
        self._replies.extend(replies)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        system: str | None = None,
        json_schema: Mapping[str, JsonValue] | None = None,
        max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> ChatReply:
        """The next scripted answer, through the shared parsing and retry loop.

        Raises:
            ValidationError: the request is malformed (as for every adapter).
            ModelFailedError: the script made every attempt fail, or queued one.
            ScriptExhaustedError: no reply is queued and there is no ``respond``.
        """
        batch = check_chat_request(
            messages, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )

        async def send(attempt_messages: Sequence[ChatMessage]) -> ChatReply:
            self.calls.append(
                ScriptedCall(
                    messages=tuple(attempt_messages),
                    system=system,
                    json_schema=json_schema,
                    max_tokens=max_tokens,
                    temperature=temperature,
                )
            )
            text = self._next_text(attempt_messages, system)
            prompt = sum(len(m.text.split()) for m in attempt_messages)
            return ChatReply(
                text=text,
                input_tokens=prompt,
                output_tokens=len(text.split()),
                model=self.name,
                extra={"stop_reason": "end_turn"},
            )

        # No backoff sleeps: a script has nothing to wait for.
        return await complete_with_retries(
            send,
            batch,
            model=self.name,
            json_schema=json_schema,
            max_attempts=self._max_attempts,
            backoff_base=0.0,
            backoff_cap=0.0,
        )

    def _next_text(self, messages: Sequence[ChatMessage], system: str | None) -> str:
        if self._replies:
            reply: ScriptedReply = self._replies.popleft()
        elif self._respond is not None:
            reply = self._respond(messages, system)
        else:
            raise ScriptExhaustedError(
                f"ScriptedChatModel {self.name!r} has no reply left after {len(self.calls)} "
                "calls; queue more replies or pass respond="
            )
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, str):
            return reply
        return json.dumps(reply, ensure_ascii=False)
