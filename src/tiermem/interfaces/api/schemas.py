"""Request and response bodies of the REST API that are not library models.

Answers reuse the library's own models (``Turn``, ``ContextWindow``, ``MemoryRecord``,
``RecallHit``...) so the OpenAPI schema and the SDK share one definition. Requests are
validated here with bounds (sizes, ranges), so bad input is a 422 naming the field before
the service sees it; ids are checked and scoped by :class:`TenantScope`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tiermem.context.models import ToolDefinition
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind
from tiermem.longterm.knowledge import KnowledgeDocument
from tiermem.models import ContentBlock, MemoryRecord, SessionMetadata, SessionRef, Turn, UserTier
from tiermem.models.base import JsonValue
from tiermem.models.shape import check_shape
from tiermem.session import SessionStats
from tiermem.tools.breaker import BreakerStatus, ToolHealth

__all__ = [
    "ID_MAX",
    "ID_PATTERN",
    "ContextRequest",
    "DeletedResponse",
    "DocumentListResponse",
    "DocumentTextRequest",
    "ForgetResponse",
    "HealthResponse",
    "MemoryListResponse",
    "OpenSessionRequest",
    "PurgeResponse",
    "ReadyResponse",
    "RecallRequest",
    "RecallResponse",
    "RememberRequest",
    "ServiceStats",
    "SessionInfo",
    "SessionListResponse",
    "StatePutRequest",
    "ToolInfo",
    "ToolListResponse",
    "TurnListResponse",
    "TurnRequest",
]

ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
"""What an id may hold (documented in the schema): no control characters. The length
limit is 256 characters less the caller's tenant prefix (``<tenant>:``), checked when the
id is scoped."""
ID_MAX = 256

MAX_QUERY_CHARS = 4_000
MAX_TEXT_CHARS = 1_000_000


class _Request(BaseModel):
    # Unknown fields are refused: a misspelt option must not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _shape(cls, value: Any, info: ValidationInfo) -> Any:
        """Every field, before anything else: no nesting deeper than 64 levels and no lone
        surrogates (either would be stored, then fail every later read)."""
        check_shape(value, what=info.field_name or "value")
        return value


class OpenSessionRequest(_Request):
    """Open a session: resume it when it exists, else create it for ``user_id``."""

    user_id: str = Field(
        description="The caller's user id (scoped to the key's tenant).",
        min_length=1,
        max_length=ID_MAX,
        pattern=ID_PATTERN,
    )
    session_id: str | None = Field(
        default=None,
        description="Omit to get a new id.",
        min_length=1,
        max_length=ID_MAX,
        pattern=ID_PATTERN,
    )
    user_tier: UserTier = UserTier.STANDARD
    locale: str = Field(default="en-US", min_length=2, max_length=35)


class SessionInfo(BaseModel):
    """A session's metadata and statistics."""

    metadata: SessionMetadata
    stats: SessionStats


class SessionListResponse(BaseModel):
    sessions: list[SessionRef]


class TurnRequest(_Request):
    """One turn. ``content`` is a string or a list of content blocks."""

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock] = Field(min_length=1)
    timestamp: datetime | None = Field(
        default=None, description="An aware time, for imports and replays; default: now."
    )
    importance: float | None = Field(default=None, ge=0.0, le=1.0)
    pinned: bool = False
    agent_name: str | None = Field(default=None, max_length=200)
    intent: str | None = Field(default=None, max_length=200)
    latency_ms: float | None = Field(default=None, ge=0.0, le=86_400_000.0)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


class TurnListResponse(BaseModel):
    turns: list[Turn]


class ContextRequest(_Request):
    """What to assemble: the window for ``query`` within ``budget`` tokens or ``model``'s
    window; ``system`` and ``tools`` form the cacheable prefix."""

    query: str | None = Field(default=None, max_length=MAX_QUERY_CHARS)
    budget: int | None = Field(default=None, ge=1, le=10_000_000, strict=True)
    model: str | None = Field(default=None, max_length=200)
    system: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    tools: list[ToolDefinition] = Field(default_factory=list, max_length=512)
    current: str | None = Field(
        default=None,
        max_length=MAX_TEXT_CHARS,
        description="A user message not yet added as a turn.",
    )
    recall_k: int = Field(default=8, ge=1, le=100, strict=True)
    optimize: bool = Field(
        default=True,
        strict=True,
        description="Optimise the hot turns shown (superseded failed calls dropped, seen "
        "and superseded tool outputs replaced by a reference to their archived turn); "
        "false sends them as stored.",
    )


class StatePutRequest(_Request):
    data: dict[str, JsonValue]
    expected_version: int | None = Field(
        default=None, ge=0, le=2**53, description="Compare-and-set: 409 when it differs."
    )


class RememberRequest(_Request):
    content: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    memory_type: str = Field(default="fact", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    importance: float | None = Field(default=None, ge=0.0, le=1.0)
    metadata: dict[str, JsonValue] | None = None


class MemoryListResponse(BaseModel):
    memories: list[MemoryRecord]


class RecallRequest(_Request):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    k: int = Field(default=5, ge=1, le=100, strict=True)
    types: list[str] | None = Field(default=None, max_length=64)
    scope: list[DocKind] = Field(
        default_factory=lambda: list[DocKind](["memory"]), min_length=1, max_length=3
    )
    min_importance: float = Field(default=0.0, ge=0.0, le=1.0)

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is blank; give the words to recall by")
        return value


class RecallResponse(BaseModel):
    hits: list[RecallHit] = Field(description="Best first.")


class ForgetResponse(BaseModel):
    forgotten: bool


class PurgeResponse(BaseModel):
    deleted: int
    """Sessions and memories the durable tier deleted."""


class DeletedResponse(BaseModel):
    deleted: bool


class DocumentListResponse(BaseModel):
    documents: list[KnowledgeDocument]


class DocumentTextRequest(_Request):
    """A text or Markdown document sent as JSON (binary formats: use the multipart route)."""

    name: str = Field(min_length=1, max_length=200, description="e.g. notes.md")
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    format: Literal["txt", "md"] | None = None
    tags: list[str] = Field(default_factory=list, max_length=64)


class ToolInfo(BaseModel):
    """A registered tool and its breaker, as every worker sees it."""

    name: str
    description: str
    health: ToolHealth
    breaker: BreakerStatus
    recent_failures: int
    since: datetime | None = None
    retry_at: datetime | None = None
    fallbacks: list[str] = Field(default_factory=list)
    message: str | None = None
    calls: int = 0
    failures: int = 0


class ToolListResponse(BaseModel):
    tools: list[ToolInfo]


class ServiceStats(BaseModel):
    """Process-wide counters (no tenant data): tiers, background work, rate limiting."""

    hot_hits: int
    reloads: int
    bypasses: int
    hot_resyncs: int
    flushes: int
    flushed_turns: int
    lost_turns: int
    index_failures: int
    auto_detect_failures: int
    hot_backend: str
    durable_backend: str


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    status: Literal["ready", "unavailable"]
    backends: dict[str, str]
