"""Moves of the conversation layer: pure functions from a state to the next state.

Every function returns the state it was given (equal, so the coordinator writes nothing)
when the move changes nothing, which makes a repeated call harmless: confirming a slot
twice, asking the same clarification twice, resolving one that is gone. A move that makes
no sense raises :class:`~tiermem.errors.ValidationError` and says what to do instead.

Phases are the caller's to set (:func:`set_phase`), with one exception: a new intent
starts in ``slot_filling`` when it has required slots, else in ``intent_detection``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tiermem.errors import ValidationError
from tiermem.state.models import (
    Clarification,
    ConversationState,
    DialoguePhase,
    Slot,
    SlotStatus,
    SlotValue,
)

__all__ = [
    "MAX_CLARIFICATIONS",
    "MAX_SLOTS",
    "ask_clarification",
    "clear_slot",
    "confirm_slot",
    "define_slot",
    "finish_intent",
    "infer_slot",
    "resolve_clarification",
    "set_agent",
    "set_intent",
    "set_phase",
]

MAX_SLOTS = 64
MAX_CLARIFICATIONS = 20
"""A longer queue means the agent is asking instead of answering: refuse, do not grow."""


def _name(value: str | None, what: str) -> str | None:
    if value is not None and not value.strip():
        raise ValidationError(f"{what} must not be blank; pass None to clear it")
    return value


def _with_slot(state: ConversationState, slot: Slot) -> ConversationState:
    slots = tuple(slot if s.name == slot.name else s for s in state.slots)
    return state.model_copy(update={"slots": slots})


def _slot(state: ConversationState, name: str) -> Slot:
    slot = state.slot(name)
    if slot is None:
        known = ", ".join(s.name for s in state.slots) or "none"
        raise ValidationError(
            f"no slot named {name!r} for intent {state.intent!r} (slots: {known}); "
            "define it first with define_slot"
        )
    return slot


def _check_value(slot: Slot, value: SlotValue) -> None:
    if not slot.accepts(value):
        allowed = ", ".join(repr(v) for v in slot.valid_values)
        raise ValidationError(
            f"{value!r} is not a valid value for slot {slot.name!r}; use one of {allowed}"
        )


def _check_new_slot(slot: Slot) -> None:
    if (slot.status is SlotStatus.EMPTY) != (slot.value is None):
        raise ValidationError(
            f"slot {slot.name!r}: an empty slot has no value and a filled one has one"
        )
    if slot.value is not None:
        _check_value(slot, slot.value)


def _phase_for(slots: Sequence[Slot]) -> str:
    missing = any(s.missing for s in slots)
    return (DialoguePhase.SLOT_FILLING if missing else DialoguePhase.INTENT_DETECTION).value


def set_phase(state: ConversationState, phase: str) -> ConversationState:
    """Move the dialogue to ``phase`` (a :class:`DialoguePhase` value or your own)."""
    if not phase or not phase.strip():
        raise ValidationError("phase must not be blank")
    return state if state.phase == phase else state.model_copy(update={"phase": str(phase)})


def set_agent(state: ConversationState, agent: str | None) -> ConversationState:
    """Route the dialogue to another agent (a handoff); None: no agent."""
    _name(agent, "agent")
    return state if state.agent == agent else state.model_copy(update={"agent": agent})


def set_intent(
    state: ConversationState,
    intent: str,
    *,
    agent: str | None = None,
    slots: Sequence[Slot] = (),
) -> ConversationState:
    """Make ``intent`` the active intent, handled by ``agent`` (kept when None).

    The same intent again keeps its slots' values and merges the definitions given
    (:func:`define_slot`). A different intent replaces the slots with ``slots`` and drops
    the clarification queue (those questions were about the old intent); the phase becomes
    ``slot_filling`` if a required slot is missing, else ``intent_detection``.
    """
    _name(intent, "intent")
    if state.intent == intent:
        for slot in slots:
            state = define_slot(state, slot)
        return set_agent(state, agent) if agent is not None else state
    if len(slots) > MAX_SLOTS:
        raise ValidationError(f"an intent may have at most {MAX_SLOTS} slots, got {len(slots)}")
    for slot in slots:
        _check_new_slot(slot)
    try:
        return ConversationState.model_validate(
            {
                **state.model_dump(),
                "intent": intent,
                "agent": agent if agent is not None else state.agent,
                "slots": [s.model_dump() for s in slots],
                "clarifications": [],
                "phase": _phase_for(slots),
            }
        )
    except ValueError as exc:
        raise ValidationError(f"cannot set intent {intent!r}: {exc}") from exc


def define_slot(state: ConversationState, slot: Slot) -> ConversationState:
    """Add a slot, or change a slot's definition (required, prompt, valid values).

    A redefined slot keeps its value while the value stays valid; otherwise it is emptied.
    A new slot may come with a value (e.g. inferred from the profile).
    """
    held = state.slot(slot.name)
    if held is None:
        if len(state.slots) >= MAX_SLOTS:
            raise ValidationError(f"an intent may have at most {MAX_SLOTS} slots")
        _check_new_slot(slot)
        return state.model_copy(update={"slots": (*state.slots, slot)})
    update = {"required": slot.required, "prompt": slot.prompt, "valid_values": slot.valid_values}
    redefined = held.model_copy(update=update)
    if redefined.value is not None and not redefined.accepts(redefined.value):
        redefined = redefined.model_copy(
            update={"status": SlotStatus.EMPTY, "value": None, "turn_index": None}
        )
    return state if redefined == held else _with_slot(state, redefined)


def infer_slot(
    state: ConversationState, name: str, value: SlotValue, *, turn_index: int | None = None
) -> ConversationState:
    """Fill a slot with a value guessed from context; the agent confirms it before use.

    Raises:
        ValidationError: no such slot, a value outside its valid values, or the slot is
            already confirmed with another value (confirm the new value, or clear it).
    """
    slot = _slot(state, name)
    _check_value(slot, value)
    if slot.status is SlotStatus.CONFIRMED:
        if slot.value == value:
            return state
        raise ValidationError(
            f"slot {name!r} is confirmed as {slot.value!r}; an inference does not override "
            "the user: confirm_slot the new value, or clear_slot first"
        )
    filled = slot.model_copy(
        update={"status": SlotStatus.INFERRED, "value": value, "turn_index": turn_index}
    )
    return state if filled == slot else _with_slot(state, filled)


def confirm_slot(
    state: ConversationState,
    name: str,
    value: SlotValue | None = None,
    *,
    turn_index: int | None = None,
) -> ConversationState:
    """Confirm a slot: its inferred value (``value`` None) or a value the user gave.

    Confirming resolves the clarifications queued for that slot.

    Raises:
        ValidationError: no such slot, a value outside its valid values, or nothing to
            confirm (the slot is empty and no value was given).
    """
    slot = _slot(state, name)
    if value is None:
        if slot.value is None:
            raise ValidationError(
                f"slot {name!r} is empty: there is no inferred value to confirm; "
                "pass the value the user gave"
            )
        value = slot.value
    _check_value(slot, value)
    keep_turn = turn_index if turn_index is not None else slot.turn_index
    confirmed = slot.model_copy(
        update={"status": SlotStatus.CONFIRMED, "value": value, "turn_index": keep_turn}
    )
    queue = tuple(c for c in state.clarifications if c.slot != name)
    if confirmed == slot and queue == state.clarifications:
        return state
    return _with_slot(state, confirmed).model_copy(update={"clarifications": queue})


def clear_slot(state: ConversationState, name: str) -> ConversationState:
    """Empty a slot (the user took the value back)."""
    slot = _slot(state, name)
    if slot.status is SlotStatus.EMPTY:
        return state
    empty = slot.model_copy(update={"status": SlotStatus.EMPTY, "value": None, "turn_index": None})
    return _with_slot(state, empty)


def ask_clarification(
    state: ConversationState,
    clarification_id: str,
    question: str,
    *,
    now: datetime,
    slot: str | None = None,
) -> ConversationState:
    """Queue a question for the user. Idempotent on ``clarification_id``.

    Raises:
        ValidationError: a blank question, an unknown slot, the same id with another
            question, or a full queue (:data:`MAX_CLARIFICATIONS`).
    """
    if not question.strip():
        raise ValidationError("a clarification needs a question")
    if slot is not None:
        _slot(state, slot)
    held = next((c for c in state.clarifications if c.clarification_id == clarification_id), None)
    if held is not None:
        if held.question == question and held.slot == slot:
            return state
        raise ValidationError(
            f"clarification {clarification_id!r} is already queued with another question "
            f"({held.question!r}); use a new id"
        )
    if len(state.clarifications) >= MAX_CLARIFICATIONS:
        raise ValidationError(
            f"{MAX_CLARIFICATIONS} clarifications are already queued; resolve some first"
        )
    try:
        asked = Clarification(
            clarification_id=clarification_id, question=question, slot=slot, asked_at=now
        )
    except ValueError as exc:
        raise ValidationError(f"bad clarification: {exc}") from exc
    return state.model_copy(update={"clarifications": (*state.clarifications, asked)})


def resolve_clarification(state: ConversationState, clarification_id: str) -> ConversationState:
    """Take a question off the queue (answered, or no longer relevant). A question that is
    not queued (resolved already) changes nothing."""
    queue = tuple(c for c in state.clarifications if c.clarification_id != clarification_id)
    return (
        state
        if queue == state.clarifications
        else state.model_copy(update={"clarifications": queue})
    )


def finish_intent(
    state: ConversationState, *, phase: str = DialoguePhase.FOLLOW_UP.value
) -> ConversationState:
    """The intent is served: drop it with its slots and questions; the agent stays."""
    done = state.model_copy(
        update={"intent": None, "slots": (), "clarifications": (), "phase": phase}
    )
    return state if done == state else done
