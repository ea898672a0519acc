"""The in-memory durable store sizes the ``entities`` record incrementally (only the
upserted entities are serialized on an append); these check that it still enforces
:data:`MAX_RECORD_BYTES` and the UTF-8 rule with exactly the errors :func:`encode_data`
raises for the whole record, including after ``put_record`` replaced the record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiermem.errors import ValidationError
from tiermem.models import ActiveEntity, TextBlock
from tiermem.models.turns import NewTurn
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.codec import encode_data
from tiermem.store.contract import ENTITIES_RECORD, MAX_RECORD_BYTES, EntityChange

T0 = datetime(2030, 1, 1, tzinfo=UTC)
WHAT = f"record {ENTITIES_RECORD!r}"


def _turn(text: str = "hi") -> NewTurn:
    return NewTurn(role="user", content=[TextBlock(text=text)], timestamp=T0)


def _entity(kind: str, value: str) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=0, updated_at=T0)


def _expected_error(data: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as caught:
        encode_data(data, what=WHAT)
    return str(caught.value)


async def _append(store: MemoryDurableStore, **upsert: ActiveEntity) -> None:
    await store.append_turns("s1", [_turn()], entities=EntityChange(upsert=upsert))


async def test_growing_past_the_limit_raises_the_whole_records_error() -> None:
    store = MemoryDurableStore()
    chunk = "é" * (MAX_RECORD_BYTES // 8)  # 2 bytes a character: a quarter of the limit
    for i in range(3):
        await _append(store, **{f"k{i}": _entity(f"k{i}", chunk)})
    before = await store.get_record("s1", ENTITIES_RECORD)
    assert before is not None
    assert before.version == 3
    last = _entity("k3", chunk)
    with pytest.raises(ValidationError) as caught:
        await _append(store, k3=last)
    expected = {**before.data, "k3": last.model_dump(mode="json")}
    assert str(caught.value) == _expected_error(expected)
    # Nothing was written: no turn, no record version.
    assert await store.next_index("s1") == 3
    after = await store.get_record("s1", ENTITIES_RECORD)
    assert after is not None
    assert after.version == 3
    # Replacing a member by a smaller one is measured by its new size, not the old one.
    await _append(store, k0=_entity("k0", "small"), k3=last)
    got = await store.get_record("s1", ENTITIES_RECORD)
    assert got is not None
    assert sorted(got.data) == ["k0", "k1", "k2", "k3"]


async def test_a_record_replaced_by_put_record_is_measured_again() -> None:
    store = MemoryDurableStore()
    await _append(store, series=_entity("series", "Berserk"))
    got = await store.get_record("s1", ENTITIES_RECORD)
    assert got is not None
    # put_record fills the record close to the limit behind the append's back.
    filler = "x" * (MAX_RECORD_BYTES - 200)
    await store.put_record("s1", ENTITIES_RECORD, {**got.data, "pad": filler})
    big = _entity("volume", "y" * 100)
    with pytest.raises(ValidationError) as caught:
        await _append(store, volume=big)
    current = await store.get_record("s1", ENTITIES_RECORD)
    assert current is not None
    assert str(caught.value) == _expected_error(
        {**current.data, "volume": big.model_dump(mode="json")}
    )
    # Removing the filler in the same change makes room again.
    await store.append_turns(
        "s1", [_turn()], entities=EntityChange(upsert={"volume": big}, remove=("pad",))
    )
    final = await store.get_record("s1", ENTITIES_RECORD)
    assert final is not None
    assert sorted(final.data) == ["series", "volume"]


async def test_text_that_is_not_utf8_raises_the_whole_records_error() -> None:
    store = MemoryDurableStore()
    await _append(store, series=_entity("series", "Berserk"))
    got = await store.get_record("s1", ENTITIES_RECORD)
    assert got is not None
    bad = _entity("title", "lone \ud800 surrogate")
    with pytest.raises(ValidationError) as caught:
        await _append(store, title=bad)
    expected = {**got.data, "title": bad.model_dump(mode="json")}
    assert str(caught.value) == _expected_error(expected)
    assert "UTF-8" in str(caught.value)
    assert await store.next_index("s1") == 1
