"""``turn_templates`` (the Redis appends' fast path) against ``turn_template``, the function
it replaces: the same strings for every turn, the same errors for turns that cannot be
stored. Randomised over the fields a turn can carry; no server needed (the templates are
the bytes the append scripts store, so equal templates mean equal stored turns)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.models import NewTurn, Turn
from tiermem.models.content import ImageBlock, TextBlock
from tiermem.models.turns import Entity
from tiermem.store.backends.redis_append import turn_templates
from tiermem.store.backends.redis_scripts import turn_template
from tiermem.store.contract import MAX_TURN_BYTES

_TEXTS = ["hi", "", "naïve café ☕ — 日本語", 'quote " back\\slash \n tab\t', "x" * 3000]


def _random_turn(rng: random.Random) -> NewTurn:
    blocks: list[Any] = [TextBlock(text=rng.choice(_TEXTS))]
    if rng.random() < 0.3:
        blocks.append({"type": "json", "json": {"a": [1, 2.5, None, "ü"], "b": {}}})
    if rng.random() < 0.2:
        blocks.append(ImageBlock(format="png", data=b"\x89PNG\x00\xff"))
    values: dict[str, Any] = {
        "role": rng.choice(["user", "assistant"]),
        "content": tuple(blocks),
        "timestamp": datetime(2026, 1, 1, tzinfo=UTC)
        + timedelta(microseconds=rng.randrange(10**13)),
    }
    optional: dict[str, Any] = {
        "token_count": rng.randrange(5000),
        "importance": rng.random(),
        "pinned": True,
        "agent_name": "agent-7",
        "intent": "ask",
        "latency_ms": rng.random() * 900,
        "entities": (Entity(kind="series", value="Berserk"),),
        "redacted": True,
        "metadata": {"k": rng.choice([1, "v", [True, None], {"n": 1.5}])},
    }
    for name, value in optional.items():
        if rng.random() < 0.5:
            values[name] = value
    return NewTurn(**values)


def test_templates_equal_turn_template_randomised() -> None:
    rng = random.Random(8)
    turns = [_random_turn(rng) for _ in range(400)]
    assert turn_templates(turns) == [turn_template(t) for t in turns]


def test_turns_off_the_fast_path_equal_turn_template() -> None:
    now = datetime.now(UTC)
    indexed = Turn(role="user", content=(TextBlock(text="a"),), timestamp=now, index=7)
    other_version = NewTurn(
        role="user", content=(TextBlock(text="a"),), timestamp=now, schema_version=2
    )
    turns = [indexed, other_version]
    assert turn_templates(turns) == [turn_template(t) for t in turns]


def _error(turn: NewTurn, function: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        function(turn)
    return str(caught.value)


@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_size_limit_is_the_same(slack: int) -> None:
    """A turn exactly at the limit (the indexed turn's JSON, as ``turn_template`` counts
    it) is accepted by both; one byte over is refused by both with the same message."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    base = NewTurn(role="user", content=(TextBlock(text=""),), timestamp=now)
    overhead = len(turn_template(base).encode()) + len(',"index":0}')
    turn = NewTurn(
        role="user",
        content=(TextBlock(text="y" * (MAX_TURN_BYTES - overhead + slack)),),
        timestamp=now,
    )
    if slack > 0:
        assert _error(turn, lambda t: turn_templates([t])) == _error(turn, turn_template)
    else:
        assert turn_templates([turn]) == [turn_template(turn)]


def test_unserializable_turn_raises_the_same_error() -> None:
    turn = NewTurn(
        role="user", content=(TextBlock(text="lone \ud800 surrogate"),), timestamp=datetime.now(UTC)
    )
    assert _error(turn, lambda t: turn_templates([t])) == _error(turn, turn_template)
