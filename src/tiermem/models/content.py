"""Messages and content blocks, in the shape of Bedrock Converse and Strands.

A :class:`Message` has a role (``user`` or ``assistant``) and a tuple of content blocks.
Tool results travel in ``user`` messages, as in Converse. The block kinds mirror Converse:
text, toolUse, toolResult, image, document, reasoningContent and cachePoint. A block kind
this release does not know is read as an :class:`UnknownBlock` that keeps its raw data, so
a newer writer never breaks an older reader.

Converters to and from the provider wire formats live in :mod:`tiermem.models.convert`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from tiermem.models.base import Base64Bytes, FrozenModel, JsonValue

__all__ = [
    "CachePointBlock",
    "ContentBlock",
    "DocumentBlock",
    "ImageBlock",
    "JsonBlock",
    "Message",
    "ReasoningBlock",
    "Role",
    "TextBlock",
    "ToolResultBlock",
    "ToolResultContent",
    "ToolUseBlock",
    "UnknownBlock",
    "text_of",
]

Role = Literal["user", "assistant"]
ImageFormat = Literal["png", "jpeg", "gif", "webp"]
DocumentFormat = Literal["pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md"]


class TextBlock(FrozenModel):
    type: Literal["text"] = "text"
    text: str


class JsonBlock(FrozenModel):
    """Structured JSON, only valid inside a tool result."""

    type: Literal["json"] = "json"
    json_: JsonValue = Field(alias="json")


class ImageBlock(FrozenModel):
    """An image, carried inline (``data``) or by reference (``uri``, e.g. an S3 location)."""

    type: Literal["image"] = "image"
    format: ImageFormat
    data: Base64Bytes | None = None
    uri: str | None = None


class DocumentBlock(FrozenModel):
    """A document, carried inline (``data``) or by reference (``uri``)."""

    type: Literal["document"] = "document"
    format: DocumentFormat
    name: str
    data: Base64Bytes | None = None
    uri: str | None = None


class ToolUseBlock(FrozenModel):
    type: Literal["tool_use"] = "tool_use"
    tool_use_id: str
    name: str
    input: JsonValue = Field(default_factory=dict)


def _result_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("text", "json", "image", "document") else "text"


ToolResultContent = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[JsonBlock, Tag("json")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[DocumentBlock, Tag("document")],
    Discriminator(_result_kind),
]


class ToolResultBlock(FrozenModel):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: tuple[ToolResultContent, ...] = ()
    status: Literal["success", "error"] = "success"


class ReasoningBlock(FrozenModel):
    """Model reasoning. ``redacted`` holds provider-encrypted reasoning, kept opaque."""

    type: Literal["reasoning"] = "reasoning"
    text: str = ""
    signature: str | None = None
    redacted: Base64Bytes | None = None


class CachePointBlock(FrozenModel):
    """Marks the end of a prompt-cache prefix."""

    type: Literal["cache_point"] = "cache_point"
    cache_type: Literal["default"] = "default"


class UnknownBlock(FrozenModel):
    """A block kind this release does not know; ``data`` keeps it unchanged."""

    type: Literal["unknown"] = "unknown"
    kind: str = ""
    data: dict[str, JsonValue] = Field(default_factory=dict)


_KNOWN_BLOCKS = frozenset(
    {"text", "tool_use", "tool_result", "image", "document", "reasoning", "cache_point", "unknown"}
)


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    # A non-string type (a dict, a list) is an unknown block, not an unhashable crash.
    return kind if isinstance(kind, str) and kind in _KNOWN_BLOCKS else "unknown"


def _wrap_unknown(value: Any) -> Any:
    # Before validation: an unrecognised dict becomes an UnknownBlock holding the raw data.
    if (
        isinstance(value, dict)
        and _block_kind(value) == "unknown"
        and value.get("type") != "unknown"
    ):
        return {"type": "unknown", "kind": str(value.get("type", "")), "data": value}
    return value


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[DocumentBlock, Tag("document")]
    | Annotated[ReasoningBlock, Tag("reasoning")]
    | Annotated[CachePointBlock, Tag("cache_point")]
    | Annotated[UnknownBlock, BeforeValidator(_wrap_unknown), Tag("unknown")],
    Discriminator(_block_kind),
]


class Message(FrozenModel):
    role: Role
    content: tuple[ContentBlock, ...]

    @classmethod
    def text(cls, role: Role, text: str) -> Message:
        """A message with one text block."""
        return cls(role=role, content=(TextBlock(text=text),))


def text_of(blocks: tuple[Any, ...] | list[Any]) -> str:
    """The plain text of some blocks: text, reasoning text, tool inputs and results.

    Used for token counting, search indexing and rule-based extraction.
    """
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextBlock | ReasoningBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"{block.name} {json.dumps(block.input, ensure_ascii=False, default=str)}")
        elif isinstance(block, ToolResultBlock):
            parts.append(text_of(block.content))
        elif isinstance(block, JsonBlock):
            parts.append(json.dumps(block.json_, ensure_ascii=False, default=str))
        elif isinstance(block, DocumentBlock):
            parts.append(block.name)
    return "\n".join(p for p in parts if p)
