"""Anthropic Messages: ``to_anthropic``/``from_anthropic`` and the ``system`` helpers.

Bytes are base64 text. What Anthropic cannot carry is listed in :mod:`tiermem.models.convert`.
"""

from __future__ import annotations

import copy
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
    _AnyBlock,
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
    _role,
    _system,
    _unknown,
    _web_uri,
)

__all__ = ["from_anthropic", "from_anthropic_system", "to_anthropic", "to_anthropic_system"]

_TEXT_DOCUMENTS = frozenset({"txt", "md", "csv", "html"})


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
