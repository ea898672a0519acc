"""What every chat adapter shares: request checks, the JSON-schema prompt, tolerant parsing of
the model's JSON, and the one retry loop.

An adapter only knows how to send one request and map its client's errors to
:class:`~tiermem.errors.BackendError` (``retryable`` set for throttling, 5xx, timeouts).
:func:`complete_with_retries` does the rest, the same way for every provider:

* a retryable :class:`~tiermem.errors.BackendError` is retried after
  :func:`tiermem.retry.pause` (the project's one backoff);
* a reply that holds no usable JSON object (when a schema was asked for) is retried with the
  bad reply and a short correction appended to the conversation;
* a non-retryable error (access denied, unknown model, bad request) stops at once;
* whatever stops the loop becomes :class:`~tiermem.llm.chat.ModelFailedError`.

A reply that parses to a valid object with empty values (``{"facts": []}``) is a success:
"nothing to extract" is data, "the model failed" is the error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tiermem.errors import BackendError, TierMemError, ValidationError
from tiermem.llm.chat import ChatMessage, ChatReply, ModelFailedError
from tiermem.models.base import JsonValue
from tiermem.retry import pause

__all__ = [
    "ReplyParseError",
    "SendFn",
    "check_chat_request",
    "check_reply_shape",
    "complete_with_retries",
    "merge_consecutive_roles",
    "parse_json_object",
    "system_prompt_with_schema",
]

logger = logging.getLogger(__name__)

SendFn = Callable[[Sequence[ChatMessage]], Awaitable[ChatReply]]
"""One request to the provider: the messages to send -> the reply's text, usage and extra
(``data`` left None). Raises BackendError (``retryable`` set) or ModelFailedError."""

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_CORRECTION = (
    "Your previous reply was not usable: {reason}. Reply again with only one JSON object "
    "that follows the schema, with no other text and no code fences."
)


class ReplyParseError(TierMemError, ValueError):
    """The model's text holds no single usable JSON object. Inside the retry loop this is a
    failed attempt; after the last attempt it becomes :class:`ModelFailedError`."""


# ------------------------------------------------------------------------- requests


def check_chat_request(
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int,
    temperature: float,
    json_schema: Mapping[str, JsonValue] | None = None,
) -> list[ChatMessage]:
    """The messages as a list, after checking the request every adapter must refuse.

    Raises:
        ValidationError: no messages, a non-ChatMessage, a first message that is not the
            user's, ``max_tokens`` < 1, ``temperature`` outside [0, 2], or a schema whose
            top level is not an object.
    """
    if isinstance(messages, (str, bytes)):
        raise ValidationError("messages must be a sequence of ChatMessage, not a string")
    batch = list(messages)
    if not batch:
        raise ValidationError("messages is empty; send at least one user message")
    for i, message in enumerate(batch):
        if not isinstance(message, ChatMessage):
            raise ValidationError(
                f"message {i} is a {type(message).__name__}, expected ChatMessage"
            )
        if message.role not in ("user", "assistant"):
            raise ValidationError(f"message {i} has role {message.role!r}; use user or assistant")
    if batch[0].role != "user":
        raise ValidationError(
            "the first message must be the user's (Bedrock and Anthropic refuse otherwise); "
            "put instructions in system="
        )
    if max_tokens < 1:
        raise ValidationError(f"max_tokens must be >= 1, got {max_tokens}")
    if not 0.0 <= temperature <= 2.0:
        raise ValidationError(f"temperature must be within [0, 2], got {temperature}")
    if json_schema is not None:
        kind = json_schema.get("type", "object")
        if kind != "object":
            raise ValidationError(
                f"json_schema must describe an object at the top level, not {kind!r}; "
                "wrap the value in an object property"
            )
    return batch


def merge_consecutive_roles(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Messages with runs of one role joined by a blank line, for providers that require
    user and assistant to alternate (Bedrock Converse)."""
    merged: list[ChatMessage] = []
    for message in messages:
        if merged and merged[-1].role == message.role:
            merged[-1] = ChatMessage(message.role, merged[-1].text + "\n\n" + message.text)
        else:
            merged.append(message)
    return merged


