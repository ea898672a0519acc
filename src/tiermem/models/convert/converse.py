"""Bedrock Converse: ``to_converse``/``from_converse`` and the ``system`` list helpers.

Bytes stay raw ``bytes``, as boto3 sends and returns them. What Converse cannot carry is
listed in :mod:`tiermem.models.convert`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

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
    _AnyBlock,
    _as_dict,
    _build,
    _check_placement,
    _fail,
    _fields,
    _indexed,
    _passthrough,
    _role,
    _system,
    _unknown,
)

__all__ = ["from_converse", "from_converse_system", "to_converse", "to_converse_system"]


def _raw_bytes(value: Any, at: str) -> bytes:
    # The models would take a str as base64, but Converse carries raw bytes: a str here
    # means a JSON dump of a request, not what boto3 sends or returns.
    if not isinstance(value, bytes | bytearray):
        _fail(at, f"expected raw bytes (as boto3 returns them), got {type(value).__name__}")
    return bytes(value)


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
