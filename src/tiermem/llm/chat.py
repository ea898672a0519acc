"""The chat-model protocol every LLM adapter implements (Bedrock Converse, OpenAI-compatible
endpoints, Anthropic, a scripted model for tests).

tiermem asks a model for JSON that follows a schema (summaries, structured memory); an
adapter sends the prompt, retries transient failures with backoff, and parses the reply
tolerantly. Two outcomes are kept apart on purpose:

* :class:`ModelFailedError` -- the model could not be reached or never produced usable output
  after its retries (a :class:`~tiermem.errors.TierMemError`: callers log it and retry the
  job later; nothing is written);
* an empty result -- the model answered and there was nothing to extract. That is data, not
  an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from tiermem.errors import TierMemError
from tiermem.models.base import JsonValue

__all__ = ["ChatMessage", "ChatModel", "ChatReply", "ModelFailedError"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True, slots=True)
class ChatReply:
    """A model's answer: its text, the parsed JSON object when a schema was asked for, and
    the token usage the provider reported (0 when it reported none).

    ``input_tokens``/``output_tokens`` are summed over every attempt (what was paid for);
    ``attempts`` is how many calls it took; ``extra`` holds provider details such as the
    ``stop_reason``."""

    text: str
    data: Mapping[str, JsonValue] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    attempts: int = 1
    extra: Mapping[str, JsonValue] = field(default_factory=dict)


class ModelFailedError(TierMemError):
    """The model was unreachable, refused, or returned unusable output after every retry.

    ``model`` names the adapter (``provider:model``), ``attempts`` how many calls were made,
    and ``retryable`` whether the last failure was transient (throttling, 5xx, timeout,
    unparseable output), so running the job again later may help; False means the
    configuration is wrong (access denied, unknown model, bad request) and needs fixing.
    """

    def __init__(
        self, message: str, *, model: str = "", attempts: int = 0, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.model = model
        self.attempts = attempts
        self.retryable = retryable


@runtime_checkable
class ChatModel(Protocol):
    """One LLM endpoint."""

    name: str
    """``provider:model`` for logs and stats, e.g. ``bedrock:anthropic.claude-3-5-haiku``."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        system: str | None = None,
        json_schema: Mapping[str, JsonValue] | None = None,
        max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> ChatReply:
        """The model's reply to ``messages``.

        With ``json_schema`` the model is asked for one JSON object following it; the reply's
        ``data`` is that object, parsed tolerantly (code fences, prose around the object,
        trailing commas). A reply that cannot be parsed counts as a failed attempt.

        Raises:
            ValidationError: ``messages`` is empty, does not start with a user message, or
                ``max_tokens``/``temperature`` is out of range (nothing was sent).
            ModelFailedError: after the adapter's retries.
        """
        ...
