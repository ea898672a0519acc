"""Session-level models: metadata, active entities, state blobs, references, snapshots."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime
from tiermem.models.turns import Turn

__all__ = [
    "ActiveEntity",
    "SessionMetadata",
    "SessionRecord",
    "SessionRef",
    "SessionSnapshot",
    "StateBlob",
    "UserTier",
]


class UserTier(StrEnum):
    STANDARD = "standard"
    PREMIUM = "premium"
    VIP = "vip"


class SessionMetadata(FrozenModel):
    """What the agent knows about a session beyond its turns (seed 000's SessionMetadata)."""

    schema_version: int = 1
    session_id: str
    user_id: str
    user_tier: UserTier = UserTier.STANDARD
    locale: str = "en-US"
    active_intent: str = ""
    active_agent: str = ""
    cart_item_count: int = Field(default=0, ge=0)
    turn_count: int = Field(default=0, ge=0)
    created_at: UtcDatetime
    last_activity: UtcDatetime
    closed_at: UtcDatetime | None = None
    attributes: dict[str, JsonValue] = Field(default_factory=dict)


class ActiveEntity(FrozenModel):
    """The current value of one entity kind in a session ("series" → "Berserk").

    A new value of the same kind replaces the old one.
    """

    kind: str
    value: str
    turn_index: int | None = None
    updated_at: UtcDatetime


class StateBlob(FrozenModel):
    """A named JSON state object (dialogue state, tool state) with a version for CAS."""

    name: str
    data: dict[str, JsonValue]
    version: int = Field(ge=1)
    updated_at: UtcDatetime


class SessionRecord(FrozenModel):
    """A versioned durable record of a session: summaries, structured memory, watermarks."""

    kind: str
    data: dict[str, JsonValue]
    version: int = Field(ge=1)
    updated_at: UtcDatetime
    expires_at: UtcDatetime | None = None


class SessionRef(FrozenModel):
    """A session in a user's list of sessions."""

    session_id: str
    user_id: str
    created_at: UtcDatetime


class SessionSnapshot(FrozenModel):
    """Everything the hot tier holds for one session, read in one round trip."""

    session_id: str
    turns: tuple[Turn, ...] = ()
    metadata: SessionMetadata | None = None
    entities: dict[str, ActiveEntity] = Field(default_factory=dict)
    state: dict[str, StateBlob] = Field(default_factory=dict)
    version: int = Field(ge=0)
    next_index: int = Field(ge=0)
    expires_at: UtcDatetime
