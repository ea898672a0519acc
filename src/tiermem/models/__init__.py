"""Domain models: messages and content blocks, turns, sessions, memory records."""

from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime, to_epoch_ms
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
    text_of,
)
from tiermem.models.memory import MemoryRecord, Provenance
from tiermem.models.session import (
    ActiveEntity,
    SessionMetadata,
    SessionRecord,
    SessionRef,
    SessionSnapshot,
    StateBlob,
    UserTier,
)
from tiermem.models.turns import REDACTED_TEXT, Entity, NewTurn, Turn

__all__ = [
    "REDACTED_TEXT",
    "ActiveEntity",
    "CachePointBlock",
    "ContentBlock",
    "DocumentBlock",
    "Entity",
    "FrozenModel",
    "ImageBlock",
    "JsonBlock",
    "JsonValue",
    "MemoryRecord",
    "Message",
    "NewTurn",
    "Provenance",
    "ReasoningBlock",
    "Role",
    "SessionMetadata",
    "SessionRecord",
    "SessionRef",
    "SessionSnapshot",
    "StateBlob",
    "TextBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "Turn",
    "UnknownBlock",
    "UserTier",
    "UtcDatetime",
    "text_of",
    "to_epoch_ms",
]
