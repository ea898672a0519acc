"""Active entities ride in the turn's append (issue #8): what a user notices is that the
entity points at the turn that mentioned it and that both tiers agree, whoever wrote.

Run on every pairing of tests/integration (with the stores' ENTITIES_IN_APPEND capability
or without it: then the tiers fall back to a compare-and-set after the append).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.conftest import Pairing
from tiermem.session import TurnInput
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import Capability
from tiermem.testing import FakeClock


async def _durable_entities(pairing: Pairing, session_id: str) -> dict[str, object]:
    record = await pairing.durable.get_record(session_id, "entities")
    return {} if record is None else dict(record.data)


async def test_an_entity_points_at_its_turn_when_another_device_wrote_first(
    pairing: Pairing,
) -> None:
    memory = pairing.service()
    phone = await memory.session(user_id="u-ent-devices")
    laptop = await memory.session(phone.id, user_id="u-ent-devices")
    await phone.add_turn("user", "Hello!")
    for i in range(3):  # the phone's handle has not seen these
        await laptop.add_turn("user", f"laptop turn {i}")
    turn = await phone.add_turn("user", "Your order ORD-12345 ships tomorrow.")
    assert turn.index == 4
    for device in (phone, laptop):
        entities = await device.active_entities()
        assert entities["order_id"].value == "ORD-12345"
        assert entities["order_id"].turn_index == 4
    durable = await _durable_entities(pairing, phone.id)
    assert durable["order_id"]["turn_index"] == 4  # type: ignore[index]
    # A reload from the durable tier shows the same.
    await pairing.hot.delete(phone.id)
    assert (await phone.active_entities())["order_id"].turn_index == 4


async def test_concurrent_writers_leave_the_last_archived_value_in_both_tiers(
    pairing: Pairing,
) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-ent-race")
    handles = [await memory.session(session.id, user_id="u-ent-race") for _ in range(4)]

    async def writer(w: int, handle: object) -> None:
        for i in range(5):
            await handle.add_turn("user", f"order ORD-{w}{i}0000 please")  # type: ignore[attr-defined]

    await asyncio.gather(*(writer(w, h) for w, h in enumerate(handles)))
    turns = await session.get_turns()
    assert [t.index for t in turns] == list(range(20))
    last = turns[-1]
    expected = next(e.value for e in last.entities if e.kind == "order_id")
    hot = (await session.active_entities())["order_id"]
    assert (hot.value, hot.turn_index) == (expected, last.index)
    durable = await _durable_entities(pairing, session.id)
    assert durable["order_id"]["value"] == expected  # type: ignore[index]
    assert durable["order_id"]["turn_index"] == last.index  # type: ignore[index]


def _tool_result(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "text", "text": text}],
        }
    ]


async def test_a_tool_result_listing_several_values_does_not_pick_one(pairing: Pairing) -> None:
    """A search's output lists candidates; the last row is not what the user chose. The
    kind keeps its value (in both tiers, and after a reload); a kind the output names
    once still changes, and the user's own turn still switches with its last mention."""
    memory = pairing.service()
    session = await memory.session(user_id="u-ent-listed")
    await session.add_turn("user", "Is vol 42 in stock? My order is ORD-11111.")
    await session.add_turn("assistant", "Let me search.")
    listing = await session.add_turn(
        "user",
        _tool_result("Found: vol 3 (in stock), vol 5, vol 9 (sold out). Order ORD-22222."),
    )
    assert {e.value for e in listing.entities if e.kind == "volume"} == {"3", "5", "9"}
    entities = await session.active_entities()
    assert (entities["volume"].value, entities["volume"].turn_index) == ("42", 0)
    assert (entities["order_id"].value, entities["order_id"].turn_index) == ("ORD-22222", 2)
    durable = await _durable_entities(pairing, session.id)
    assert durable["volume"]["value"] == "42"  # type: ignore[index]
    await pairing.hot.delete(session.id)  # a reload from the durable tier agrees
    assert (await session.active_entities())["volume"].value == "42"
    await session.add_turn("user", "Not vol 3, give me vol 5.")
    assert (await session.active_entities())["volume"].value == "5"
    # In a batch the same holds turn by turn.
    await session.add_turns(
        [
            TurnInput(role="user", content="What about vol 7?"),
            TurnInput(role="user", content=_tool_result("vol 7 and vol 8 are both out.")),
        ]
    )
    entities = await session.active_entities()
    assert (entities["volume"].value, entities["volume"].turn_index) == ("7", 4)


