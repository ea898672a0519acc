"""Conversation-layer transitions: every move, legal and illegal, as a table; all pure."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.state import conversation as conv
from tiermem.state.models import (
    Clarification,
    ConversationState,
    DialoguePhase,
    Slot,
    SlotStatus,
)

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

GENRE = Slot(
    name="genre",
    required=True,
    prompt="Which genre do you like?",
    valid_values=("seinen", "shonen", "shojo"),
)
VOLUME = Slot(name="volume", prompt="Which volume?")


def _ordering() -> ConversationState:
    """An intent with one required slot (empty) and one optional slot."""
    return conv.set_intent(
        ConversationState(), "buy_manga", agent="ShopAgent", slots=[GENRE, VOLUME]
    )


def _inferred() -> ConversationState:
    return conv.infer_slot(_ordering(), "genre", "seinen", turn_index=4)


def _confirmed() -> ConversationState:
    return conv.confirm_slot(_ordering(), "genre", "seinen")


def _asked() -> ConversationState:
    return conv.ask_clarification(
        _ordering(), "q-genre", "Seinen or shonen?", now=NOW, slot="genre"
    )


Move = Callable[[ConversationState], ConversationState]


def _slot(state: ConversationState, name: str) -> Slot:
    slot = state.slot(name)
    assert slot is not None
    return slot


# (case, start, move, check on the result)
LEGAL: list[
    tuple[str, Callable[[], ConversationState], Move, Callable[[ConversationState], Any]]
] = [
    (
        "a new intent with a required slot starts in slot_filling",
        ConversationState,
        lambda s: conv.set_intent(s, "buy_manga", slots=[GENRE]),
        lambda s: (
            (s.phase, s.intent, [x.name for x in s.missing_slots])
            == ("slot_filling", "buy_manga", ["genre"])
        ),
    ),
    (
        "a new intent without required slots starts in intent_detection",
        ConversationState,
        lambda s: conv.set_intent(s, "browse", agent="SearchAgent", slots=[VOLUME]),
        lambda s: (s.phase, s.agent) == ("intent_detection", "SearchAgent"),
    ),
    (
        "another intent drops the old slots and questions",
        _asked,
        lambda s: conv.set_intent(s, "track_order"),
        lambda s: (
            (s.intent, s.slots, s.clarifications, s.agent) == ("track_order", (), (), "ShopAgent")
        ),
    ),
    (
        "the same intent keeps values and merges new slot definitions",
        _confirmed,
        lambda s: conv.set_intent(s, "buy_manga", slots=[Slot(name="format")]),
        lambda s: (
            (_slot(s, "genre").value, [x.name for x in s.slots])
            == ("seinen", ["genre", "volume", "format"])
        ),
    ),
    (
        "inferring fills an empty slot, with its turn",
        _ordering,
        lambda s: conv.infer_slot(s, "genre", "shonen", turn_index=7),
        lambda s: (
            (_slot(s, "genre").status, _slot(s, "genre").value, _slot(s, "genre").turn_index)
            == (SlotStatus.INFERRED, "shonen", 7)
        ),
    ),
    (
        "an inferred required slot is still missing (confirm it)",
        _inferred,
        lambda s: s,
        lambda s: [x.name for x in s.missing_slots] == ["genre"],
    ),
    (
        "confirming with no value confirms the inferred value and keeps its turn",
        _inferred,
        lambda s: conv.confirm_slot(s, "genre"),
        lambda s: (
            (_slot(s, "genre").status, _slot(s, "genre").value, _slot(s, "genre").turn_index)
            == (SlotStatus.CONFIRMED, "seinen", 4)
        ),
    ),
    (
        "the user may confirm another value than the one inferred",
        _inferred,
        lambda s: conv.confirm_slot(s, "genre", "shojo", turn_index=9),
        lambda s: (_slot(s, "genre").value, _slot(s, "genre").turn_index) == ("shojo", 9),
    ),
    (
        "the user may change a confirmed value",
        _confirmed,
        lambda s: conv.confirm_slot(s, "genre", "shonen"),
        lambda s: _slot(s, "genre").value == "shonen",
    ),
    (
        "confirming a slot resolves the questions about it",
        _asked,
        lambda s: conv.confirm_slot(s, "genre", "seinen"),
        lambda s: s.clarifications == () and s.missing_slots == (),
    ),
    (
        "a slot without valid values takes any value",
        _ordering,
        lambda s: conv.confirm_slot(s, "volume", 42),
        lambda s: _slot(s, "volume").value == 42,
    ),
    (
        "clearing empties a slot",
        _confirmed,
        lambda s: conv.clear_slot(s, "genre"),
        lambda s: (_slot(s, "genre").status, _slot(s, "genre").value) == (SlotStatus.EMPTY, None),
    ),
    (
        "questions queue in order",
        _asked,
        lambda s: conv.ask_clarification(s, "q-vol", "Which volume?", now=NOW),
        lambda s: [c.clarification_id for c in s.clarifications] == ["q-genre", "q-vol"],
    ),
    (
        "resolving takes a question off the queue",
        _asked,
        lambda s: conv.resolve_clarification(s, "q-genre"),
        lambda s: s.clarifications == (),
    ),
    (
        "redefining a slot keeps a value that stays valid",
        _confirmed,
        lambda s: conv.define_slot(s, GENRE.model_copy(update={"prompt": "Genre?"})),
        lambda s: (_slot(s, "genre").value, _slot(s, "genre").prompt) == ("seinen", "Genre?"),
    ),
    (
        "redefining a slot empties a value that is no longer valid",
        _confirmed,
        lambda s: conv.define_slot(s, GENRE.model_copy(update={"valid_values": ("shojo",)})),
        lambda s: _slot(s, "genre").status is SlotStatus.EMPTY,
    ),
    (
        "a new slot may come with an inferred value",
        _ordering,
        lambda s: conv.define_slot(
            s, Slot(name="format", status=SlotStatus.INFERRED, value="paperback")
        ),
        lambda s: _slot(s, "format").value == "paperback",
    ),
    (
        "the phase is the caller's, any string",
        _ordering,
        lambda s: conv.set_phase(s, "negotiating_price"),
        lambda s: s.phase == "negotiating_price",
    ),
    (
        "a handoff changes the agent only",
        _confirmed,
        lambda s: conv.set_agent(s, "HumanAgent"),
        lambda s: (s.agent, _slot(s, "genre").value) == ("HumanAgent", "seinen"),
    ),
    (
        "finishing an intent drops it, its slots and questions, and keeps the agent",
        _asked,
        conv.finish_intent,
        lambda s: (
            (s.intent, s.slots, s.clarifications, s.phase, s.agent)
            == (None, (), (), DialoguePhase.FOLLOW_UP, "ShopAgent")
        ),
    ),
]


@pytest.mark.parametrize(
    ("start", "move", "check"), [c[1:] for c in LEGAL], ids=[c[0] for c in LEGAL]
)
def test_legal_moves(
    start: Callable[[], ConversationState], move: Move, check: Callable[[ConversationState], Any]
) -> None:
    before = start()
    after = move(before)
    assert check(after)
    # Values never change in place.
    assert before == start()


# (case, start, move, what the error must say)
ILLEGAL: list[tuple[str, Callable[[], ConversationState], Move, str]] = [
    (
        "inferring an unknown slot",
        _ordering,
        lambda s: conv.infer_slot(s, "author", "x"),
        "define it first",
    ),
    (
        "inferring a value outside the valid values",
        _ordering,
        lambda s: conv.infer_slot(s, "genre", "horror"),
        "not a valid value",
    ),
    (
        "confirming a value outside the valid values",
        _inferred,
        lambda s: conv.confirm_slot(s, "genre", "horror"),
        "use one of 'seinen', 'shonen', 'shojo'",
    ),
    (
        "confirming an empty slot without a value",
        _ordering,
        lambda s: conv.confirm_slot(s, "genre"),
        "no inferred value to confirm",
    ),
    (
        "an inference overriding what the user confirmed",
        _confirmed,
        lambda s: conv.infer_slot(s, "genre", "shonen"),
        "does not override the user",
    ),
    (
        "clearing an unknown slot",
        _ordering,
        lambda s: conv.clear_slot(s, "author"),
        "no slot named",
    ),
    (
        "the same question id with another question",
        _asked,
        lambda s: conv.ask_clarification(s, "q-genre", "Something else?", now=NOW),
        "use a new id",
    ),
    (
        "a question about an unknown slot",
        _ordering,
        lambda s: conv.ask_clarification(s, "q", "Who?", now=NOW, slot="author"),
        "no slot named",
    ),
    (
        "a blank question",
        _ordering,
        lambda s: conv.ask_clarification(s, "q", "  ", now=NOW),
        "needs a question",
    ),
    ("a blank phase", _ordering, lambda s: conv.set_phase(s, " "), "must not be blank"),
    ("a blank intent", _ordering, lambda s: conv.set_intent(s, ""), "must not be blank"),
    (
        "two slots of one name",
        ConversationState,
        lambda s: conv.set_intent(s, "x", slots=[VOLUME, VOLUME]),
        "must be unique",
    ),
    (
        "a new slot that claims a status without a value",
        _ordering,
        lambda s: conv.define_slot(s, Slot(name="format", status=SlotStatus.CONFIRMED)),
        "a filled one has one",
    ),
    (
        "a new slot with an invalid value",
        _ordering,
        lambda s: conv.define_slot(
            s,
            Slot(name="f", valid_values=("a",), status=SlotStatus.INFERRED, value="b"),
        ),
        "not a valid value",
    ),
]


@pytest.mark.parametrize(
    ("start", "move", "message"), [c[1:] for c in ILLEGAL], ids=[c[0] for c in ILLEGAL]
)
def test_illegal_moves_are_refused_with_a_clear_error(
    start: Callable[[], ConversationState], move: Move, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        move(start())


# Moves a retry may repeat: the second call returns the state it was given.
REPEATABLE: list[tuple[str, Callable[[], ConversationState], Move]] = [
    ("set_intent", _confirmed, lambda s: conv.set_intent(s, "buy_manga", agent="ShopAgent")),
    ("infer_slot", _inferred, lambda s: conv.infer_slot(s, "genre", "seinen", turn_index=4)),
    ("infer the confirmed value", _confirmed, lambda s: conv.infer_slot(s, "genre", "seinen")),
    ("confirm_slot", _confirmed, lambda s: conv.confirm_slot(s, "genre", "seinen")),
    ("clear_slot", _ordering, lambda s: conv.clear_slot(s, "genre")),
    (
        "ask_clarification",
        _asked,
        lambda s: conv.ask_clarification(s, "q-genre", "Seinen or shonen?", now=NOW, slot="genre"),
    ),
    ("resolve a resolved question", _ordering, lambda s: conv.resolve_clarification(s, "gone")),
    ("set_phase", _ordering, lambda s: conv.set_phase(s, "slot_filling")),
    ("define the same slot", _ordering, lambda s: conv.define_slot(s, GENRE)),
]


@pytest.mark.parametrize(
    ("start", "move"), [c[1:] for c in REPEATABLE], ids=[c[0] for c in REPEATABLE]
)
def test_repeated_moves_change_nothing(start: Callable[[], ConversationState], move: Move) -> None:
    state = start()
    assert move(state) == state


def test_the_clarification_queue_is_bounded() -> None:
    state = _ordering()
    for n in range(conv.MAX_CLARIFICATIONS):
        state = conv.ask_clarification(state, f"q{n}", f"Question {n}?", now=NOW)
    with pytest.raises(ValidationError, match="resolve some first"):
        conv.ask_clarification(state, "one-more", "Another?", now=NOW)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["infer", "confirm", "clear"]),
            st.sampled_from(["genre", "volume"]),
            st.sampled_from(["seinen", "shonen", "horror", 3]),
        ),
        max_size=30,
    )
)
def test_any_sequence_of_slot_moves_keeps_the_slot_invariants(
    moves: list[tuple[str, str, str | int]],
) -> None:
    state = _ordering()
    for kind, name, value in moves:
        try:
            if kind == "infer":
                state = conv.infer_slot(state, name, value)
            elif kind == "confirm":
                state = conv.confirm_slot(state, name, value)
            else:
                state = conv.clear_slot(state, name)
        except ValidationError:
            continue
        for slot in state.slots:
            assert (slot.status is SlotStatus.EMPTY) == (slot.value is None)
            assert slot.value is None or slot.accepts(slot.value)
        # Stored as JSON and read back, the state is the same value.
        assert ConversationState.model_validate_json(state.model_dump_json()) == state


def test_a_clarification_records_when_it_was_asked() -> None:
    asked = _asked().clarifications[0]
    assert asked == Clarification(
        clarification_id="q-genre", question="Seinen or shonen?", slot="genre", asked_at=NOW
    )
