"""Eviction gives back the room it did not need (session 14).

Groups are evicted lowest importance first until the rest fits; the last one evicted can
free far more than was needed. Before, the small turns evicted before it stayed out: in
the reviewer's probe (p7, budget 500) a 413-token tool pair had to go, but three short
turns went with it, among them the assistant's answer, and 268 tokens were left unused.
"""

from __future__ import annotations

from tiermem.context.eviction import PlannedMessage, plan_eviction
from tiermem.models import TextBlock
from tiermem.tokens import TiktokenCounter


def _message(role: str, tokens: int, importance: float, index: int) -> PlannedMessage:
    return PlannedMessage(
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(text="x"),),
        turn_index=index,
        tokens=tokens,
        importance=importance,
    )


def test_small_groups_evicted_before_a_large_one_come_back() -> None:
    messages = [
        _message("user", 10, 0.5, 0),  # first user turn: required
        _message("assistant", 8, 0.2, 1),  # low importance, small: evicted first
        _message("user", 6, 0.2, 2),
        _message("assistant", 400, 0.4, 3),  # large: must go
        _message("user", 9, 0.6, 4),
        _message("assistant", 12, 0.5, 5),  # latest: required
    ]
    plan = plan_eviction(messages, optional_room=60, required_room=1000, counter=TiktokenCounter())
    assert plan.evicted == (3,)
    assert plan.kept == (0, 1, 2, 4, 5)
    assert plan.total_tokens <= 60


def test_the_refill_never_exceeds_the_room_and_prefers_importance() -> None:
    messages = [
        _message("user", 5, 0.5, 0),
        _message("assistant", 30, 0.1, 1),
        _message("user", 30, 0.3, 2),
        _message("assistant", 30, 0.2, 3),
        _message("user", 5, 0.5, 4),
    ]
    # Room for the two required turns and one 30-token turn: the most important returns.
    plan = plan_eviction(messages, optional_room=45, required_room=1000, counter=TiktokenCounter())
    assert plan.kept == (0, 2, 4)
    assert plan.total_tokens <= 45
