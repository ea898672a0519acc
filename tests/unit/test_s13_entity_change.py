"""``Session._entity_change`` builds one ActiveEntity per changed kind (session 13): a
catalogue tool output names a kind dozens of times, and the old code built an entity for
every change only to keep the last. Its result must be the old one's, key order included,
on random batches of turns whose entities repeat, alternate and return to the held value.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from tiermem.models.session import ActiveEntity
from tiermem.session import Session
from tiermem.store.contract import EntityChange

NOW = datetime(2026, 11, 23, 20, 0, tzinfo=UTC)
KINDS = ("series", "isbn", "price", "volume")
VALUES = ("A", "B", "C")


def reference_entity_change(self: Any, turns: Sequence[Any], first: int) -> EntityChange | None:
    """The code before session 13, as it was."""
    held = self._view.entities
    changed: dict[str, ActiveEntity] = {}
    now: datetime | None = None
    for position, turn in enumerate(turns):
        for entity in turn.entities:
            current = changed.get(entity.kind) or held.get(entity.kind)
            if current is None or current.value != entity.value:
                now = now or self._service.clock.now()
                changed[entity.kind] = ActiveEntity.trusted(
                    {
                        "kind": entity.kind,
                        "value": entity.value,
                        "turn_index": first + position,
                        "updated_at": now,
                    }
                )
    return EntityChange.trusted({"upsert": changed, "remove": ()}) if changed else None


class Clock:
    def __init__(self) -> None:
        self.reads = 0

    def now(self) -> datetime:
        self.reads += 1
        return NOW


def handle(held: dict[str, ActiveEntity]) -> tuple[Any, Clock]:
    clock = Clock()
    return SimpleNamespace(
        _view=SimpleNamespace(entities=held), _service=SimpleNamespace(clock=clock)
    ), clock


def random_case(rng: random.Random) -> tuple[dict[str, ActiveEntity], list[Any], int]:
    held = {
        kind: ActiveEntity(kind=kind, value=rng.choice(VALUES), turn_index=0, updated_at=NOW)
        for kind in rng.sample(KINDS, rng.randint(0, len(KINDS)))
    }
    turns = [
        SimpleNamespace(
            role="assistant",  # no switch or negation to read (session 14)
            content=(),  # no tool result: a kind named twice still changes (session 14)
            entities=[
                SimpleNamespace(kind=rng.choice(KINDS), value=rng.choice(VALUES))
                for _ in range(rng.choice((0, 0, 1, 2, 5, 40)))
            ],
        )
        for _ in range(rng.randint(1, 4))
    ]
    return held, turns, rng.randint(1, 50)


def dumped(change: EntityChange | None) -> Any:
    if change is None:
        return None
    return [(k, v.model_dump()) for k, v in change.upsert.items()], change.remove


@pytest.mark.parametrize("seed", range(4))
def test_entity_change_is_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    changes = 0
    for _ in range(1_500):
        held, turns, first = random_case(rng)
        old_self, old_clock = handle(held)
        new_self, new_clock = handle(held)
        expected = reference_entity_change(old_self, turns, first)
        got = Session._entity_change(new_self, turns, first)
        assert dumped(got) == dumped(expected)
        assert new_clock.reads == old_clock.reads  # one clock reading per change, or none
        changes += expected is not None
    assert changes > 300  # the cases exercise changes, not only "nothing changed"


def test_a_value_that_returns_to_the_held_one_is_still_a_change() -> None:
    """A then B then A in one turn, A held: the old code recorded the kind as changed (a
    new turn index and time for A); so does the new one."""
    held = {"series": ActiveEntity(kind="series", value="A", turn_index=0, updated_at=NOW)}
    turn = SimpleNamespace(
        role="assistant",
        content=(),
        entities=[SimpleNamespace(kind="series", value=v) for v in ("A", "B", "A")],
    )
    self, _ = handle(held)
    change = Session._entity_change(self, [turn], 7)
    assert change is not None
    assert change.upsert["series"].value == "A"
    assert change.upsert["series"].turn_index == 7
