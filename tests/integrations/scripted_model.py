"""A Strands model provider that streams canned replies: no network, no credentials.

Each call pops the next :class:`Reply` and streams it the way Bedrock Converse does (message
start, content blocks with deltas, message stop, usage metadata). With ``max_chars`` it
behaves like a provider with a small context window: an input whose content is longer (as
JSON) raises Strands' ``ContextWindowOverflowException`` before anything is streamed. Every
input it answered is kept in ``calls``, every input it refused in ``refused``, and both in
order in ``log`` (``("answered" | "refused", messages)``).
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands.models.model import Model
from strands.types.exceptions import ContextWindowOverflowException


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: dict[str, Any]
    tool_use_id: str


@dataclass(frozen=True)
class Reply:
    text: str = ""
    tools: tuple[ToolCall, ...] = ()
    redact_user: str | None = None
    """Ask Strands to redact the user's message (a guardrail intervention)."""


def say(text: str) -> Reply:
    return Reply(text=text)


def call(name: str, tool_use_id: str, text: str = "", **arguments: Any) -> Reply:
    return Reply(text=text, tools=(ToolCall(name, arguments, tool_use_id),))


def content_chars(messages: Sequence[Any]) -> int:
    return sum(len(json.dumps(m["content"], default=str)) for m in messages)


@dataclass
class ScriptedModel(Model):
    replies: deque[Reply]
    max_chars: int | None = None
    calls: list[list[dict[str, Any]]] = field(default_factory=list)
    refused: list[list[dict[str, Any]]] = field(default_factory=list)
    log: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=lambda: {"model_id": "scripted"})

    @classmethod
    def of(cls, *replies: Reply, max_chars: int | None = None) -> ScriptedModel:
        return cls(deque(replies), max_chars)

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> Any:
        return self.config

    async def structured_output(  # type: ignore[override]
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError("the scripted model has no structured output")
        yield {}  # pragma: no cover - makes this an async generator

    async def stream(  # type: ignore[override]
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterable[dict[str, Any]]:
        seen = copy.deepcopy(list(messages))
        size = content_chars(seen)
        if self.max_chars is not None and size > self.max_chars:
            self.refused.append(seen)
            self.log.append(("refused", seen))
            raise ContextWindowOverflowException(
                f"input of {size} characters is over the scripted window of {self.max_chars}"
            )
        self.calls.append(seen)
        self.log.append(("answered", seen))
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        reply = self.replies.popleft()
        yield {"messageStart": {"role": "assistant"}}
        if reply.redact_user is not None:
            yield {"redactContent": {"redactUserContentMessage": reply.redact_user}}
        if reply.text:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": reply.text}}}
            yield {"contentBlockStop": {}}
        for tool in reply.tools:
            start = {"toolUse": {"toolUseId": tool.tool_use_id, "name": tool.name}}
            yield {"contentBlockStart": {"start": start}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(tool.input)}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use" if reply.tools else "end_turn"}}
        usage = {"inputTokens": size // 4, "outputTokens": 10, "totalTokens": size // 4 + 10}
        yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}}