def system_prompt_with_schema(
    system: str | None, json_schema: Mapping[str, JsonValue] | None
) -> str | None:
    """``system`` with the schema and the reply-format instructions appended (unchanged when
    no schema was asked for). Prompt-based rather than tool forcing, so it works the same on
    every provider and every OpenAI-compatible server."""
    if json_schema is None:
        return system
    schema_text = json.dumps(json_schema, indent=2, sort_keys=True, ensure_ascii=False)
    instructions = (
        "Reply with exactly one JSON object that follows this JSON schema, and nothing else: "
        "no prose, no code fences. When there is nothing to report, reply with the object "
        "whose lists are empty.\n\nJSON schema:\n" + schema_text
    )
    return f"{system.rstrip()}\n\n{instructions}" if system else instructions


# -------------------------------------------------------------------------- parsing


def parse_json_object(text: str) -> dict[str, JsonValue]:
    """The one JSON object in a model's reply, found tolerantly.

    Accepted: a bare object; one inside a Markdown code fence (```` ```json ````); an object
    with prose before or after it; trailing commas before ``}`` or ``]``. The same object
    repeated counts once. Not accepted (:class:`ReplyParseError`): no object at all, a top
    level that is an array or a scalar, an object cut off (a truncated reply), or two
    different objects (ambiguous: the model may have echoed the schema or an example).

    Raises:
        ReplyParseError: see above; the message says which.
    """
    stripped = text.strip()
    if not stripped:
        raise ReplyParseError("the reply is empty")
    fenced = [m.group(1).strip() for m in _FENCE.finditer(stripped)]
    for region in (stripped, *fenced):
        # Fast path: the reply, or a fence, is exactly one JSON value.
        whole = _loads(region)
        if isinstance(whole, dict):
            return whole
        if whole is not None:
            raise ReplyParseError(
                f"the reply is a JSON {type(whole).__name__}, not an object; expected one object"
            )
    # A fence that is not exactly one value is not trusted as a boundary: a JSON string may
    # itself contain ``` and cut it short. Scan the whole reply, strings respected, instead.
    found = _objects_in(stripped)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ReplyParseError(
            f"the reply holds {len(found)} different JSON objects; expected exactly one"
        )
    if "{" in stripped:
        raise ReplyParseError(
            "the reply has no complete JSON object (cut off, or not valid JSON); "
            f"it begins {stripped[:80]!r}"
        )
    raise ReplyParseError(f"the reply holds no JSON object; it begins {stripped[:80]!r}")


def _loads(text: str) -> Any:
    """``text`` as JSON (with trailing commas removed if needed), or None."""
    for candidate in (text, _drop_trailing_commas(text)):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def _objects_in(text: str) -> list[dict[str, JsonValue]]:
    """The distinct top-level JSON objects in ``text``, in order of appearance."""
    found: list[dict[str, JsonValue]] = []
    start = text.find("{")
    while start != -1:
        end = _matching_brace(text, start)
        value = _loads(text[start : end + 1]) if end != -1 else None
        if isinstance(value, dict):
            if value not in found:
                found.append(value)
            start = text.find("{", end + 1)
        else:
            # Prose such as "use {name}" or a cut-off object: look at the next brace.
            start = text.find("{", start + 1)
    return found


