"""The three state layers of a session, as frozen, versioned values (seed 000, section 3).

* :class:`ConversationState` — where the dialogue is: phase, active intent and agent, slots
  (empty / inferred / confirmed), a clarification queue. Changes on every turn.
* :class:`TaskState` — multi-step tool work: tasks with a step queue, step results,
  retries, a time budget per task, checkpoints to roll back to. Changes on every tool call.
* :class:`EnvironmentState` — what the agent knows about the user's world: profile
  snapshot, tier, locale and time zone, cart, active promotions. Read-mostly; refreshed
  when an external system reports a change.

Each layer is stored as its own named state blob (:data:`LAYER_NAMES`), so writes to one
layer never contend with writes to another. The models hold values and invariants only;
the moves between values are the pure functions of :mod:`tiermem.state.conversation`,
:mod:`tiermem.state.tasks` and :mod:`tiermem.state.environment`.

Forward compatibility: a field this release does not know is *kept* (``extra="allow"``),
so a read-modify-write by an older worker does not erase what a newer one wrote. A blob
with a newer ``schema_version`` is read as far as this release understands it, and the
coordinator refuses to write it (see :class:`~tiermem.state.coordinator.StateCoordinator`).
Closed sets that drive logic (slot and step statuses) are enums; open ones that callers
extend (dialogue phases, user tiers) are strings with suggested constants.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, model_validator

from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime

__all__ = [
    "CONVERSATION",
    "ENVIRONMENT",
    "LAYER_NAMES",
    "SCHEMA_VERSION",
    "TASK",
    "Cart",
    "CartItem",
    "Checkpoint",
    "Clarification",
    "ConversationState",
    "DialoguePhase",
    "EnvironmentState",
    "LayerState",
    "Promotion",
    "Slot",
    "SlotStatus",
    "SlotValue",
    "SourceMark",
    "StateModel",
    "Step",
    "StepStatus",
    "Task",
    "TaskState",
    "TaskStatus",
]

SCHEMA_VERSION = 1
"""The layer schema this release writes."""

CONVERSATION, TASK, ENVIRONMENT = "conversation", "task", "environment"
LAYER_NAMES = (CONVERSATION, TASK, ENVIRONMENT)
"""The state blob names of the three layers, in the order they are rendered."""

SlotValue = str | int | float | bool
"""What a slot can hold: a JSON scalar."""


class StateModel(FrozenModel):
    """A frozen state value that keeps fields it does not know (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class LayerState(StateModel):
    """The value of one whole layer: what one state blob holds."""

    schema_version: int = SCHEMA_VERSION


def _unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two {what}s are named {name!r}; names must be unique")
        seen.add(name)


# ---------------------------------------------------------------- conversation


class DialoguePhase(StrEnum):
    """Suggested dialogue phases (seed 000). ``ConversationState.phase`` is a plain string:
    an application may use its own phases."""

    GREETING = "greeting"
    INTENT_DETECTION = "intent_detection"
    SLOT_FILLING = "slot_filling"
    TOOL_EXECUTION = "tool_execution"
    RESPONSE_GENERATION = "response_generation"
    FOLLOW_UP = "follow_up"
    HANDOFF = "handoff"
    FAREWELL = "farewell"


class SlotStatus(StrEnum):
    EMPTY = "empty"
    INFERRED = "inferred"
    """Guessed from context (an earlier turn, the profile): confirm before acting on it."""
    CONFIRMED = "confirmed"


class Slot(StateModel):
    """One piece of information the active intent needs (a genre, an order number)."""

    name: str = Field(min_length=1, max_length=64)
    required: bool = False
    prompt: str = ""
    """What to ask the user while the slot is missing."""
    valid_values: tuple[SlotValue, ...] = ()
    """The values the slot accepts; empty means any."""
    status: SlotStatus = SlotStatus.EMPTY
    value: SlotValue | None = None
    turn_index: int | None = None
    """The turn the value came from, when known (provenance)."""

    @property
    def missing(self) -> bool:
        """Required and not confirmed: the agent still has to ask (or confirm)."""
        return self.required and self.status is not SlotStatus.CONFIRMED

    def accepts(self, value: SlotValue) -> bool:
        return not self.valid_values or value in self.valid_values


class Clarification(StateModel):
    """A question the agent has to put to the user, in the order they were queued."""

    clarification_id: str = Field(min_length=1, max_length=256)
    question: str = Field(min_length=1)
    slot: str | None = None
    """The slot the answer fills, if any: confirming that slot resolves the question."""
    asked_at: UtcDatetime


class ConversationState(LayerState):
    phase: str = DialoguePhase.GREETING.value
    intent: str | None = None
    agent: str | None = None
    slots: tuple[Slot, ...] = ()
    clarifications: tuple[Clarification, ...] = ()

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        _unique([s.name for s in self.slots], "slot")
        _unique([c.clarification_id for c in self.clarifications], "clarification")
        return self

    def slot(self, name: str) -> Slot | None:
        return next((s for s in self.slots if s.name == name), None)

    @property
    def missing_slots(self) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.missing)


