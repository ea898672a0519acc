"""Layer models: frozen, versioned, forward compatible (unknown fields kept, at any depth)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError as PydanticValidationError

from tiermem.state import conversation as conv
from tiermem.state import tasks as tsk
from tiermem.state.models import (
    SCHEMA_VERSION,
    ConversationState,
    EnvironmentState,
    Slot,
    TaskState,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("model", [ConversationState, TaskState, EnvironmentState])
def test_every_layer_is_written_with_its_schema_version(model: type) -> None:
    assert model().model_dump(mode="json")["schema_version"] == SCHEMA_VERSION


def test_layers_are_frozen() -> None:
    with pytest.raises(PydanticValidationError):
        ConversationState().phase = "farewell"  # type: ignore[misc]


def test_unknown_fields_of_a_newer_release_survive_moves_at_any_depth() -> None:
    stored = {
        "phase": "greeting",
        "sentiment": "calm",
        "slots": [{"name": "genre", "required": True, "source": "profile"}],
    }
    state = ConversationState.model_validate(stored)
    state = conv.infer_slot(state, "genre", "seinen")
    state = conv.set_phase(state, "slot_filling")
    dumped = state.model_dump(mode="json")
    assert dumped["sentiment"] == "calm"
    assert dumped["slots"][0]["source"] == "profile"

    tasks = TaskState.model_validate(
        {
            "tasks": [
                {
                    "task_id": "t",
                    "created_at": "2030-01-01T00:00:00Z",
                    "priority": "high",
                    "steps": [{"step_id": "a", "cost_hint": 3}],
                }
            ]
        }
    )
    tasks = tsk.start_step(tasks, "t", "a", worker="w", now=NOW)
    tasks = tsk.complete_step(tasks, "t", "a", 1, now=NOW)
    task = tasks.model_dump(mode="json")["tasks"][0]
    assert (task["priority"], task["steps"][0]["cost_hint"]) == ("high", 3)


def test_a_value_outside_the_known_enums_does_not_decode() -> None:
    with pytest.raises(PydanticValidationError):
        ConversationState.model_validate({"slots": [{"name": "g", "status": "guessed"}]})


def test_names_are_unique_within_a_layer() -> None:
    with pytest.raises(PydanticValidationError, match="names must be unique"):
        ConversationState(slots=(Slot(name="a"), Slot(name="a")))
