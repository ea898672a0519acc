"""Converters between tiermem :class:`Message` values and three provider wire formats.

Each format is a pair of pure functions, ``to_X(messages) -> list[dict]`` and
``from_X(raw) -> list[Message]``, plus helpers for the system prompt, which none of the
formats keeps among the turns in the same way:

* Bedrock Converse: ``to_converse`` / ``from_converse``, ``to_converse_system`` /
  ``from_converse_system``. Bytes stay raw ``bytes``, as boto3 sends and returns them.
* Anthropic Messages: ``to_anthropic`` / ``from_anthropic``, ``to_anthropic_system`` /
  ``from_anthropic_system``. Bytes are base64 text.
* OpenAI chat completions: ``to_openai(messages, system=...)`` / ``from_openai``, and
  ``split_openai_system`` to take system/developer messages out of a raw list first.

Round trips ``from_X(to_X(m)) == m`` are exact except for what a format cannot carry:

Converse
    Image and document URIs must be ``s3://`` (others are rejected); an S3 location's
    ``bucketOwner`` is dropped on read. A block holding both ``data`` and ``uri`` is sent
    by ``data``. A reasoning block with ``redacted`` bytes is sent as redacted only.
Anthropic
    A :class:`JsonBlock` in a tool result becomes a text block holding the JSON. Documents
    are PDF (base64 or URL) or text (``txt``/``md``/``csv``/``html`` are sent as text and
    read back as ``txt``); ``doc``/``docx``/``xls``/``xlsx`` are rejected. A document with
    no ``title`` reads back named ``"document"``. A URL image reads back with its format
    guessed from the URL's extension (``jpeg`` when there is none). ``cache_control`` is
    written on the block before a :class:`CachePointBlock`; its ``ttl`` and cache markers
    inside tool results are dropped on read. Citations on text blocks are dropped on read.
OpenAI
    :class:`ReasoningBlock` and :class:`CachePointBlock` have no equivalent and are dropped
    (never an error). A tool result's ``status`` is dropped, a :class:`JsonBlock` becomes
    JSON text, and an empty tool result is ``""``. Images and documents cannot travel in
    tool results or assistant messages (rejected); documents travel only as inline PDF
    ``file`` parts. A user message becomes its tool messages first, then one user message
    with the rest; reading back, consecutive tool messages and the user message right
    after them become one user message. Assistant text comes before tool calls. An
    image's ``detail`` is dropped on read.

Blocks a converter does not know are read as :class:`UnknownBlock` with ``kind`` set to
the format name (``"converse"``, ``"anthropic"``, ``"openai"``) and ``data`` the raw
block. Writing one back to the same format passes ``data`` through unchanged; writing it
to another format raises :class:`~tiermem.errors.ValidationError`. So does malformed
input, with the message and block index in the error message.
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


def _fail(where: str, problem: str) -> NoReturn:
    raise ValidationError(f"{where}: {problem}")


def _get(raw: Raw, key: str, where: str) -> Any:
    if key not in raw:
        _fail(where, f"missing key {key!r} (keys present: {sorted(raw)})")
    return raw[key]


def _as_dict(value: Any, where: str) -> Raw:
    if not isinstance(value, dict):
        _fail(where, f"expected an object, got {type(value).__name__}")
    return value


def _as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        _fail(where, f"expected a list, got {type(value).__name__}")
    return list(value)


def _build(model: type[_M], where: str, **fields: Any) -> _M:
    # Field-level checks (types, literals) live on the models; report them with a location.
    try:
        return model(**fields)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise ValidationError(f"{where}: invalid {model.__name__}: {problems}") from exc


def _role(raw: Raw, where: str) -> Role:
    role = _get(raw, "role", where)
    if role not in ("user", "assistant"):
        _fail(where, f"role {role!r} is not 'user' or 'assistant'")
    return role  # type: ignore[no-any-return]


def _check_placement(block: _AnyBlock, role: str, where: str) -> None:
    # The tool-pair shape every format shares: the assistant calls, the user answers.
    if isinstance(block, ToolResultBlock) and role != "user":
        _fail(
            where, f"a tool result cannot be in a {role} message; tool results go in user messages"
        )
    if isinstance(block, ToolUseBlock) and role != "assistant":
        _fail(
            where, f"a tool use cannot be in a {role} message; tool uses go in assistant messages"
        )


def _passthrough(block: UnknownBlock, fmt: str, where: str) -> Raw:
    if block.kind != fmt:
        _fail(
            where,
            f"an unknown block of kind {block.kind!r} cannot be sent as {fmt}; only blocks "
            f"read from {fmt} pass through. Remove it or replace it with a known block",
        )
    return copy.deepcopy(block.data)  # the caller may mutate the request; our value is frozen


def _unknown(raw: Raw, fmt: str) -> UnknownBlock:
    return UnknownBlock(kind=fmt, data=copy.deepcopy(raw))


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        _fail(where, f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError(f"{where}: invalid base64 data: {exc}") from exc


def _raw_bytes(value: Any, where: str) -> bytes:
    # pydantic would quietly turn a str into its UTF-8 bytes; a base64 str here is a bug.
    if not isinstance(value, bytes | bytearray):
        _fail(where, f"expected raw bytes (as boto3 returns them), got {type(value).__name__}")
    return bytes(value)


def _image_format(media_type: Any, where: str) -> str:
    kind, _, subtype = str(media_type).lower().partition("/")
    if kind != "image" or subtype not in _IMAGE_FORMATS:
        _fail(where, f"unsupported image media type {media_type!r}; use png, jpeg, gif or webp")
    return _IMAGE_FORMATS[subtype]


def _format_from_url(url: str) -> str:
    suffix = urlparse(url).path.rsplit(".", 1)[-1].lower()
    return _IMAGE_FORMATS.get(suffix, "jpeg")


def _web_uri(uri: str, fmt: str, where: str) -> str:
    if not uri.startswith(("https://", "http://")):
        _fail(where, f"{fmt} fetches only http(s) URLs, not {uri!r}; load the bytes into `data`")
    return uri


def _indexed(raw: Any, what: str) -> list[tuple[str, Raw]]:
    return [
        (f"{what} {i}", _as_dict(item, f"{what} {i}"))
        for i, item in enumerate(_as_list(raw, what + "s"))
    ]


# ---------------------------------------------------------------- Bedrock Converse


def to_converse(messages: Sequence[Message]) -> list[Raw]:
    """Messages as Converse ``messages``. Raises ValidationError for what Converse cannot carry."""
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


def _converse_source(block: ImageBlock | DocumentBlock, where: str) -> Raw:
    if block.data is not None:
        return {"bytes": block.data}
    if block.uri is not None and block.uri.startswith("s3://"):
        return {"s3Location": {"uri": block.uri}}
    _fail(where, f"Converse needs inline data or an s3:// uri, got uri={block.uri!r}")


def _to_converse_block(block: _AnyBlock, role: str, where: str) -> Raw:
    _check_placement(block, role, where)
    match block:
        case TextBlock():
            return {"text": block.text}
        case JsonBlock():
            return {"json": block.json_}
        case ToolUseBlock():
            return {
                "toolUse": {
                    "toolUseId": block.tool_use_id,
                    "name": block.name,
                    "input": block.input,
                }
            }
        case ToolResultBlock():
            content = [
                _to_converse_block(c, role, f"{where} content {k}")
                for k, c in enumerate(block.content)
            ]
            return {
                "toolResult": {
                    "toolUseId": block.tool_use_id,
                    "content": content,
                    "status": block.status,
                }
            }
        case ImageBlock():
            return {"image": {"format": block.format, "source": _converse_source(block, where)}}
        case DocumentBlock():
            source = _converse_source(block, where)
            return {"document": {"format": block.format, "name": block.name, "source": source}}
        case ReasoningBlock() if block.redacted is not None:
            return {"reasoningContent": {"redactedContent": block.redacted}}
        case ReasoningBlock():
            text: Raw = {"text": block.text}
            if block.signature is not None:
                text["signature"] = block.signature
            return {"reasoningContent": {"reasoningText": text}}
        case CachePointBlock():
            return {"cachePoint": {"type": block.cache_type}}
        case UnknownBlock():
            return _passthrough(block, "converse", where)
    _fail(where, f"cannot convert {type(block).__name__} to Converse")


def from_converse(raw: Sequence[Raw]) -> list[Message]:
    """Converse ``messages`` as Messages. Raises ValidationError on malformed input."""
    out: list[Message] = []
    for where, msg in _indexed(raw, "converse message"):
        role = _role(msg, where)
        blocks = [
            _from_converse_block(block, bw)
            for bw, block in _indexed(_get(msg, "content", where), f"{where} block")
        ]
        out.append(Message(role=role, content=tuple(blocks)))
    return out


def _from_converse_media(raw: Raw, key: str, where: str) -> ImageBlock | DocumentBlock | None:
    media = _as_dict(raw[key], where)
    source = _as_dict(_get(media, "source", where), f"{where} source")
    if "bytes" in source:
        place: Raw = {"data": _raw_bytes(source["bytes"], f"{where} source")}
    elif "s3Location" in source:
        place = {"uri": _get(_as_dict(source["s3Location"], where), "uri", f"{where} s3Location")}
    elif "text" in source and key == "document":
        place = {"data": str(source["text"]).encode("utf-8")}
    else:
        return None  # a source kind this release does not know
    if key == "image":
        return _build(ImageBlock, where, format=_get(media, "format", where), **place)
    return _build(
        DocumentBlock,
        where,
        format=_get(media, "format", where),
        name=_get(media, "name", where),
        **place,
    )


def _from_converse_block(raw: Raw, where: str) -> Any:
    if "text" in raw:
        return _build(TextBlock, where, text=raw["text"])
    if "json" in raw:
        return JsonBlock(json=copy.deepcopy(raw["json"]))
    if "image" in raw or "document" in raw:
        media = _from_converse_media(raw, "image" if "image" in raw else "document", where)
        return media if media is not None else _unknown(raw, "converse")
    if "toolUse" in raw:
        use = _as_dict(raw["toolUse"], where)
        return _build(
            ToolUseBlock,
            where,
            tool_use_id=_get(use, "toolUseId", where),
            name=_get(use, "name", where),
            input=copy.deepcopy(use.get("input", {})),
        )
    if "toolResult" in raw:
        result = _as_dict(raw["toolResult"], where)
        content = []
        for cw, item in _indexed(result.get("content", []), f"{where} content"):
            block = _from_converse_block(item, cw)
            if not isinstance(block, TextBlock | JsonBlock | ImageBlock | DocumentBlock):
                return _unknown(raw, "converse")  # a result we cannot hold is kept whole
            content.append(block)
        return _build(
            ToolResultBlock,
            where,
            tool_use_id=_get(result, "toolUseId", where),
            content=tuple(content),
            status=result.get("status", "success"),
        )
    if "reasoningContent" in raw:
        reasoning = _as_dict(raw["reasoningContent"], where)
        if "redactedContent" in reasoning:
            return ReasoningBlock(redacted=_raw_bytes(reasoning["redactedContent"], where))
        if "reasoningText" in reasoning:
            text = _as_dict(reasoning["reasoningText"], where)
            return _build(
                ReasoningBlock,
                where,
                text=_get(text, "text", where),
                signature=text.get("signature"),
            )
    if "cachePoint" in raw and _as_dict(raw["cachePoint"], where).get("type") == "default":
        return CachePointBlock()
    return _unknown(raw, "converse")


def to_converse_system(system: Sequence[SystemBlock]) -> list[Raw]:
    """A system prompt as the Converse ``system`` list."""
    out = []
    for j, block in enumerate(system):
        where = f"to_converse_system: block {j}"
        if not isinstance(block, TextBlock | CachePointBlock | UnknownBlock):
            _fail(where, f"a system prompt holds text and cache points, not {type(block).__name__}")
        out.append(_to_converse_block(block, "system", where))
    return out


def from_converse_system(raw: Sequence[Raw]) -> tuple[SystemBlock, ...]:
    """The Converse ``system`` list as blocks; guard content and the like stay UnknownBlocks."""
    out: list[SystemBlock] = []
    for where, item in _indexed(raw, "converse system block"):
        block = _from_converse_block(item, where)
        out.append(
            block if isinstance(block, TextBlock | CachePointBlock) else _unknown(item, "converse")
        )
    return tuple(out)


# ---------------------------------------------------------------- Anthropic Messages


def to_anthropic(messages: Sequence[Message]) -> list[Raw]:
    """Messages as Anthropic ``messages``. Raises ValidationError for what Anthropic cannot carry."""
    return [
        {
            "role": m.role,
            "content": _to_anthropic_blocks(m.content, m.role, f"to_anthropic: message {i}"),
        }
        for i, m in enumerate(messages)
    ]


def _to_anthropic_blocks(blocks: Sequence[_AnyBlock], role: str, where: str) -> list[Raw]:
    out: list[Raw] = []
    for j, block in enumerate(blocks):
        bw = f"{where} block {j}"
        if not isinstance(block, CachePointBlock):
            out.append(_to_anthropic_block(block, role, bw))
        elif j == 0 or isinstance(blocks[j - 1], CachePointBlock):
            _fail(
                bw,
                "Anthropic marks a cache point on the block before it; put it after a content block",
            )
        else:
            out[-1] = {**out[-1], "cache_control": {"type": "ephemeral"}}
    return out


def _to_anthropic_source(block: ImageBlock | DocumentBlock, media_type: str, where: str) -> Raw:
    if block.data is not None:
        return {"type": "base64", "media_type": media_type, "data": _b64encode(block.data)}
    if block.uri is not None:
        return {"type": "url", "url": _web_uri(block.uri, "Anthropic", where)}
    _fail(where, f"{block.type} has neither data nor uri")


def _to_anthropic_block(block: _AnyBlock, role: str, where: str) -> Raw:
    _check_placement(block, role, where)
    match block:
        case TextBlock():
            return {"type": "text", "text": block.text}
        case JsonBlock():
            return {"type": "text", "text": json.dumps(block.json_, ensure_ascii=False)}
        case ToolUseBlock():
            return {
                "type": "tool_use",
                "id": block.tool_use_id,
                "name": block.name,
                "input": block.input,
            }
        case ToolResultBlock():
            content = [
                _to_anthropic_block(c, role, f"{where} content {k}")
                for k, c in enumerate(block.content)
            ]
            return {
                "type": "tool_result",
                "tool_use_id": block.tool_use_id,
                "content": content,
                "is_error": block.status == "error",
            }
        case ImageBlock():
            return {
                "type": "image",
                "source": _to_anthropic_source(block, f"image/{block.format}", where),
            }
        case DocumentBlock() if block.format in _TEXT_DOCUMENTS and block.data is not None:
            try:
                text = block.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValidationError(f"{where}: a {block.format} document must be UTF-8") from exc
            source = {"type": "text", "media_type": "text/plain", "data": text}
            return {"type": "document", "source": source, "title": block.name}
        case DocumentBlock() if block.format == "pdf":
            source = _to_anthropic_source(block, "application/pdf", where)
            return {"type": "document", "source": source, "title": block.name}
        case DocumentBlock():
            _fail(
                where,
                f"Anthropic reads PDF and plain-text documents, not {block.format}; convert it",
            )
        case ReasoningBlock() if block.redacted is not None:
            return {"type": "redacted_thinking", "data": _b64encode(block.redacted)}
        case ReasoningBlock():
            out: Raw = {"type": "thinking", "thinking": block.text}
            if block.signature is not None:
                out["signature"] = block.signature
            return out
        case UnknownBlock():
            return _passthrough(block, "anthropic", where)
    _fail(where, f"cannot convert {type(block).__name__} to Anthropic")


def from_anthropic(raw: Sequence[Raw]) -> list[Message]:
    """Anthropic ``messages`` as Messages. Raises ValidationError on malformed input."""
    out: list[Message] = []
    for where, msg in _indexed(raw, "anthropic message"):
        role = _role(msg, where)
        out.append(
            Message(role=role, content=_from_anthropic_content(_get(msg, "content", where), where))
        )
    return out


def _from_anthropic_content(content: Any, where: str) -> tuple[Any, ...]:
    if isinstance(content, str):
        return (TextBlock(text=content),)
    blocks: list[Any] = []
    for bw, item in _indexed(content, f"{where} block"):
        item = dict(item)
        marked = item.pop("cache_control", None) is not None
        blocks.append(_from_anthropic_block(item, bw))
        if marked:
            blocks.append(CachePointBlock())
    return tuple(blocks)


def _from_anthropic_media(raw: Raw, where: str) -> ImageBlock | DocumentBlock | None:
    source = _as_dict(_get(raw, "source", where), f"{where} source")
    kind = source.get("type")
    name = raw.get("title") or "document"
    if raw["type"] == "image" and kind == "base64":
        fmt = _image_format(_get(source, "media_type", where), where)
        return _build(
            ImageBlock, where, format=fmt, data=_b64decode(_get(source, "data", where), where)
        )
    if raw["type"] == "image" and kind == "url":
        url = _get(source, "url", where)
        return _build(ImageBlock, where, format=_format_from_url(str(url)), uri=url)
    if kind == "base64" and source.get("media_type") == "application/pdf":
        return _build(
            DocumentBlock,
            where,
            format="pdf",
            name=name,
            data=_b64decode(_get(source, "data", where), where),
        )
    if kind == "text":
        return _build(
            DocumentBlock,
            where,
            format="txt",
            name=name,
            data=str(_get(source, "data", where)).encode(),
        )
    if kind == "url":
        return _build(DocumentBlock, where, format="pdf", name=name, uri=_get(source, "url", where))
    return None  # file ids, content sources: kept as unknown


def _from_anthropic_block(raw: Raw, where: str) -> Any:
    kind = _get(raw, "type", where)
    if kind == "text":
        return _build(TextBlock, where, text=_get(raw, "text", where))
    if kind == "tool_use":
        return _build(
            ToolUseBlock,
            where,
            tool_use_id=_get(raw, "id", where),
            name=_get(raw, "name", where),
            input=copy.deepcopy(raw.get("input", {})),
        )
    if kind == "tool_result":
        content = raw.get("content", [])
        items = _from_anthropic_content(content, where) if content != "" else ()
        items = tuple(b for b in items if not isinstance(b, CachePointBlock))
        if not all(isinstance(b, TextBlock | ImageBlock | DocumentBlock) for b in items):
            return _unknown(raw, "anthropic")  # a result we cannot hold is kept whole
        status = "error" if raw.get("is_error") else "success"
        return _build(
            ToolResultBlock,
            where,
            tool_use_id=_get(raw, "tool_use_id", where),
            content=items,
            status=status,
        )
    if kind in ("image", "document"):
        media = _from_anthropic_media(raw, where)
        return media if media is not None else _unknown(raw, "anthropic")
    if kind == "thinking":
        return _build(
            ReasoningBlock, where, text=_get(raw, "thinking", where), signature=raw.get("signature")
        )
    if kind == "redacted_thinking":
        return ReasoningBlock(redacted=_b64decode(_get(raw, "data", where), where))
    return _unknown(raw, "anthropic")


def to_anthropic_system(system: Sequence[SystemBlock]) -> list[Raw]:
    """A system prompt as the Anthropic ``system`` list of text blocks."""
    for j, block in enumerate(system):
        if not isinstance(block, TextBlock | CachePointBlock | UnknownBlock):
            _fail(f"to_anthropic_system: block {j}", "a system prompt holds text and cache points")
    return _to_anthropic_blocks(system, "system", "to_anthropic_system:")


def from_anthropic_system(raw: str | Sequence[Raw]) -> tuple[SystemBlock, ...]:
    """The Anthropic ``system`` field (a string or text blocks) as blocks."""
    blocks = _from_anthropic_content(raw, "anthropic system")
    for j, block in enumerate(blocks):
        if not isinstance(block, TextBlock | CachePointBlock | UnknownBlock):
            _fail(f"anthropic system block {j}", f"a system prompt holds text, not {block.type}")
    return blocks


# ---------------------------------------------------------------- OpenAI chat completions


def to_openai(messages: Sequence[Message], *, system: Sequence[SystemBlock] = ()) -> list[Raw]:
    """Messages as OpenAI chat ``messages``, led by a system message when ``system`` has text.

    Reasoning and cache points are dropped (OpenAI has no equivalent). Raises
    ValidationError for content OpenAI cannot carry (see the module docstring).
    """
    out: list[Raw] = []
    system_parts = [{"type": "text", "text": b.text} for b in system if isinstance(b, TextBlock)]
    if system_parts:
        out.append({"role": "system", "content": _collapse(system_parts)})
    for i, m in enumerate(messages):
        where = f"to_openai: message {i}"
        out.extend(
            _to_openai_assistant(m, where) if m.role == "assistant" else _to_openai_user(m, where)
        )
    return out


def _collapse(parts: list[Raw]) -> str | list[Raw] | None:
    # A lone text part is sent as a plain string, the form every OpenAI-compatible server takes.
    if not parts:
        return None
    if len(parts) == 1 and parts[0].keys() == {"type", "text"} and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _to_openai_assistant(message: Message, where: str) -> list[Raw]:
    parts: list[Raw] = []
    calls: list[Raw] = []
    for j, block in enumerate(message.content):
        bw = f"{where} block {j}"
        _check_placement(block, "assistant", bw)
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.tool_use_id, "type": "function", "function": function})
        elif isinstance(block, UnknownBlock):
            data = _passthrough(block, "openai", bw)
            # Tool calls carry an id and content parts never do; that routes kept blocks back.
            (calls if "id" in data else parts).append(data)
        elif not isinstance(block, ReasoningBlock | CachePointBlock):
            _fail(bw, f"OpenAI assistant messages carry text and tool calls, not {block.type}")
    content = _collapse(parts)
    out: Raw = {"role": "assistant", "content": content if content is not None or calls else ""}
    if calls:
        out["tool_calls"] = calls
    return [out]


def _to_openai_user(message: Message, where: str) -> list[Raw]:
    tool_messages: list[Raw] = []
    parts: list[Raw] = []
    for j, block in enumerate(message.content):
        bw = f"{where} block {j}"
        _check_placement(block, "user", bw)
        if isinstance(block, ToolResultBlock):
            content = _collapse(
                [_to_openai_tool_part(c, f"{bw} content {k}") for k, c in enumerate(block.content)]
            )
            tool_messages.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": content if content is not None else "",
                }
            )
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": _openai_image_url(block, bw)}})
        elif isinstance(block, DocumentBlock) and block.format == "pdf" and block.data is not None:
            data_url = f"data:application/pdf;base64,{_b64encode(block.data)}"
            parts.append({"type": "file", "file": {"filename": block.name, "file_data": data_url}})
        elif isinstance(block, DocumentBlock):
            _fail(bw, f"OpenAI chat takes documents as inline PDF only, not {block.format} / uri")
        elif isinstance(block, UnknownBlock):
            parts.append(_passthrough(block, "openai", bw))
    content = _collapse(parts)
    if content is None and tool_messages:
        return tool_messages
    return [*tool_messages, {"role": "user", "content": content if content is not None else ""}]


def _to_openai_tool_part(block: Any, where: str) -> Raw:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, JsonBlock):
        return {"type": "text", "text": json.dumps(block.json_, ensure_ascii=False)}
    _fail(where, f"OpenAI tool messages carry text only, not {block.type}; describe it in text")


def _openai_image_url(block: ImageBlock, where: str) -> str:
    if block.data is not None:
        return f"data:image/{block.format};base64,{_b64encode(block.data)}"
    if block.uri is not None:
        return _web_uri(block.uri, "OpenAI", where)
    _fail(where, "image has neither data nor uri")


def from_openai(raw: Sequence[Raw]) -> list[Message]:
    """OpenAI chat ``messages`` as Messages; tool messages join the user message after them.

    Raises ValidationError on malformed input, and on system/developer messages (take them
    out first with :func:`split_openai_system`).
    """
    out: list[Message] = []
    pending: list[ToolResultBlock] = []  # tool messages wait for the user message after them
    for where, msg in _indexed(raw, "openai message"):
        role = _get(msg, "role", where)
        if role == "tool":
            content = msg.get("content")
            parts = () if content in ("", None) else _from_openai_parts(content, where)
            if not all(isinstance(p, TextBlock) for p in parts):
                _fail(where, "tool message content must be text")
            pending.append(
                _build(
                    ToolResultBlock,
                    where,
                    tool_use_id=_get(msg, "tool_call_id", where),
                    content=parts,
                )
            )
            continue
        if role == "user":
            out.append(
                Message(
                    role="user", content=(*pending, *_from_openai_parts(msg.get("content"), where))
                )
            )
            pending = []
            continue
        if pending:
            out.append(Message(role="user", content=tuple(pending)))
            pending = []
        if role == "assistant":
            calls = [
                _from_openai_call(c, cw)
                for cw, c in _indexed(msg.get("tool_calls") or [], f"{where} tool_call")
            ]
            out.append(
                Message(
                    role="assistant",
                    content=(*_from_openai_parts(msg.get("content"), where), *calls),
                )
            )
        elif role in ("system", "developer"):
            _fail(
                where,
                f"{role} messages are not turns; take them out first with split_openai_system()",
            )
        else:
            _fail(where, f"role {role!r} is not 'user', 'assistant' or 'tool'")
    if pending:
        out.append(Message(role="user", content=tuple(pending)))
    return out


def _from_openai_parts(content: Any, where: str) -> tuple[Any, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextBlock(text=content),)
    blocks: list[Any] = []
    for pw, part in _indexed(content, f"{where} part"):
        kind = part.get("type")
        if kind == "text":
            blocks.append(_build(TextBlock, pw, text=_get(part, "text", pw)))
        elif kind == "image_url":
            url = str(_get(_as_dict(_get(part, "image_url", pw), pw), "url", pw))
            if url.startswith("data:"):
                media_type, data = _parse_data_url(url, pw)
                blocks.append(
                    _build(ImageBlock, pw, format=_image_format(media_type, pw), data=data)
                )
            else:
                blocks.append(_build(ImageBlock, pw, format=_format_from_url(url), uri=url))
        elif kind == "file" and str(_as_dict(part.get("file"), pw).get("file_data", "")).startswith(
            "data:"
        ):
            file = part["file"]
            media_type, data = _parse_data_url(file["file_data"], pw)
            if media_type != "application/pdf":
                _fail(pw, f"file part of type {media_type!r}; only application/pdf is supported")
            name = file.get("filename") or "document"
            blocks.append(_build(DocumentBlock, pw, format="pdf", name=name, data=data))
        else:
            blocks.append(_unknown(part, "openai"))
    return tuple(blocks)


def _parse_data_url(url: str, where: str) -> tuple[str, bytes]:
    header, comma, payload = url.partition(",")
    if not comma or not header.startswith("data:") or not header.endswith(";base64"):
        _fail(where, "expected a base64 data URL like 'data:image/png;base64,...'")
    return header[len("data:") : -len(";base64")], _b64decode(payload, where)


def _from_openai_call(call: Raw, where: str) -> ToolUseBlock | UnknownBlock:
    if call.get("type", "function") != "function":
        return _unknown(call, "openai")
    function = _as_dict(_get(call, "function", where), where)
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"{where}: tool call arguments are not valid JSON: {exc}") from exc
    return _build(
        ToolUseBlock,
        where,
        tool_use_id=_get(call, "id", where),
        name=_get(function, "name", where),
        input=parsed,
    )


def split_openai_system(raw: Sequence[Raw]) -> tuple[tuple[TextBlock, ...], list[Raw]]:
    """Take system and developer messages out of an OpenAI list: their text, and the rest.

    Pass the rest to :func:`from_openai`. Raises ValidationError on malformed input.
    """
    system: list[TextBlock] = []
    rest: list[Raw] = []
    for where, msg in _indexed(raw, "openai message"):
        if _get(msg, "role", where) not in ("system", "developer"):
            rest.append(msg)
            continue
        for block in _from_openai_parts(_get(msg, "content", where), where):
            if not isinstance(block, TextBlock):
                _fail(where, "system message content must be text")
            system.append(block)
    return tuple(system), rest
