"""The entity intern tables (issue #8): repeated strings share one frozen instance, equal
to a validated one, and a run of unique entities never grows a table past its bound."""

from __future__ import annotations

from tiermem.extraction import entities as entities_module
from tiermem.extraction.entities import _ENTITY_CACHE, _entities, _entity
from tiermem.models import Entity


def test_repeated_strings_share_an_instance_equal_to_a_validated_one() -> None:
    first = _entity("series", "Berserk")
    assert _entity("series", "Berserk") is first
    assert first == Entity(kind="series", value="Berserk")
    pairs = (("series", "Berserk"), ("volume", "42"))
    assert _entities(pairs) is _entities(pairs)
    assert _entities(pairs) == (first, Entity(kind="volume", value="42"))


def test_unique_entities_never_grow_the_tables_past_their_bound() -> None:
    for i in range(3 * _ENTITY_CACHE):
        value = f"ORD-{i:07d}"
        assert _entities((("order", value),)) == (Entity(kind="order", value=value),)
        assert len(entities_module._ENTITIES) <= _ENTITY_CACHE
        assert len(entities_module._ENTITY_TUPLES) <= _ENTITY_CACHE
    assert _entity("order", "ORD-0000000") == Entity(kind="order", value="ORD-0000000")
