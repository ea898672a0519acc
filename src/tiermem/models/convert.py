"""Converters between tiermem :class:`Message` values and three provider wire formats.

Each format has ``to_X(messages) -> list[dict]`` and ``from_X(raw) -> list[Message]``, plus
system-prompt helpers, since no format keeps the system prompt among the turns the same way:

* Bedrock Converse: ``to_converse``/``from_converse``, ``to_converse_system``/
  ``from_converse_system``. Bytes stay raw ``bytes``, as boto3 sends and returns them.
* Anthropic Messages: ``to_anthropic``/``from_anthropic``, ``to_anthropic_system``/
  ``from_anthropic_system``. Bytes are base64 text.
* OpenAI chat completions: ``to_openai(messages, system=...)``/``from_openai``;
  ``split_openai_system`` takes system/developer messages out of a raw list first.

``from_X(to_X(m)) == m`` holds except for what a format cannot carry:

Converse
    Image/document URIs must be ``s3://`` (others are rejected); an S3 ``bucketOwner`` is
    dropped on read. A block with both ``data`` and ``uri`` is sent by ``data``; a reasoning
    block with ``redacted`` bytes is sent as redacted only.
Anthropic
    A :class:`JsonBlock` in a tool result becomes JSON text. Documents are PDF (base64 or URL)
    or text (``txt``/``md``/``csv``/``html`` are sent as text and read back as ``txt``);
    ``doc``/``docx``/``xls``/``xlsx`` are rejected; no ``title`` reads back as ``"document"``.
    A URL image's format is read from the URL's extension (``jpeg`` when there is none).
    A :class:`CachePointBlock` becomes ``cache_control`` on the block before it; on read,
    its ``ttl``, cache marks inside tool results, and text citations are dropped.
OpenAI
    :class:`ReasoningBlock` and :class:`CachePointBlock` have no equivalent and are dropped
    (never an error). A tool result's ``status`` is dropped, a :class:`JsonBlock` becomes
    JSON text, an empty result is ``""``. Images and documents cannot travel in tool results
    or assistant messages (rejected); documents travel only as inline PDF ``file`` parts.
    A user message becomes its tool messages, then one user message with the rest; on read,
    consecutive tool messages and the user message right after them become one message.
    Assistant text comes before tool calls. An image's ``detail`` is dropped on read.

A block a converter does not know is read as an :class:`UnknownBlock` with ``kind`` the
format name (``"converse"``, ``"anthropic"``, ``"openai"``) and ``data`` the raw block.
Written back to that format, ``data`` passes through unchanged; to another format it raises
:class:`~tiermem.errors.ValidationError`. So does malformed input, naming the message and
block index.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlparse

import pydantic

from tiermem.errors import ValidationError
from tiermem.models.content import (
    CachePointBlock,
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    Message,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)

__all__ = [
    "SystemBlock",
    "from_anthropic",
    "from_anthropic_system",
    "from_converse",
    "from_converse_system",
    "from_openai",
    "split_openai_system",
    "to_anthropic",
    "to_anthropic_system",
    "to_converse",
    "to_converse_system",
    "to_openai",
]

Raw = dict[str, Any]
SystemBlock = TextBlock | CachePointBlock | UnknownBlock
"""What a system prompt is made of: text, cache points, and blocks kept from a format."""

_AnyBlock = ContentBlock | JsonBlock
_M = TypeVar("_M", bound=pydantic.BaseModel)
_IMAGE_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}
_TEXT_DOCUMENTS = frozenset({"txt", "md", "csv", "html"})


# ---------------------------------------------------------------- shared checks


def _fail(at: str, problem: str) -> NoReturn:
    raise ValidationError(f"{at}: {problem}")


def _fields(raw: Raw, at: str, *keys: str) -> list[Any]:
    missing = [k for k in keys if k not in raw]
    if missing:
        _fail(at, f"missing key {missing[0]!r} (keys present: {sorted(raw)})")
    return [raw[k] for k in keys]


def _as_dict(value: Any, at: str) -> Raw:
    if not isinstance(value, dict):
        _fail(at, f"expected an object, got {type(value).__name__}")
    return value


def _indexed(raw: Any, what: str) -> list[tuple[str, Raw]]:
    if not isinstance(raw, list | tuple):
        _fail(what + "s", f"expected a list, got {type(raw).__name__}")
    return [(f"{what} {i}", _as_dict(item, f"{what} {i}")) for i, item in enumerate(raw)]


def _build(model: type[_M], at: str, **fields: Any) -> _M:
    # Field checks (types, literals) live on the models; report them with a location.
    try:
        return model(**fields)
    except pydantic.ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValidationError(f"{at}: invalid {model.__name__}: {why}") from exc


def _role(raw: Raw, at: str) -> Role:
    [role] = _fields(raw, at, "role")
    if role not in ("user", "assistant"):
        _fail(at, f"role {role!r} is not 'user' or 'assistant'")
    return role  # type: ignore[no-any-return]


def _check_placement(block: _AnyBlock, role: str, at: str) -> None:
    # The tool-pair shape every format shares: the assistant calls, the user answers.
    if isinstance(block, ToolResultBlock) and role != "user":
        _fail(at, f"a tool result cannot be in a {role} message; it goes in a user message")
    if isinstance(block, ToolUseBlock) and role != "assistant":
        _fail(at, f"a tool use cannot be in a {role} message; it goes in an assistant message")


def _passthrough(block: UnknownBlock, fmt: str, at: str) -> Raw:
    if block.kind != fmt:
        _fail(
            at,
            f"an unknown block of kind {block.kind!r} cannot be sent as {fmt}; only blocks read "
            f"from {fmt} pass through. Remove it or replace it with a known block",
        )
    return copy.deepcopy(block.data)  # the caller may mutate the request; our value is frozen


def _unknown(raw: Raw, fmt: str) -> UnknownBlock:
    return UnknownBlock(kind=fmt, data=copy.deepcopy(raw))


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: Any, at: str) -> bytes:
    if not isinstance(text, str):
        _fail(at, f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError(f"{at}: invalid base64 data: {exc}") from exc


def _raw_bytes(value: Any, at: str) -> bytes:
    # The models would take a str as base64, but Converse carries raw bytes: a str here
    # means a JSON dump of a request, not what boto3 sends or returns.
    if not isinstance(value, bytes | bytearray):
        _fail(at, f"expected raw bytes (as boto3 returns them), got {type(value).__name__}")
    return bytes(value)


def _image_format(media_type: Any, at: str) -> str:
    kind, _, subtype = str(media_type).lower().partition("/")
    if kind != "image" or subtype not in _IMAGE_FORMATS:
        _fail(at, f"unsupported image media type {media_type!r}; use png, jpeg, gif or webp")
    return _IMAGE_FORMATS[subtype]


def _format_from_url(url: str) -> str:
    return _IMAGE_FORMATS.get(urlparse(url).path.rsplit(".", 1)[-1].lower(), "jpeg")


def _web_uri(block: ImageBlock | DocumentBlock, fmt: str, at: str) -> str:
    if block.uri is None or not block.uri.startswith(("https://", "http://")):
        _fail(at, f"{fmt} needs inline data or an http(s) URL, got uri={block.uri!r}")
    return block.uri


# ---------------------------------------------------------------- Bedrock Converse


def to_converse(messages: Sequence[Message]) -> list[Raw]:
    """Messages as Converse ``messages``. Raises ValidationError for what it cannot carry."""
    return [
        {
            "role": m.role,
            "content": [
                _to_converse_block(b, m.role, f"to_converse: message {i} block {j}")
                for j, b in enumerate(m.content)
            ],
        }
        for i, m in enumerate(messages)
    ]


def _converse_source(block: ImageBlock | DocumentBlock, at: str) -> Raw:
    if block.data is not None:
        return {"bytes": block.data}
    if block.uri is not None and block.uri.startswith("s3://"):
        return {"s3Location": {"uri": block.uri}}
    _fail(at, f"Converse needs inline data or an s3:// uri, got uri={block.uri!r}")


def _to_converse_block(block: _AnyBlock, role: str, at: str) -> Raw:
    _check_placement(block, role, at)
    match block:
        case TextBlock(text=text):
            return {"text": text}
        case JsonBlock():
            return {"json": block.json_}
        case ToolUseBlock(tool_use_id=tid, name=name, input=args):
            return {"toolUse": {"toolUseId": tid, "name": name, "input": args}}
        case ToolResultBlock(tool_use_id=tid, content=items, status=status):
            content = [
                _to_converse_block(c, role, f"{at} content {k}") for k, c in enumerate(items)
            ]
            return {"toolResult": {"toolUseId": tid, "content": content, "status": status}}
        case ImageBlock(format=fmt):
            return {"image": {"format": fmt, "source": _converse_source(block, at)}}
        case DocumentBlock(format=fmt, name=name):
            return {
                "document": {"format": fmt, "name": name, "source": _converse_source(block, at)}
            }
        case ReasoningBlock(redacted=bytes() as redacted):
            return {"reasoningContent": {"redactedContent": redacted}}
        case ReasoningBlock(text=text, signature=signature):
            reasoning: Raw = (
                {"text": text} if signature is None else {"text": text, "signature": signature}
            )
            return {"reasoningContent": {"reasoningText": reasoning}}
        case CachePointBlock(cache_type=cache_type):
            return {"cachePoint": {"type": cache_type}}
        case UnknownBlock():
            return _passthrough(block, "converse", at)
    _fail(at, f"cannot convert {type(block).__name__} to Converse")


def from_converse(raw: Sequence[Raw]) -> list[Message]:
    """Converse ``messages`` as Messages. Raises ValidationError on malformed input."""
    return [
        Message(
            role=_role(msg, at),
            content=tuple(
                _from_converse_block(b, bat)
                for bat, b in _indexed(_fields(msg, at, "content")[0], f"{at} block")
            ),
        )
        for at, msg in _indexed(raw, "converse message")
    ]


def _from_converse_media(raw: Raw, key: str, at: str) -> ImageBlock | DocumentBlock | None:
    media = _as_dict(raw[key], at)
    fmt, source = _fields(media, at, "format", "source")
    source = _as_dict(source, f"{at} source")
    if "bytes" in source:
        place: Raw = {"data": _raw_bytes(source["bytes"], f"{at} source")}
    elif "s3Location" in source:
        place = {"uri": _fields(_as_dict(source["s3Location"], at), f"{at} s3Location", "uri")[0]}
    elif "text" in source and key == "document":
        place = {"data": str(source["text"]).encode("utf-8")}
    else:
        return None  # a source kind this release does not know
    if key == "image":
        return _build(ImageBlock, at, format=fmt, **place)
    return _build(DocumentBlock, at, format=fmt, name=_fields(media, at, "name")[0], **place)


def _from_converse_block(raw: Raw, at: str) -> Any:
    if "text" in raw:
        return _build(TextBlock, at, text=raw["text"])
    if "json" in raw:
        return _build(JsonBlock, at, json=copy.deepcopy(raw["json"]))
    if "image" in raw or "document" in raw:
        media = _from_converse_media(raw, "image" if "image" in raw else "document", at)
        return media if media is not None else _unknown(raw, "converse")
    if "toolUse" in raw:
        use = _as_dict(raw["toolUse"], at)
        tid, name = _fields(use, at, "toolUseId", "name")
        return _build(
            ToolUseBlock, at, tool_use_id=tid, name=name, input=copy.deepcopy(use.get("input", {}))
        )
    if "toolResult" in raw:
        result = _as_dict(raw["toolResult"], at)
        items = [
            _from_converse_block(c, cat)
            for cat, c in _indexed(result.get("content", []), f"{at} content")
        ]
        if not all(
            isinstance(b, TextBlock | JsonBlock | ImageBlock | DocumentBlock) for b in items
        ):
            return _unknown(raw, "converse")  # a result we cannot hold is kept whole
        [tid] = _fields(result, at, "toolUseId")
        status = result.get("status", "success")
        return _build(ToolResultBlock, at, tool_use_id=tid, content=tuple(items), status=status)
    reasoning = _as_dict(raw.get("reasoningContent", {}), at)
    if "redactedContent" in reasoning:
        return ReasoningBlock(redacted=_raw_bytes(reasoning["redactedContent"], at))
    if "reasoningText" in reasoning:
        text = _as_dict(reasoning["reasoningText"], at)
        return _build(
            ReasoningBlock, at, text=_fields(text, at, "text")[0], signature=text.get("signature")
        )
    if _as_dict(raw.get("cachePoint", {}), at).get("type") == "default":
        return CachePointBlock()
    return _unknown(raw, "converse")


def to_converse_system(system: Sequence[SystemBlock]) -> list[Raw]:
    """A system prompt as the Converse ``system`` list. Raises ValidationError on other blocks."""
    return [
        _to_converse_block(b, "system", f"to_converse_system: block {j}")
        for j, b in enumerate(_system(system))
    ]


def from_converse_system(raw: Sequence[Raw]) -> tuple[SystemBlock, ...]:
    """The Converse ``system`` list as blocks; guard content and the like stay UnknownBlocks."""
    blocks = [
        (item, _from_converse_block(item, at))
        for at, item in _indexed(raw, "converse system block")
    ]
    return tuple(
        b if isinstance(b, TextBlock | CachePointBlock) else _unknown(item, "converse")
        for item, b in blocks
    )


def _system(system: Sequence[Any]) -> Sequence[SystemBlock]:
    for j, block in enumerate(system):
        if not isinstance(block, TextBlock | CachePointBlock | UnknownBlock):
            _fail(
                f"system block {j}",
                f"a system prompt holds text and cache points, not {block.type}",
            )
    return system


# ---------------------------------------------------------------- Anthropic Messages


def to_anthropic(messages: Sequence[Message]) -> list[Raw]:
    """Messages as Anthropic ``messages``. Raises ValidationError for what it cannot carry."""
    return [
        {
            "role": m.role,
            "content": _to_anthropic_blocks(m.content, m.role, f"to_anthropic: message {i}"),
        }
        for i, m in enumerate(messages)
    ]


def _to_anthropic_blocks(blocks: Sequence[_AnyBlock], role: str, at: str) -> list[Raw]:
    out: list[Raw] = []
    for j, block in enumerate(blocks):
        if not isinstance(block, CachePointBlock):
            out.append(_to_anthropic_block(block, role, f"{at} block {j}"))
        elif j == 0 or isinstance(blocks[j - 1], CachePointBlock):
            _fail(f"{at} block {j}", "a cache point marks the block before it; put it after one")
        else:
            out[-1] = {**out[-1], "cache_control": {"type": "ephemeral"}}
    return out


def _anthropic_source(block: ImageBlock | DocumentBlock, media_type: str, at: str) -> Raw:
    if block.data is not None:
        return {"type": "base64", "media_type": media_type, "data": _b64encode(block.data)}
    return {"type": "url", "url": _web_uri(block, "Anthropic", at)}


def _to_anthropic_block(block: _AnyBlock, role: str, at: str) -> Raw:
    _check_placement(block, role, at)
    match block:
        case TextBlock(text=text):
            return {"type": "text", "text": text}
        case JsonBlock():
            return {"type": "text", "text": json.dumps(block.json_, ensure_ascii=False)}
        case ToolUseBlock(tool_use_id=tid, name=name, input=args):
            return {"type": "tool_use", "id": tid, "name": name, "input": args}
        case ToolResultBlock(tool_use_id=tid, content=items, status=status):
            content = [
                _to_anthropic_block(c, role, f"{at} content {k}") for k, c in enumerate(items)
            ]
            return {
                "type": "tool_result",
                "tool_use_id": tid,
                "content": content,
                "is_error": status == "error",
            }
        case ImageBlock(format=fmt):
            return {"type": "image", "source": _anthropic_source(block, f"image/{fmt}", at)}
        case DocumentBlock(format=fmt, data=bytes() as data) if fmt in _TEXT_DOCUMENTS:
            try:
                source = {"type": "text", "media_type": "text/plain", "data": data.decode("utf-8")}
            except UnicodeDecodeError as exc:
                raise ValidationError(f"{at}: a {fmt} document must be UTF-8 text") from exc
            return {"type": "document", "source": source, "title": block.name}
        case DocumentBlock(format="pdf", name=name):
            return {
                "type": "document",
                "source": _anthropic_source(block, "application/pdf", at),
                "title": name,
            }
        case DocumentBlock(format=fmt):
            _fail(
                at,
                f"Anthropic reads PDF and plain-text documents, not {fmt}; convert it first",
            )
        case ReasoningBlock(redacted=bytes() as redacted):
            return {"type": "redacted_thinking", "data": _b64encode(redacted)}
        case ReasoningBlock(text=text, signature=signature):
            thinking: Raw = {"type": "thinking", "thinking": text}
            return thinking if signature is None else {**thinking, "signature": signature}
        case UnknownBlock():
            return _passthrough(block, "anthropic", at)
    _fail(at, f"cannot convert {type(block).__name__} to Anthropic")


def from_anthropic(raw: Sequence[Raw]) -> list[Message]:
    """Anthropic ``messages`` as Messages. Raises ValidationError on malformed input."""
    return [
        Message(
            role=_role(msg, at), content=_from_anthropic_content(_fields(msg, at, "content")[0], at)
        )
        for at, msg in _indexed(raw, "anthropic message")
    ]


def _from_anthropic_content(content: Any, at: str) -> tuple[Any, ...]:
    if isinstance(content, str):
        return (TextBlock(text=content),)
    blocks: list[Any] = []
    for bat, item in _indexed(content, f"{at} block"):
        item = dict(item)
        marked = item.pop("cache_control", None) is not None
        blocks.extend([_from_anthropic_block(item, bat), CachePointBlock()][: 1 + marked])
    return tuple(blocks)


def _from_anthropic_media(raw: Raw, at: str) -> ImageBlock | DocumentBlock | None:
    source = _as_dict(_fields(raw, at, "source")[0], f"{at} source")
    kind, name = source.get("type"), raw.get("title") or "document"
    if raw["type"] == "image" and kind == "base64":
        media_type, data = _fields(source, f"{at} source", "media_type", "data")
        return _build(
            ImageBlock, at, format=_image_format(media_type, at), data=_b64decode(data, at)
        )
    if raw["type"] == "image" and kind == "url":
        [url] = _fields(source, f"{at} source", "url")
        return _build(ImageBlock, at, format=_format_from_url(str(url)), uri=url)
    if kind == "base64" and source.get("media_type") == "application/pdf":
        data = _b64decode(_fields(source, f"{at} source", "data")[0], at)
        return _build(DocumentBlock, at, format="pdf", name=name, data=data)
    if kind == "text":
        data = str(_fields(source, f"{at} source", "data")[0]).encode("utf-8")
        return _build(DocumentBlock, at, format="txt", name=name, data=data)
    if kind == "url":
        return _build(DocumentBlock, at, format="pdf", name=name, uri=_fields(source, at, "url")[0])
    return None  # file ids, content sources: kept as unknown


def _from_anthropic_block(raw: Raw, at: str) -> Any:
    [kind] = _fields(raw, at, "type")
    if kind == "text":
        return _build(TextBlock, at, text=_fields(raw, at, "text")[0])
    if kind == "tool_use":
        tid, name = _fields(raw, at, "id", "name")
        return _build(
            ToolUseBlock, at, tool_use_id=tid, name=name, input=copy.deepcopy(raw.get("input", {}))
        )
    if kind == "tool_result":
        content = raw.get("content", [])
        items = (
            [b for b in _from_anthropic_content(content, at) if not isinstance(b, CachePointBlock)]
            if content != ""
            else []
        )
        if not all(isinstance(b, TextBlock | ImageBlock | DocumentBlock) for b in items):
            return _unknown(raw, "anthropic")  # a result we cannot hold is kept whole
        status = "error" if raw.get("is_error") else "success"
        [tid] = _fields(raw, at, "tool_use_id")
        return _build(ToolResultBlock, at, tool_use_id=tid, content=tuple(items), status=status)
    if kind in ("image", "document"):
        media = _from_anthropic_media(raw, at)
        return media if media is not None else _unknown(raw, "anthropic")
    if kind == "thinking":
        return _build(
            ReasoningBlock, at, text=_fields(raw, at, "thinking")[0], signature=raw.get("signature")
        )
    if kind == "redacted_thinking":
        return ReasoningBlock(redacted=_b64decode(_fields(raw, at, "data")[0], at))
    return _unknown(raw, "anthropic")


def to_anthropic_system(system: Sequence[SystemBlock]) -> list[Raw]:
    """A system prompt as the Anthropic ``system`` list. Raises ValidationError on other blocks."""
    return _to_anthropic_blocks(_system(system), "system", "to_anthropic_system:")


def from_anthropic_system(raw: str | Sequence[Raw]) -> tuple[SystemBlock, ...]:
    """The Anthropic ``system`` field (a string or text blocks) as blocks."""
    return tuple(_system(_from_anthropic_content(raw, "anthropic system")))


# ---------------------------------------------------------------- OpenAI chat completions


def to_openai(messages: Sequence[Message], *, system: Sequence[SystemBlock] = ()) -> list[Raw]:
    """Messages as OpenAI chat ``messages``, led by a system message when ``system`` has text.

    Reasoning and cache points are dropped (OpenAI has no equivalent). Raises
    ValidationError for content OpenAI cannot carry (see the module docstring).
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
                pass  # no OpenAI equivalent: dropped, as the module docstring says
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
