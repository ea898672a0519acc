"""to_agent_context rendering: actionable sentences, never JSON, within the token budget,
least actionable lines dropped first, with provenance; pure."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.state import conversation as conv
from tiermem.state import tasks as tsk
from tiermem.state.environment import refresh_environment
from tiermem.state.models import (
    Cart,
    CartItem,
    ConversationState,
    EnvironmentState,
    Promotion,
    Slot,
    Step,
    TaskState,
)
from tiermem.state.render import HEADER, AgentContext, StateSource, describe, render_agent_context
from tiermem.tokens import TiktokenCounter

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=1.2)
TOKENS = TiktokenCounter()
SOURCES = {
    "conversation": StateSource(layer="conversation", version=4, updated_at=T0),
    "task": StateSource(layer="task", version=9, updated_at=T0),
    "environment": StateSource(layer="environment", version=2, updated_at=T0),
}


def conversation() -> ConversationState:
    state = conv.set_intent(
        ConversationState(),
        "track_order",
        agent="OrderAgent",
        slots=[
            Slot(name="order_id", required=True, prompt="What is your order number?"),
            Slot(name="carrier", required=True, valid_values=("yamato", "sagawa")),
            Slot(name="gift", valid_values=(True, False)),
        ],
    )
    state = conv.infer_slot(state, "carrier", "yamato", turn_index=2)
    state = conv.confirm_slot(state, "gift", True)
    return conv.ask_clarification(state, "q1", "Is this the order from last week?", now=T0)


def tasks() -> TaskState:
    plan = [
        Step(step_id="find", tool="orders.get"),
        Step(step_id="track", tool="shipping.track", description="where is the parcel"),
        Step(step_id="eta", tool="shipping.eta"),
        Step(step_id="reply"),
    ]
    state = tsk.create_task(
        TaskState(), "lookup", plan, now=T0, goal="track the parcel", budget=timedelta(seconds=3)
    )
    state = tsk.start_step(state, "lookup", "find", worker="w", now=T0)
    state = tsk.complete_step(
        state, "lookup", "find", {"order": "ORD-1", "items": ["Berserk 42"]}, now=T0
    )
    state = tsk.start_step(state, "lookup", "track", worker="w", now=T0)
    state = tsk.fail_step(state, "lookup", "track", "carrier API timed out", now=T0)
    state = tsk.start_step(state, "lookup", "track", worker="w", now=T0)
    failed = tsk.create_task(state, "refund", [Step(step_id="pay", tool="payments.refund")], now=T0)
    failed = tsk.start_step(failed, "refund", "pay", worker="w", now=T0)
    return tsk.fail_step(failed, "refund", "pay", "card expired", now=T0, retry=False)


def environment() -> EnvironmentState:
    return refresh_environment(
        EnvironmentState(tier="premium", locale="ja-JP"),
        "shop",
        {
            "cart": Cart(
                items=(
                    CartItem(sku="b42", title="Berserk 42", quantity=2, unit_price=Decimal("1650")),
                ),
                currency="JPY",
            ),
            "promotions": [
                Promotion(
                    promotion_id="p1",
                    title="Seinen week",
                    detail="10% off seinen",
                    ends_at=T0 + timedelta(days=3),
                ),
                Promotion(promotion_id="p0", title="Expired sale", ends_at=T0 - timedelta(days=1)),
            ],
            "profile": {"name": "Aki", "likes": ["seinen", "horror"]},
        },
        now=T0,
    )


def render(budget: int = 10_000, **layers: object) -> AgentContext:
    return render_agent_context(
        layers.get("conversation", conversation()),  # type: ignore[arg-type]
        layers.get("tasks", tasks()),  # type: ignore[arg-type]
        layers.get("environment", environment()),  # type: ignore[arg-type]
        now=NOW,
        budget_tokens=budget,
        tokens=TOKENS,
        session_id="s-1",
        sources=SOURCES,
    )


def test_the_full_context_reads_as_sentences() -> None:
    assert render().text == "\n".join(
        [
            HEADER,
            "- Intent: track_order, handled by OrderAgent (phase: slot_filling).",
            '- Ask the user for order_id: "What is your order number?"',
            "- Confirm with the user: carrier is probably yamato (one of: yamato, sagawa).",
            "- Pending question: Is this the order from last week?",
            "- Known: gift yes.",
            "- Task lookup (track the parcel): 1 of 4 steps done; running track (shipping.track): "
            "where is the parcel, attempt 2; then eta (shipping.eta), reply.",
            "- Step track (shipping.track) failed (carrier API timed out); retrying, 1 retry left.",
            "- Time left for lookup: 1.8 s of 3.0 s.",
            "- Done in lookup: find (orders.get) → order: ORD-1; items: Berserk 42.",
            "- Task refund failed at pay (payments.refund) (card expired) with no retries left. "
            "Tell the user, or try another way.",
            "- User: premium tier, locale ja-JP, local time Tue 21:00 (evening, Asia/Tokyo).",
            "- Cart: 2 items (Berserk 42 ×2), total 3300 JPY.",
            "- Profile: name: Aki; likes: seinen, horror.",
            "- Active promotions: Seinen week (10% off seinen), until 2030-01-04.",
        ]
    )


def test_it_never_contains_raw_json() -> None:
    text = render().text
    assert "{" not in text
    assert "}" not in text
    assert '":' not in text
    for line in text.splitlines():
        with pytest.raises(json.JSONDecodeError):
            json.loads(line.removeprefix("- "))


def test_the_count_and_provenance_are_those_of_the_text() -> None:
    context = render()
    assert context.tokens == TOKENS.count(context.text)
    assert context.sources == tuple(SOURCES.values())
    assert (context.session_id, context.omitted) == ("s-1", 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 400))
def test_any_budget_is_respected_and_lines_go_least_actionable_first(budget: int) -> None:
    full = render().text.splitlines()
    context = render(budget)
    assert context.tokens <= budget
    assert context.tokens == (TOKENS.count(context.text) if context.text else 0)
    kept = context.text.splitlines()
    # What is kept at a budget is kept at every larger budget too (a stable order).
    bigger = render(budget + 40).text.splitlines()
    assert set(kept) <= set(bigger)
    assert context.omitted == (len(full) - len(kept) if kept else len(full) - 1)


def test_a_tight_budget_keeps_what_the_agent_must_act_on() -> None:
    full = render().tokens
    context = render(full // 3)
    text = context.text
    assert "Task refund failed" in text
    assert "Ask the user for order_id" in text
    assert "Confirm with the user: carrier" in text
    assert "Active promotions" not in text
    assert "Profile" not in text
    # Only layers with a line left are cited.
    assert [s.layer for s in context.sources] == ["conversation", "task"]


def test_nothing_fits_a_zero_budget() -> None:
    context = render(0)
    assert (context.text, context.tokens, context.sources) == ("", 0, ())


def test_an_empty_session_says_little() -> None:
    context = render(
        conversation=ConversationState(), tasks=TaskState(), environment=EnvironmentState()
    )
    assert context.text == "\n".join(
        [
            HEADER,
            "- No intent detected yet (phase: greeting).",
            "- User: standard tier, locale en-US, time zone unknown (UTC Tue 12:00).",
        ]
    )


def test_an_exhausted_budget_is_said_plainly() -> None:
    later = render_agent_context(
        conversation(),
        tsk.create_task(TaskState(), "t", [Step(step_id="a")], now=T0, budget=timedelta(seconds=1)),
        environment(),
        now=T0 + timedelta(seconds=2),
        budget_tokens=1000,
        tokens=TOKENS,
        session_id="s",
        sources=SOURCES,
    )
    assert "- t has used its 1.0 s time budget: answer with what is done." in later.text


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValidationError, match="0 or more"):
        render(-1)


WORDS = st.text(st.characters(categories=["L", "N", "Zs"]), max_size=20)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | WORDS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(WORDS, children, max_size=4),
    max_leaves=12,
)


@given(JSONISH)
def test_describe_turns_any_json_value_into_words(value: object) -> None:
    text = describe(value)
    assert len(text) <= 80
    # Strings here hold no brackets: any bracket would be JSON syntax leaking through.
    assert "{" not in text
    assert "[" not in text