async def test_an_explicit_change_of_subject_expires_the_product_entities(
    pairing: Pairing,
) -> None:
    """Seed 001: entities expire when "the user explicitly switches subject ("forget that,
    show me Naruto")". The product kinds go (in both tiers, and after a reload); the
    order id and the language stay; the switching turn's own entities are set."""
    memory = pairing.service()
    session = await memory.session(user_id="u-ent-switch")
    await session.add_turn("user", "Is vol 42 in stock for $12? Order ORD-11111, in Japanese.")
    before = await session.active_entities()
    assert {"volume", "money", "order_id", "language"} <= before.keys()
    await session.add_turn("user", "Hmm, forget that. Show me vol 3 instead.")
    after = await session.active_entities()
    assert (after["volume"].value, after["volume"].turn_index) == ("3", 1)
    assert "money" not in after
    assert after["order_id"] == before["order_id"]
    assert after["language"] == before["language"]
    durable = await _durable_entities(pairing, session.id)
    assert "money" not in durable
    assert durable["volume"]["value"] == "3"  # type: ignore[index]
    await pairing.hot.delete(session.id)
    assert await session.active_entities() == after
    # A switch naming nothing new clears the product kinds; the assistant cannot switch.
    await session.add_turn("assistant", "Never mind, vol 3 is sold out.")
    assert (await session.active_entities())["volume"].value == "3"
    await session.add_turns([TurnInput(role="user", content="Never mind.")])
    assert "volume" not in await session.active_entities()
    await session.add_turn("user", "忘れて。ORD-22222の状況は？")
    assert (await session.active_entities())["order_id"].value == "ORD-22222"


async def test_a_value_the_user_names_as_wrong_is_not_made_active(pairing: Pairing) -> None:
    """ "volume 5, not volume 4" makes volume 5 active, not the last one named; as
    structured memory reads a correction (not, instead of, rather than, じゃなくて)."""
    memory = pairing.service()
    session = await memory.session(user_id="u-ent-negated")
    cases = [
        ("I want volume 5, not volume 4.", "volume", "5"),
        ("English please, not Japanese.", "language", "english"),
        ("Send vol 8 instead of vol 7.", "volume", "8"),
        ("3巻じゃなくて4巻をください。", "volume", "4"),
        ("Not vol 9. Vol 9 is what I have; vol 10 is new.", "volume", "10"),
    ]
    for text, kind, value in cases:
        turn = await session.add_turn("user", text)
        active = (await session.active_entities())[kind]
        assert (active.value, active.turn_index) == (value, turn.index), text
    # Named both as wrong and as right in one turn: right.
    await session.add_turn("user", "Not vol 2? Yes, vol 2 then.")
    assert (await session.active_entities())["volume"].value == "2"
    # The assistant's "not" is not the user's correction; the durable tier agrees.
    await session.add_turn("assistant", "We have vol 6, not vol 11.")
    assert (await session.active_entities())["volume"].value == "11"
    durable = await _durable_entities(pairing, session.id)
    assert durable["volume"]["value"] == "11"  # type: ignore[index]


class _LegacyHot(MemoryHotStore):
    """A hot store of before ENTITIES_IN_APPEND (a third-party backend, say): its append
    takes no ``entities``."""

    capabilities = MemoryHotStore.capabilities - {Capability.ENTITIES_IN_APPEND}

    async def append_turns(self, session_id: str, turns: Any, **options: Any) -> Any:
        assert "entities" not in options, "entities passed to a store that cannot take them"
        return await super().append_turns(session_id, turns, **options)


class _LegacyDurable(MemoryDurableStore):
    """A durable store of before ENTITIES_IN_APPEND: entities go through the record CAS."""

    capabilities = MemoryDurableStore.capabilities - {Capability.ENTITIES_IN_APPEND}

    async def append_turns(self, session_id: str, turns: Any, **options: Any) -> Any:
        assert "entities" not in options, "entities passed to a store that cannot take them"
        return await super().append_turns(session_id, turns, **options)


async def test_stores_without_entities_in_append_get_the_change_apart() -> None:
    clock = FakeClock()
    legacy = Pairing("legacy", _LegacyHot(clock=clock), _LegacyDurable(clock=clock), clock)
    await test_an_entity_points_at_its_turn_when_another_device_wrote_first(legacy)
    await test_concurrent_writers_leave_the_last_archived_value_in_both_tiers(legacy)
