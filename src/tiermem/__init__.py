"""tiermem: tiered memory and state for conversational LLM agents.

The hot tier holds each session's recent turns and state; the durable tier archives every
turn and keeps summaries and structured memory; long-term memory keeps what matters about a
user across sessions. See README.md for the picture and the numbers.
"""

from tiermem.clock import Clock, FakeClock, IdFactory, SystemClock, UlidFactory
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    BudgetExceededError,
    ConflictError,
    NotFoundError,
    TierMemError,
    UnknownModelError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.runtime import freeze_startup_heap
from tiermem.settings import TierMemSettings

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "BudgetExceededError",
    "Clock",
    "ConflictError",
    "FakeClock",
    "IdFactory",
    "NotFoundError",
    "SystemClock",
    "TierMemError",
    "TierMemSettings",
    "UlidFactory",
    "UnknownModelError",
    "UnsupportedCapabilityError",
    "ValidationError",
    "freeze_startup_heap",
]
