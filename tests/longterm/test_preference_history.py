"""Preference history is stored apart from the current preferences, on every durable
backend: reading the preferences never reads a key's history, while every way users see
history (list, preference_history, get, forget, forget_session, stats, purge) is as
before, also for history written before it had its own type."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

from tests.longterm.conftest import LongTerm, make_longterm
from tiermem.longterm.records import (
    PREFERENCE_HISTORY_TYPE,
    preference_history_id,
    preference_slot_id,
)
from tiermem.longterm.types import DEFAULT_MEMORY_TYPES, MemoryType, MemoryTypeRegistry
from tiermem.models import Provenance
from tiermem.store.contract import DurableStore
from tiermem.testing import BackendUnderTest

CHANGES = 300
GENRES = ("seinen", "shonen")


def in_session(session_id: str, *turns: int) -> Provenance:
    return Provenance(source="auto", session_id=session_id, turn_indexes=turns)


class ReadCountingStore:
    """A durable store that counts the records ``query_memories`` returned."""

    def __init__(self, inner: DurableStore) -> None:
        self.inner = inner
        self.queried: Counter[str] = Counter()

    async def query_memories(self, user_id: str, **kwargs: Any) -> Any:
        records = await self.inner.query_memories(user_id, **kwargs)
        for record in records:
            self.queried[record.memory_type] += 1
        return records

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def change_often(lt: LongTerm, times: int) -> str:
    """Set favorite_genre ``times`` times, alternating values; returns the slot id."""
    for i in range(times):
        await lt.memory.upsert_preference(lt.user, "favorite_genre", GENRES[i % 2])
        lt.clock.advance(1)
    return preference_slot_id("favorite_genre")


async def test_preferences_read_the_current_slot_not_its_history(
    durable: BackendUnderTest,
) -> None:
    store = ReadCountingStore(durable.durable)
    lt = make_longterm(dataclasses.replace(durable, durable=store))  # type: ignore[arg-type]
    slot = await change_often(lt, CHANGES)
    store.queried.clear()

    (current,) = await lt.memory.preferences(lt.user)

    assert current.memory_id == slot
    assert current.version == CHANGES
    assert current.metadata["preference_value"] == GENRES[(CHANGES - 1) % 2]
    assert sum(store.queried.values()) <= 2  # the slot; never its 299 history records
    # History is all still there, as users saw it before.
    everything = await lt.memory.list(lt.user, include_superseded=True, limit=1000)
    assert [r.memory_id for r in everything] == [
        slot,
        *(preference_history_id(slot, v) for v in range(CHANGES - 1, 0, -1)),
    ]
    assert {r.memory_type for r in everything} == {"preference"}
    history = await lt.memory.preference_history(lt.user, "favorite_genre")
    assert [h.memory_id for h in history] == [r.memory_id for r in everything[1:101]]
    assert {h.memory_type for h in history} == {"preference"}
    stats = await lt.memory.stats(lt.user)
    assert (stats.by_type, stats.superseded) == ({"preference": 1}, CHANGES - 1)


async def test_history_is_stored_with_an_internal_type_and_the_slots_retention(
    durable: BackendUnderTest,
) -> None:
    types = [
        MemoryType("preference", timedelta(days=30), 0.9) if t.name == "preference" else t
        for t in DEFAULT_MEMORY_TYPES
    ]
    lt = make_longterm(durable, types=MemoryTypeRegistry(types))
    v1 = await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen")
    lt.clock.advance(3600)
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "shonen")
    history_id = preference_history_id(v1.memory_id, 1)

    stored = await durable.durable.get_memory(lt.user, history_id)
    assert stored is not None
    assert stored.memory_type == PREFERENCE_HISTORY_TYPE
    assert (stored.created_at, stored.expires_at) == (v1.created_at, v1.expires_at)
    shown = await lt.memory.get(lt.user, history_id)
    assert shown == stored.model_copy(update={"memory_type": "preference"})
    assert [r.memory_id for r in await lt.memory.list(lt.user, types=["fact"], limit=10)] == []
    assert await lt.memory.list(lt.user, types=["fact"], include_superseded=True) == []


async def test_forget_session_rolls_back_and_forgets_history_from_the_session(
    lt: LongTerm,
) -> None:
    m, u = lt.memory, lt.user
    await m.upsert_preference(u, "favorite_genre", "seinen", provenance=in_session("s-b", 1))
    await m.upsert_preference(u, "favorite_genre", "shonen", provenance=in_session("s-a", 2))
    await m.upsert_preference(u, "favorite_genre", "josei", provenance=in_session("s-b", 3))
    await m.upsert_preference(u, "addressed_as", "Kai", provenance=in_session("s-b", 4))
    await m.upsert_preference(u, "addressed_as", "Mr Tanaka", provenance=in_session("s-a", 5))
    await m.upsert_preference(u, "addressed_as", "Tanaka", provenance=in_session("s-a", 6))

    # The shonen history value, the current "Tanaka" and the "Mr Tanaka" history value.
    assert await m.forget_session(u, "s-a") == 3

    genre = await m.get_preference(u, "favorite_genre")
    assert genre is not None
    assert genre.metadata["preference_value"] == "josei"
    history = await m.preference_history(u, "favorite_genre")
    assert [h.metadata["preference_value"] for h in history] == ["seinen"]
    name = await m.get_preference(u, "addressed_as")
    assert name is not None
    assert (name.memory_type, name.metadata["preference_value"]) == ("preference", "Kai")
    assert name.provenance == in_session("s-b", 4)
    assert "history_of" not in name.metadata
    assert await m.preference_history(u, "addressed_as") == []
    assert {r.metadata["preference_value"] for r in await m.preferences(u)} == {"josei", "Kai"}
    assert await lt.indexed("kai") == [name.memory_id]
    forgotten = [c for c in await m.changes(u) if c.op == "forget"]
    assert {c.memory_type for c in forgotten} == {"preference"}
    assert len(forgotten) == 3


async def test_forget_and_purge_remove_history(lt: LongTerm) -> None:
    slot = await change_often(lt, 4)
    assert await lt.memory.forget(lt.user, preference_history_id(slot, 2))
    history = await lt.memory.preference_history(lt.user, "favorite_genre")
    assert [h.metadata["slot_version"] for h in history] == [3, 1]
    assert await lt.memory.forget(lt.user, slot)
    assert await lt.memory.list(lt.user, include_superseded=True) == []

    slot = await change_often(lt, 3)
    await lt.memory.purge_user(lt.user)
    assert await lt.memory.list(lt.user, include_superseded=True) == []
    assert await lt.memory.get(lt.user, preference_history_id(slot, 1)) is None


async def test_history_written_by_older_code_is_still_hidden_and_shown(lt: LongTerm) -> None:
    """Before history had its own type, it was stored with type ``preference``."""
    m, u, store = lt.memory, lt.user, lt.backend.durable
    await m.upsert_preference(u, "favorite_genre", "seinen", provenance=in_session("s-b", 1))
    lt.clock.advance(1)
    await m.upsert_preference(u, "favorite_genre", "shonen", provenance=in_session("s-a", 2))
    slot = preference_slot_id("favorite_genre")
    history_id = preference_history_id(slot, 1)
    new = await store.get_memory(u, history_id)
    assert new is not None
    await store.delete_memory(u, history_id)
    old = new.model_copy(update={"memory_type": "preference"})
    await store.put_memory(old, expected_version=0)

    assert [r.memory_id for r in await m.preferences(u)] == [slot]
    shown = await m.list(u, include_superseded=True)
    assert [r.memory_id for r in shown] == [slot, history_id]
    assert await m.preference_history(u, "favorite_genre") == [old]
    stats = await m.stats(u)
    assert (stats.total, stats.superseded) == (1, 1)

    assert await m.forget_session(u, "s-a") == 1
    current = await m.get_preference(u, "favorite_genre")
    assert current is not None
    assert (current.memory_type, current.metadata["preference_value"]) == ("preference", "seinen")
    assert await m.get(u, history_id) is None
