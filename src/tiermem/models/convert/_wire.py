"""What the three wire formats share: the system prompt type and the rules they all follow.

:data:`SystemBlock`; errors that name where in the input they are (``_fail``, ``_fields``,
``_build`` and friends); the placement, pass-through and system-prompt rules every format
applies to blocks; and the media encodings two formats use (base64, image formats, URLs).
"""

from __future__ import annotations

import base64
import binascii
import copy
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
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)

Raw = dict[str, Any]
SystemBlock = TextBlock | CachePointBlock | UnknownBlock
"""What a system prompt is made of: text, cache points, and blocks kept from a format."""

_AnyBlock = ContentBlock | JsonBlock
_M = TypeVar("_M", bound=pydantic.BaseModel)
_IMAGE_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}


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


def _system(system: Sequence[Any]) -> Sequence[SystemBlock]:
    for j, block in enumerate(system):
        if not isinstance(block, TextBlock | CachePointBlock | UnknownBlock):
            _fail(
                f"system block {j}",
                f"a system prompt holds text and cache points, not {block.type}",
            )
    return system
