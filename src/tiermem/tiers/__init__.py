"""The hot and durable tiers composed: reload, write policies, failure policy, expiry sweeps."""

from tiermem.tiers.config import HotFailurePolicy, SessionTierConfig, WritePolicy
from tiermem.tiers.sweeper import ExpirySweeper, SweepResult
from tiermem.tiers.tiered import SessionView, TieredSessionStore, TierMetrics

__all__ = [
    "ExpirySweeper",
    "HotFailurePolicy",
    "SessionTierConfig",
    "SessionView",
    "SweepResult",
    "TierMetrics",
    "TieredSessionStore",
    "WritePolicy",
]