# ---------------------------------------------------------------- task execution


class StepStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    """Failed with no retries left."""
    TIMED_OUT = "timed_out"
    """The task's time budget ran out before the step finished (or started)."""


class TaskStatus(StrEnum):
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class Step(StateModel):
    """One tool call (or any unit of work) in a task's step queue.

    To plan a step, give its definition only (``step_id``, ``tool``, ``description``,
    ``params``, ``max_retries``); the rest is runtime state the transitions maintain.
    """

    step_id: str = Field(min_length=1, max_length=256)
    tool: str | None = None
    description: str = ""
    params: dict[str, JsonValue] = Field(default_factory=dict)
    max_retries: int | None = Field(default=None, ge=0, le=100)
    """Failures sent back to the queue before the step fails; None: the task's default."""
    status: StepStatus = StepStatus.QUEUED
    result: JsonValue = None
    error: str | None = None
    """The last failure, kept while the step is retried."""
    attempts: int = Field(default=0, ge=0)
    """How often the step was started (a takeover after a crash counts)."""
    retries: int = Field(default=0, ge=0)
    worker: str | None = None
    """Who holds the step while it is in progress."""
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None

    def definition(self) -> tuple[object, ...]:
        """What a plan says about the step (compared when a task is created again)."""
        return (self.step_id, self.tool, self.description, self.params, self.max_retries)


class Checkpoint(StateModel):
    """The steps of a task as they were at a point the agent may want to return to."""

    name: str = Field(min_length=1, max_length=64)
    created_at: UtcDatetime
    steps: tuple[Step, ...]


class Task(StateModel):
    task_id: str = Field(min_length=1, max_length=256)
    goal: str = ""
    steps: tuple[Step, ...] = Field(min_length=1)
    status: TaskStatus = TaskStatus.ACTIVE
    max_retries: int = Field(default=2, ge=0, le=100)
    budget_ms: int | None = Field(default=None, ge=1)
    """Wall time the task may take, counted from its creation (or its last rollback with
    a new budget); None: no limit."""
    created_at: UtcDatetime
    deadline: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    checkpoints: tuple[Checkpoint, ...] = ()
    note: str | None = None
    """Why the task ended, when it did not simply complete (cancel reason, failure)."""

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        _unique([s.step_id for s in self.steps], "step")
        _unique([c.name for c in self.checkpoints], "checkpoint")
        return self

    def step(self, step_id: str) -> Step | None:
        return next((s for s in self.steps if s.step_id == step_id), None)

    def retries_allowed(self, step: Step) -> int:
        return self.max_retries if step.max_retries is None else step.max_retries

    @property
    def finished(self) -> bool:
        return self.status is not TaskStatus.ACTIVE

    @property
    def next_open_step(self) -> Step | None:
        """The first step that is not completed: the one running or next to run."""
        return next((s for s in self.steps if s.status is not StepStatus.COMPLETED), None)

    def time_left(self, now: datetime) -> timedelta | None:
        if self.deadline is None:
            return None
        return max(self.deadline - now, timedelta(0))


class TaskState(LayerState):
    tasks: tuple[Task, ...] = ()

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        _unique([t.task_id for t in self.tasks], "task")
        return self

    def task(self, task_id: str) -> Task | None:
        return next((t for t in self.tasks if t.task_id == task_id), None)

    @property
    def active(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if not t.finished)


# ---------------------------------------------------------------- environment


class CartItem(StateModel):
    sku: str = Field(min_length=1)
    title: str = ""
    quantity: int = Field(default=1, ge=1)
    unit_price: Decimal = Field(default=Decimal(0), ge=0)


class Cart(StateModel):
    items: tuple[CartItem, ...] = ()
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")

    @property
    def item_count(self) -> int:
        return sum(i.quantity for i in self.items)

    @property
    def total(self) -> Decimal:
        return sum((i.unit_price * i.quantity for i in self.items), Decimal(0))


class Promotion(StateModel):
    promotion_id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    detail: str = ""
    starts_at: UtcDatetime | None = None
    ends_at: UtcDatetime | None = None

    def active_at(self, now: datetime) -> bool:
        started = self.starts_at is None or self.starts_at <= now
        return started and (self.ends_at is None or now < self.ends_at)


class SourceMark(StateModel):
    """The last event applied from one external source (for ordered, idempotent refresh)."""

    event_id: str | None = None
    occurred_at: UtcDatetime


class EnvironmentState(LayerState):
    profile: dict[str, JsonValue] = Field(default_factory=dict)
    """A snapshot of the user service's profile (display name, preferred genres...)."""
    tier: str = "standard"
    locale: str = Field(default="en-US", pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*$")
    timezone: str | None = None
    """An IANA zone (``Asia/Tokyo``); None: derived from the locale's region when that
    region has one zone, else UTC."""
    cart: Cart = Field(default_factory=Cart)
    promotions: tuple[Promotion, ...] = ()
    sources: dict[str, SourceMark] = Field(default_factory=dict)
