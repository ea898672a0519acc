"""OpenAI chat completions: ``to_openai``/``from_openai`` and ``split_openai_system``.

The system prompt is not a list of its own: ``to_openai`` takes it as ``system=`` and
``split_openai_system`` takes it out of a raw list. What OpenAI cannot carry is listed in
:mod:`tiermem.models.convert`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tiermem.errors import ValidationError
from tiermem.models.content import (
    CachePointBlock,
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)
from tiermem.models.convert._wire import (
    Raw,
    SystemBlock,
    _as_dict,
    _b64decode,
    _b64encode,
    _build,
    _check_placement,
    _fail,
    _fields,
    _format_from_url,
    _image_format,
    _indexed,
    _passthrough,
    _system,
    _unknown,
    _web_uri,
)

__all__ = ["from_openai", "split_openai_system", "to_openai"]


def to_openai(messages: Sequence[Message], *, system: Sequence[SystemBlock] = ()) -> list[Raw]:
    """Messages as OpenAI chat ``messages``, led by a system message when ``system`` has text.

    Reasoning and cache points are dropped (OpenAI has no equivalent). Raises
    ValidationError for content OpenAI cannot carry (see :mod:`tiermem.models.convert`).
    """
    out: list[Raw] = []
    system_parts = [
        {"type": "text", "text": b.text} for b in _system(system) if isinstance(b, TextBlock)
    ]
    if system_parts:
        out.append({"role": "system", "content": _collapse(system_parts)})
    for i, m in enumerate(messages):
        to_message = _to_openai_assistant if m.role == "assistant" else _to_openai_user
        out.extend(to_message(m, f"to_openai: message {i}"))
    return out


def _collapse(parts: list[Raw]) -> str | list[Raw] | None:
    # A lone text part goes as a plain string, the form every OpenAI-compatible server takes.
    if len(parts) == 1 and parts[0].keys() == {"type", "text"} and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts or None


def _to_openai_assistant(message: Message, at: str) -> list[Raw]:
    parts: list[Raw] = []
    calls: list[Raw] = []
    for j, block in enumerate(message.content):
        _check_placement(block, "assistant", bat := f"{at} block {j}")
        match block:
            case TextBlock(text=text):
                parts.append({"type": "text", "text": text})
            case ToolUseBlock(tool_use_id=tid, name=name, input=args):
                function = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
                calls.append({"id": tid, "type": "function", "function": function})
            case UnknownBlock():
                data = _passthrough(block, "openai", bat)
                # Tool calls carry an id and content parts never do: that routes kept blocks.
                (calls if "id" in data else parts).append(data)
            case ReasoningBlock() | CachePointBlock():
                pass  # no OpenAI equivalent: dropped, as the package docstring says
            case _:
                _fail(bat, f"OpenAI assistant messages carry text and tool calls, not {block.type}")
    content = _collapse(parts)
    out: Raw = {"role": "assistant", "content": content if content is not None or calls else ""}
    return [{**out, "tool_calls": calls} if calls else out]


def _to_openai_user(message: Message, at: str) -> list[Raw]:
    tool_messages: list[Raw] = []
    parts: list[Raw] = []
    for j, block in enumerate(message.content):
        _check_placement(block, "user", bat := f"{at} block {j}")
        match block:
            case ToolResultBlock(tool_use_id=tid, content=items):
                content = _collapse(
                    [_openai_tool_part(c, f"{bat} content {k}") for k, c in enumerate(items)]
                )
                tool_messages.append(
                    {"role": "tool", "tool_call_id": tid, "content": content or ""}
                )
            case TextBlock(text=text):
                parts.append({"type": "text", "text": text})
            case ImageBlock(data=None):
                parts.append(
                    {"type": "image_url", "image_url": {"url": _web_uri(block, "OpenAI", bat)}}
                )
            case ImageBlock(format=fmt, data=bytes() as data):
                parts.append(
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/{fmt};base64,{_b64encode(data)}"},
                    }
                )
            case DocumentBlock(format="pdf", name=name, data=bytes() as data):
                file = {
                    "filename": name,
                    "file_data": f"data:application/pdf;base64,{_b64encode(data)}",
                }
                parts.append({"type": "file", "file": file})
            case DocumentBlock(format=fmt):
                _fail(
                    bat,
                    f"OpenAI chat takes documents as inline PDF only, not {fmt} / a uri",
                )
            case UnknownBlock():
                parts.append(_passthrough(block, "openai", bat))
    content = _collapse(parts)
    if content is None and tool_messages:
        return tool_messages
    return [*tool_messages, {"role": "user", "content": content if content is not None else ""}]


def _openai_tool_part(block: Any, at: str) -> Raw:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, JsonBlock):
        return {"type": "text", "text": json.dumps(block.json_, ensure_ascii=False)}
    _fail(at, f"OpenAI tool messages carry text only, not {block.type}; describe it in text")


def from_openai(raw: Sequence[Raw]) -> list[Message]:
    """OpenAI chat ``messages`` as Messages; tool messages join the user message after them.

    Raises ValidationError on malformed input, and on system/developer messages (take them
    out first with :func:`split_openai_system`).
    """
    out: list[Message] = []
    pending: list[ToolResultBlock] = []  # tool messages wait for the user message after them
    for at, msg in _indexed(raw, "openai message"):
        [role] = _fields(msg, at, "role")
        if role == "tool":
            content = msg.get("content")
            parts = () if content in ("", None) else _from_openai_parts(content, at)
            if not all(isinstance(p, TextBlock) for p in parts):
                _fail(at, "tool message content must be text")
            [tid] = _fields(msg, at, "tool_call_id")
            pending.append(_build(ToolResultBlock, at, tool_use_id=tid, content=parts))
        elif role == "user":
            out.append(
                Message(
                    role="user", content=(*pending, *_from_openai_parts(msg.get("content"), at))
                )
            )
            pending = []
        elif role == "assistant":
            if pending:
                out.append(Message(role="user", content=tuple(pending)))
                pending = []
            calls = [
                _from_openai_call(c, cat)
                for cat, c in _indexed(msg.get("tool_calls") or [], f"{at} tool_call")
            ]
            out.append(
                Message(
                    role="assistant", content=(*_from_openai_parts(msg.get("content"), at), *calls)
                )
            )
        elif role in ("system", "developer"):
            _fail(
                at, f"{role} messages are not turns; take them out first with split_openai_system()"
            )
        else:
            _fail(at, f"role {role!r} is not 'user', 'assistant' or 'tool'")
    return [*out, Message(role="user", content=tuple(pending))] if pending else out


def _from_openai_parts(content: Any, at: str) -> tuple[Any, ...]:
    if content is None or isinstance(content, str):
        return () if content is None else (TextBlock(text=content),)
    blocks: list[Any] = []
    for pat, part in _indexed(content, f"{at} part"):
        kind = part.get("type")
        file = part.get("file")
        if kind == "text":
            blocks.append(_build(TextBlock, pat, text=_fields(part, pat, "text")[0]))
        elif kind == "image_url":
            url = str(_fields(_as_dict(_fields(part, pat, "image_url")[0], pat), pat, "url")[0])
            if not url.startswith("data:"):
                blocks.append(_build(ImageBlock, pat, format=_format_from_url(url), uri=url))
                continue
            media_type, data = _parse_data_url(url, pat)
            blocks.append(_build(ImageBlock, pat, format=_image_format(media_type, pat), data=data))
        elif (
            kind == "file"
            and isinstance(file, dict)
            and str(file.get("file_data")).startswith("data:")
        ):
            media_type, data = _parse_data_url(file["file_data"], pat)
            if media_type != "application/pdf":
                _fail(pat, f"file part of type {media_type!r}; only application/pdf is supported")
            name = file.get("filename") or "document"
            blocks.append(_build(DocumentBlock, pat, format="pdf", name=name, data=data))
        else:
            blocks.append(_unknown(part, "openai"))
    return tuple(blocks)


def _parse_data_url(url: str, at: str) -> tuple[str, bytes]:
    header, comma, payload = url.partition(",")
    if not comma or not header.startswith("data:") or not header.endswith(";base64"):
        _fail(at, "expected a base64 data URL like 'data:image/png;base64,...'")
    return header[len("data:") : -len(";base64")], _b64decode(payload, at)


def _from_openai_call(call: Raw, at: str) -> ToolUseBlock | UnknownBlock:
    if call.get("type", "function") != "function":
        return _unknown(call, "openai")
    tid, function = _fields(call, at, "id", "function")
    [name] = _fields(_as_dict(function, at), at, "name")
    try:
        args = json.loads(function.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"{at}: tool call arguments are not valid JSON: {exc}") from exc
    return _build(ToolUseBlock, at, tool_use_id=tid, name=name, input=args)


def split_openai_system(raw: Sequence[Raw]) -> tuple[tuple[TextBlock, ...], list[Raw]]:
    """Take system and developer messages out of an OpenAI list: their text, and the rest.

    Pass the rest to :func:`from_openai`. Raises ValidationError on malformed input.
    """
    system: list[TextBlock] = []
    rest: list[Raw] = []
    for at, msg in _indexed(raw, "openai message"):
        if _fields(msg, at, "role")[0] not in ("system", "developer"):
            rest.append(msg)
            continue
        for block in _from_openai_parts(_fields(msg, at, "content")[0], at):
            if not isinstance(block, TextBlock):
                _fail(at, "system message content must be text")
            system.append(block)
    return tuple(system), rest
