"""The memory durable store copies a record's data without parsing the JSON it wrote: the
stored data must be exactly what the JSON round trip gave (the reference), and must not
alias anything the caller passed."""

from __future__ import annotations

import asyncio
import enum
import json
import random
from typing import Any

from tiermem.clock import FakeClock
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.codec import encode_data


class _Level(enum.IntEnum):
    LOW = 1


class _Name(str):
    pass


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(12 if depth < 4 else 7)
    if pick == 0:
        return rng.choice(["", "a", "日本語", 'quote " and \\ back', "line\nbreak", "x" * 300])
    if pick == 1:
        return rng.randrange(-(10**20), 10**20)
    if pick == 2:
        return rng.choice([0.1, -0.0, 1e300, 2.5, 1 / 3])
    if pick == 3:
        return rng.choice([True, False, None])
    if pick == 4:
        return _Level.LOW  # an int subclass: the round trip makes it an int
    if pick == 5:
        return _Name("named")  # a str subclass
    if pick == 6:
        return rng.randrange(100)
    if pick in (7, 8):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if pick == 9:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    keys: list[Any] = [f"k{i}" for i in range(rng.randrange(5))]
    if rng.random() < 0.1:
        keys.append(rng.choice([1, 2.5, True, None]))  # JSON writes it as a string
    return {k: _value(rng, depth + 1) for k in keys}


def _shape(value: Any) -> Any:
    """The value with every type spelled out (== alone says 1 == 1.0 == True)."""
    if isinstance(value, dict):
        return ("dict", [(type(k).__name__, k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_shape(v) for v in value])
    return (type(value).__name__, repr(value))


def _containers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(c for v in value.values() for c in _containers(v))]
    if isinstance(value, list | tuple):
        return [value, *(c for v in value for c in _containers(v))]
    return []


def test_stored_data_is_the_json_round_trip_and_aliases_nothing() -> None:
    async def run() -> None:
        store = MemoryDurableStore(clock=FakeClock())
        rng = random.Random(1234)
        for case in range(400):
            data = {f"m{i}": _value(rng, 0) for i in range(rng.randrange(1, 5))}
            reference = json.loads(encode_data(data, what="record"))
            written = await store.put_record("s1", f"kind{case % 7}", data)
            stored = await store.get_record("s1", f"kind{case % 7}")
            assert stored is not None
            assert stored.data is written.data
            assert _shape(stored.data) == _shape(reference)
            held = {id(c) for c in _containers(stored.data)}
            assert not held & {id(c) for c in _containers(data)}

    asyncio.run(run())


def test_changing_what_was_passed_does_not_change_the_record() -> None:
    async def run() -> None:
        store = MemoryDurableStore(clock=FakeClock())
        data: dict[str, Any] = {"tiers": [{"text": "a", "tags": ["x"]}], "n": 1}
        await store.put_record("s1", "summary", data)
        data["tiers"][0]["tags"].append("y")
        data["tiers"][0]["text"] = "changed"
        data["tiers"].append({})
        data["n"] = 2
        stored = await store.get_record("s1", "summary")
        assert stored is not None
        assert stored.data == {"tiers": [{"text": "a", "tags": ["x"]}], "n": 1}

    asyncio.run(run())


def test_deep_nesting_still_stores_what_json_gives() -> None:
    async def run() -> None:
        store = MemoryDurableStore(clock=FakeClock())
        deep: Any = "leaf"
        for _ in range(600):
            deep = [deep]
        data = {"deep": deep}
        try:
            reference = json.loads(encode_data(data, what="record"))
        except RecursionError:
            return  # the encoder itself refuses this depth here: nothing to compare
        await store.put_record("s1", "deep", data)
        stored = await store.get_record("s1", "deep")
        assert stored is not None
        assert stored.data == reference

    asyncio.run(run())
