"""Session state for the agent: conversation, task execution and environment layers.

:class:`StateCoordinator` stores the three layers of one session (one versioned state blob
each) and changes them with the pure transitions of :mod:`tiermem.state.conversation`,
:mod:`tiermem.state.tasks` and :mod:`tiermem.state.environment`;
:meth:`StateCoordinator.to_agent_context` renders them for the prompt
(:mod:`tiermem.state.render`).
"""

from tiermem.state.coordinator import StateCoordinator, StateSession, StateView
from tiermem.state.environment import LocalTime
from tiermem.state.models import (
    CONVERSATION,
    ENVIRONMENT,
    LAYER_NAMES,
    SCHEMA_VERSION,
    TASK,
    Cart,
    CartItem,
    Checkpoint,
    Clarification,
    ConversationState,
    DialoguePhase,
    EnvironmentState,
    LayerState,
    Promotion,
    Slot,
    SlotStatus,
    SlotValue,
    SourceMark,
    Step,
    StepStatus,
    Task,
    TaskState,
    TaskStatus,
)
from tiermem.state.render import AgentContext, StateSource, render_agent_context

__all__ = [
    "CONVERSATION",
    "ENVIRONMENT",
    "LAYER_NAMES",
    "SCHEMA_VERSION",
    "TASK",
    "AgentContext",
    "Cart",
    "CartItem",
    "Checkpoint",
    "Clarification",
    "ConversationState",
    "DialoguePhase",
    "EnvironmentState",
    "LayerState",
    "LocalTime",
    "Promotion",
    "Slot",
    "SlotStatus",
    "SlotValue",
    "SourceMark",
    "StateCoordinator",
    "StateSession",
    "StateSource",
    "StateView",
    "Step",
    "StepStatus",
    "Task",
    "TaskState",
    "TaskStatus",
    "render_agent_context",
]
