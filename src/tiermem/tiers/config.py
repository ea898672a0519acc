"""How the hot and durable tiers work together: write policy, failure policy, lifetimes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from tiermem.errors import ValidationError

__all__ = ["HotFailurePolicy", "SessionTierConfig", "WritePolicy"]


class WritePolicy(StrEnum):
    WRITE_THROUGH = "write_through"
    """A turn is acknowledged only once the durable tier has it (the default). Nothing
    acknowledged is ever lost, whatever happens to the hot tier."""
    WRITE_BEHIND = "write_behind"
    """Turns go to the hot tier; the durable tier gets them every ``write_behind_every``
    turns, at close, and when the expiry sweeper hands the session off. Loss window: the
    turns since the last flush, if the hot tier loses them before the next flush (a Redis
    restart without persistence, an eviction, a ``delete``). Saves one durable write per
    turn (seed 001 writes its session tier every 5 turns)."""


class HotFailurePolicy(StrEnum):
    BYPASS = "bypass"
    """Hot tier unreachable: serve from the durable tier, log a warning and count it."""
    RAISE = "raise"
    """Hot tier unreachable: raise the BackendError."""


@dataclass(frozen=True, slots=True)
class SessionTierConfig:
    window: int = 20
    """Turns kept in the hot tier per session (seed 000: 20)."""
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH
    write_behind_every: int = 5
    """With write-behind, flush to the durable tier each time this many turns accumulated."""
    on_hot_failure: HotFailurePolicy = HotFailurePolicy.BYPASS
    durable_ttl: timedelta | None = timedelta(hours=24)
    """Retention of archived turns and session records (seed 001: 24 h); None keeps them."""
    hot_conflict_retries: int = 3
    """Concurrent writers can reach the hot tier out of order; retry this often, then
    rebuild the hot session from the durable tier."""
    read_refresh_granularity: timedelta = timedelta(seconds=10)
    """A read refreshes the hot expiry only if that moves it by at least this much: saves a
    write per read in a busy session."""
    sweep_lease: timedelta = timedelta(minutes=5)
    """How long an expiry sweeper owns a session it claimed before another may take it."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValidationError(f"window must be at least 1, got {self.window}")
        if self.write_policy is WritePolicy.WRITE_BEHIND and not (
            1 <= self.write_behind_every <= self.window
        ):
            raise ValidationError(
                f"write_behind_every must be between 1 and window ({self.window}), got "
                f"{self.write_behind_every}: unflushed turns must still be in the hot window"
            )
        if self.durable_ttl is not None and self.durable_ttl <= timedelta(0):
            raise ValidationError("durable_ttl must be positive, or None to keep turns forever")
        if self.hot_conflict_retries < 0:
            raise ValidationError("hot_conflict_retries must be >= 0")
        if self.sweep_lease <= timedelta(0):
            raise ValidationError("sweep_lease must be positive")