def _matching_brace(text: str, start: int) -> int:
    """The index of the ``}`` closing the ``{`` at ``start``, or -1 (braces inside JSON
    strings do not count)."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _drop_trailing_commas(text: str) -> str:
    """``text`` without commas that stand (after whitespace) before ``}`` or ``]``, outside
    JSON strings."""
    out: list[str] = []
    in_string = False
    escaped = False
    for i, char in enumerate(text):
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == ",":
            rest = text[i + 1 :].lstrip()
            if rest[:1] in ("}", "]"):
                continue
        out.append(char)
    return "".join(out)


def check_reply_shape(data: Mapping[str, JsonValue], json_schema: Mapping[str, JsonValue]) -> None:
    """Check the parsed object against the top level of ``json_schema``: every ``required``
    property is present and every property has its declared JSON ``type``. Deeper validation
    is the caller's (it knows its model); this catches the replies that are certainly wrong,
    such as an echoed schema or a different object, so they are retried.

    Raises:
        ReplyParseError: a required property is missing or a property has the wrong type.
    """
    required = json_schema.get("required")
    if isinstance(required, list):
        missing = [name for name in required if isinstance(name, str) and name not in data]
        if missing:
            raise ReplyParseError(f"the JSON object lacks required properties {missing}")
    properties = json_schema.get("properties")
    if not isinstance(properties, Mapping):
        return
    for name, spec in properties.items():
        if name not in data or not isinstance(spec, Mapping):
            continue
        declared = spec.get("type")
        kinds = [declared] if isinstance(declared, str) else declared
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            continue
        value = data[name]
        if not any(_is_json_type(value, kind) for kind in kinds):
            raise ReplyParseError(
                f"property {name!r} is a {type(value).__name__}, the schema says {declared}"
            )


def _is_json_type(value: object, kind: str) -> bool:
    types = _JSON_TYPES.get(kind)
    if types is None:
        return True  # a type this check does not know: leave it to the caller
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, types)


# ---------------------------------------------------------------------------- retry


async def complete_with_retries(
    send: SendFn,
    messages: Sequence[ChatMessage],
    *,
    model: str,
    json_schema: Mapping[str, JsonValue] | None,
    max_attempts: int,
    backoff_base: float = 0.5,
    backoff_cap: float = 8.0,
) -> ChatReply:
    """Call ``send`` until it yields a usable reply, at most ``max_attempts`` times.

    With ``json_schema`` the reply's text is parsed with :func:`parse_json_object` and
    checked with :func:`check_reply_shape`; the returned reply carries the object in
    ``data``. Token usage is summed over the attempts.

    Raises:
        ModelFailedError: a non-retryable error, or the last attempt failed; ``retryable``
            on the error says whether running the job again later may help.
    """
    if max_attempts < 1:
        raise ValidationError(f"max_attempts must be >= 1, got {max_attempts}")
    original = list(messages)
    current = original
    input_tokens = output_tokens = 0
    for attempt in range(max_attempts):
        last = attempt + 1 == max_attempts
        try:
            reply = await send(current)
        except ModelFailedError:
            raise
        except BackendError as exc:
            if not exc.retryable:
                raise ModelFailedError(
                    f"{model} refused the request: {exc}",
                    model=model,
                    attempts=attempt + 1,
                    retryable=False,
                ) from exc
            if last:
                raise ModelFailedError(
                    f"{model} failed {max_attempts} times in a row, last: {exc}; the service "
                    "is throttling or unavailable: run the job again later, or raise "
                    "llm_max_attempts / llm_timeout_seconds",
                    model=model,
                    attempts=max_attempts,
                    retryable=True,
                ) from exc
            logger.warning(
                "model %s attempt %d/%d failed (%s); retrying",
                model,
                attempt + 1,
                max_attempts,
                exc,
            )
            await pause(attempt, base=backoff_base, cap=backoff_cap)
            continue
        input_tokens += reply.input_tokens
        output_tokens += reply.output_tokens
        data: dict[str, JsonValue] | None = None
        if json_schema is not None:
            try:
                data = parse_json_object(reply.text)
                check_reply_shape(data, json_schema)
            except ReplyParseError as exc:
                stop = reply.extra.get("stop_reason")
                if last:
                    advice = (
                        "the reply was cut off at max_tokens: raise max_tokens"
                        if stop in ("max_tokens", "length")
                        else "use a model that follows JSON instructions (or json_mode on an "
                        "OpenAI-compatible server), or run the job again later"
                    )
                    raise ModelFailedError(
                        f"{model} gave no usable JSON object in {max_attempts} attempts, "
                        f"last: {exc}; {advice}",
                        model=model,
                        attempts=max_attempts,
                        retryable=True,
                    ) from exc
                logger.warning(
                    "model %s attempt %d/%d gave unusable JSON (%s); retrying",
                    model,
                    attempt + 1,
                    max_attempts,
                    exc,
                )
                current = _with_correction(original, reply.text, str(exc))
                await pause(attempt, base=backoff_base, cap=backoff_cap)
                continue
        return ChatReply(
            text=reply.text,
            data=data,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=reply.model or model,
            attempts=attempt + 1,
            extra=reply.extra,
        )
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def _with_correction(original: list[ChatMessage], bad_text: str, reason: str) -> list[ChatMessage]:
    """The conversation with the unusable reply and a correction appended, so the model sees
    what was wrong; unchanged when there is nothing to show it (an empty reply) or the
    conversation does not end with the user (appending would break role alternation)."""
    if not bad_text.strip() or original[-1].role != "user":
        return original
    return [
        *original,
        ChatMessage("assistant", bad_text),
        ChatMessage("user", _CORRECTION.format(reason=reason)),
    ]
