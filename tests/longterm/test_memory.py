"""LongTermMemory on every durable backend: dedup, preferences, supersession, retention,
change log, forgetting, stats, recall delegation, and the service wiring (auto-detection
hook, GDPR purge across every tier)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tests.longterm.conftest import CountingEmbedder, FakeRecaller, LongTerm, make_longterm
from tiermem.errors import (
    ConflictError,
    NotFoundError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.longterm.detect import DetectedMemory
from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
from tiermem.longterm.recall import Recaller
from tiermem.longterm.records import (
    CHANGE_LOG_TYPE,
    dedup_memory_id,
    normalize_content,
    plan_forget_session,
    preference_history_id,
    preference_slot_id,
)
from tiermem.models import MemoryRecord, Provenance
from tiermem.service import MemoryService
from tiermem.store.contract import Capability
from tiermem.testing import BackendUnderTest
from tiermem.testing.backend import fresh_id

DAY = timedelta(days=1)


def in_session(session_id: str, *turns: int, source: str = "auto") -> Provenance:
    return Provenance(source=source, session_id=session_id, turn_indexes=turns)


# -- remember ---------------------------------------------------------------------------------


async def test_remember_applies_type_defaults_and_indexes(lt: LongTerm) -> None:
    now = lt.clock.now()
    fact = await lt.memory.remember(lt.user, "Reads manga on a Kindle", tags=["device"])
    habit = await lt.memory.remember(
        lt.user, "Browses new releases every Friday", memory_type="behavioral_pattern"
    )
    assert (fact.importance, fact.expires_at, fact.provenance.source) == (0.7, None, "explicit")
    assert fact.valid_from == now
    assert fact.tags == ("device",)
    assert habit.importance == 0.4
    assert habit.expires_at == now + 30 * DAY
    assert await lt.memory.get(lt.user, fact.memory_id) == fact
    assert await lt.indexed("kindle") == [fact.memory_id]
    assert await lt.indexed("friday") == [habit.memory_id]


async def test_remember_dedups_normalized_content_and_merges_the_repeat(lt: LongTerm) -> None:
    first = await lt.memory.remember(
        lt.user, "Prefers   Seinen!", tags=["genre"], provenance=in_session("s-1", 3)
    )
    again = await lt.memory.remember(
        lt.user, "prefers seinen", tags=["taste", "genre"], provenance=in_session("s-2", 0)
    )
    assert normalize_content("Prefers   Seinen!") == normalize_content("prefers seinen")
    assert again.memory_id == first.memory_id == dedup_memory_id("fact", "prefers seinen")
    assert again.content == "Prefers   Seinen!"  # the first wording is kept
    assert again.tags == ("genre", "taste")
    assert again.provenance == in_session("s-1", 3)
    assert [(a["session_id"], a["turn_indexes"]) for a in again.metadata["also_from"]] == [
        ("s-2", [0])
    ]
    # The same provenance again changes nothing and writes nothing.
    same = await lt.memory.remember(lt.user, "PREFERS SEINEN.", provenance=in_session("s-2", 0))
    assert same.version == again.version
    assert [r.memory_id for r in await lt.memory.list(lt.user)] == [first.memory_id]
    # Another type is another memory.
    other = await lt.memory.remember(lt.user, "prefers seinen", memory_type="feedback")
    assert other.memory_id != first.memory_id


async def test_concurrent_identical_remembers_make_one_record(lt: LongTerm) -> None:
    results = await asyncio.gather(
        *(
            lt.memory.remember(lt.user, "Allergic to peanuts", provenance=in_session(f"s-{i}", i))
            for i in range(8)
        )
    )
    assert len({r.memory_id for r in results}) == 1
    (stored,) = await lt.memory.list(lt.user)
    sources = {stored.provenance.session_id} | {
        a["session_id"] for a in stored.metadata["also_from"]
    }
    assert sources == {f"s-{i}" for i in range(8)}  # every writer landed exactly once
    assert await lt.indexed("peanuts") == [stored.memory_id]


async def test_repeat_extends_retention(lt: LongTerm) -> None:
    habit = await lt.memory.remember(lt.user, "Reads at night", memory_type="behavioral_pattern")
    lt.clock.advance(20 * DAY)
    again = await lt.memory.remember(
        lt.user, "reads at night", memory_type="behavioral_pattern", provenance=in_session("s-9")
    )
    assert again.expires_at == habit.expires_at + 20 * DAY  # type: ignore[operator]
    lt.clock.advance(20 * DAY)
    assert await lt.memory.get(lt.user, habit.memory_id) is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"content": "   "}, "empty"),
        ({"content": "x" * (33 * 1024)}, "limit"),
        ({"content": "ok", "memory_type": "mood"}, "unknown memory type"),
        ({"content": "ok", "memory_type": CHANGE_LOG_TYPE}, "internal"),
        ({"content": "ok", "importance": 1.5}, "importance"),
        ({"content": "ok", "tags": "genre"}, "not one string"),
        ({"content": "ok", "tags": ["a\nb"]}, "control character"),
        ({"content": "ok", "metadata": {"also_from": []}}, "managed by tiermem"),
        ({"content": "ok", "metadata": {"x": object()}}, "JSON"),
        ({"content": "ok", "provenance": Provenance(session_id="s\n1")}, "control character"),
    ],
)
async def test_remember_rejects_bad_input_before_writing(
    lt: LongTerm, kwargs: dict[str, object], message: str
) -> None:
    options = dict(kwargs)  # the parameter is shared by every backend's run
    content = options.pop("content")
    with pytest.raises(ValidationError, match=message):
        await lt.memory.remember(lt.user, content, **options)  # type: ignore[arg-type]
    assert await lt.memory.list(lt.user) == []
    assert await lt.memory.changes(lt.user) == []


async def test_bad_user_id_is_rejected(lt: LongTerm) -> None:
    with pytest.raises(ValidationError, match="user_id"):
        await lt.memory.remember("", "fact")
    with pytest.raises(ValidationError, match="user_id"):
        await lt.memory.upsert_preference("u\t1", "k", "v")


async def test_embedding_is_computed_once_per_memory(durable: BackendUnderTest) -> None:
    embedder = CountingEmbedder()
    lt = make_longterm(durable, embedder=embedder)
    record = await lt.memory.remember(lt.user, "Collects first editions")
    assert record.embedding is not None
    assert len(record.embedding) == 3
    assert record.embedding_model == "fake-embed-3"
    await lt.memory.remember(lt.user, "collects first editions", provenance=in_session("s-2"))
    assert embedder.calls == 1  # a repeat costs no embedding call
    pref = await lt.memory.upsert_preference(lt.user, "format", "paperback")
    assert pref.embedding is not None
    assert embedder.calls == 2


# -- retention ----------------------------------------------------------------------------------


async def test_retention_behavioral_pattern_expires_preference_never(lt: LongTerm) -> None:
    habit = await lt.memory.remember(
        lt.user, "Buys volumes on release day", memory_type="behavioral_pattern"
    )
    pref = await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen")
    lt.clock.advance(30 * DAY - timedelta(seconds=1))
    assert await lt.memory.get(lt.user, habit.memory_id) is not None
    lt.clock.advance(timedelta(seconds=1))
    assert await lt.memory.get(lt.user, habit.memory_id) is None
    assert [r.memory_id for r in await lt.memory.list(lt.user)] == [pref.memory_id]
    stats = await lt.memory.stats(lt.user)
    assert stats.expired_awaiting_collection >= 1
    lt.clock.advance(3650 * DAY)
    assert await lt.memory.get_preference(lt.user, "favorite_genre") == pref


async def test_expired_dedup_slot_is_written_afresh(lt: LongTerm) -> None:
    old = await lt.memory.remember(lt.user, "Likes cats", memory_type="behavioral_pattern")
    lt.clock.advance(31 * DAY)
    new = await lt.memory.remember(lt.user, "likes cats", memory_type="behavioral_pattern")
    assert new.memory_id == old.memory_id
    assert new.version == 1
    assert new.created_at == lt.clock.now()


# -- preferences --------------------------------------------------------------------------------


async def test_upsert_preference_replaces_value_and_keeps_history(lt: LongTerm) -> None:
    v1 = await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen")
    lt.clock.advance(60)
    v2 = await lt.memory.upsert_preference(
        lt.user, "Favorite_Genre", "shonen", text="prefers shonen", provenance=in_session("s-2", 4)
    )
    lt.clock.advance(60)
    v3 = await lt.memory.upsert_preference(lt.user, "favorite_genre", "josei")
    slot = preference_slot_id("favorite_genre")
    assert v1.memory_id == v2.memory_id == v3.memory_id == slot
    assert (v3.version, v3.content, v3.metadata["preference_value"]) == (
        3,
        "favorite_genre: josei",
        "josei",
    )
    assert v2.content == "prefers shonen"
    assert v2.provenance == in_session("s-2", 4)
    history = await lt.memory.preference_history(lt.user, "favorite_genre")
    assert [h.memory_id for h in history] == [
        preference_history_id(slot, 2),
        preference_history_id(slot, 1),
    ]
    assert [h.metadata["preference_value"] for h in history] == ["shonen", "seinen"]
    assert [h.invalid_from for h in history] == [v3.created_at, v2.created_at]
    assert [h.provenance for h in history] == [in_session("s-2", 4), v1.provenance]
    # Current only by default; history with include_superseded.
    assert [r.memory_id for r in await lt.memory.list(lt.user)] == [slot]
    everything = await lt.memory.list(lt.user, include_superseded=True)
    assert {r.memory_id for r in everything} == {slot, *(h.memory_id for h in history)}
    # The index holds the current value only.
    assert await lt.indexed("josei") == [slot]
    assert await lt.indexed("seinen") == []
    assert await lt.indexed("shonen") == []


async def test_upsert_same_value_changes_nothing(lt: LongTerm) -> None:
    first = await lt.memory.upsert_preference(lt.user, "addressed_as", "Ken")
    again = await lt.memory.upsert_preference(lt.user, "addressed_as", "Ken")
    assert again == first
    assert await lt.memory.preference_history(lt.user, "addressed_as") == []
    assert [c.op for c in await lt.memory.changes(lt.user)] == ["upsert"]


async def test_concurrent_preference_upserts_one_current_seven_in_history(lt: LongTerm) -> None:
    values = [f"genre-{i}" for i in range(8)]
    await asyncio.gather(
        *(lt.memory.upsert_preference(lt.user, "favorite_genre", v) for v in values)
    )
    current = await lt.memory.get_preference(lt.user, "favorite_genre")
    assert current is not None
    assert current.version == 8
    assert current.metadata["preference_value"] in values
    history = await lt.memory.preference_history(lt.user, "favorite_genre")
    assert len(history) == 7
    assert [h.metadata["slot_version"] for h in history] == list(range(7, 0, -1))
    landed = [
        current.metadata["preference_value"],
        *(h.metadata["preference_value"] for h in history),
    ]
    assert sorted(landed) == values  # each write landed exactly once, none lost
    prefs = await lt.memory.preferences(lt.user)
    assert [p.memory_id for p in prefs] == [current.memory_id]
    assert await lt.indexed(current.metadata["preference_value"]) == [current.memory_id]


async def test_preference_validation(lt: LongTerm) -> None:
    with pytest.raises(ValidationError, match="preference key"):
        await lt.memory.upsert_preference(lt.user, " ", "x")
    with pytest.raises(ValidationError, match="preference value"):
        await lt.memory.upsert_preference(lt.user, "k", "")
    with pytest.raises(ValidationError, match="limit"):
        await lt.memory.upsert_preference(lt.user, "k" * 201, "x")
    assert await lt.memory.list(lt.user, include_superseded=True) == []


# -- supersession -------------------------------------------------------------------------------


async def test_supersede_hides_the_old_record_and_links_the_new(lt: LongTerm) -> None:
    old = await lt.memory.remember(
        lt.user, "Lives in Osaka", tags=["home"], provenance=in_session("s-1", 2)
    )
    lt.clock.advance(3600)
    new = await lt.memory.supersede(
        lt.user, old.memory_id, "Lives in Tokyo", provenance=in_session("s-2", 7)
    )
    assert new.provenance == Provenance(
        source="auto", session_id="s-2", turn_indexes=(7,), memory_ids=(old.memory_id,)
    )
    assert new.metadata["supersedes"] == old.memory_id
    assert new.tags == ("home",)
    assert new.importance == old.importance
    hidden = await lt.memory.get(lt.user, old.memory_id)
    assert hidden is not None
    assert hidden.invalid_from == lt.clock.now()
    assert hidden.metadata["superseded_by"] == new.memory_id
    assert [r.memory_id for r in await lt.memory.list(lt.user)] == [new.memory_id]
    shown = await lt.memory.list(lt.user, include_superseded=True)
    assert {r.memory_id for r in shown} == {old.memory_id, new.memory_id}
    assert await lt.indexed("osaka") == []
    assert await lt.indexed("tokyo") == [new.memory_id]
    # Retrying the same supersession finishes it without duplicates.
    again = await lt.memory.supersede(lt.user, old.memory_id, "Lives in Tokyo")
    assert again.memory_id == new.memory_id
    # Superseding it with something else is a conflict: supersede the newer one.
    with pytest.raises(ConflictError, match="already superseded"):
        await lt.memory.supersede(lt.user, old.memory_id, "Lives in Kyoto")


async def test_supersede_errors(lt: LongTerm) -> None:
    fact = await lt.memory.remember(lt.user, "Owns volume 1")
    pref = await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen")
    with pytest.raises(NotFoundError):
        await lt.memory.supersede(lt.user, "m-missing", "x")
    with pytest.raises(ValidationError, match="upsert_preference"):
        await lt.memory.supersede(lt.user, pref.memory_id, "shonen")
    with pytest.raises(ValidationError, match="old content"):
        await lt.memory.supersede(lt.user, fact.memory_id, "owns volume 1!")
    assert (await lt.memory.get(lt.user, fact.memory_id)) == fact


async def test_remembering_a_superseded_fact_revives_it(lt: LongTerm) -> None:
    old = await lt.memory.remember(lt.user, "Reads in English")
    await lt.memory.supersede(lt.user, old.memory_id, "Reads in Japanese")
    revived = await lt.memory.remember(lt.user, "reads in english", provenance=in_session("s-3"))
    assert revived.memory_id == old.memory_id
    assert revived.invalid_from is None
    assert "superseded_by" not in revived.metadata
    assert {r.content for r in await lt.memory.list(lt.user)} == {
        "Reads in English",
        "Reads in Japanese",
    }
    assert await lt.indexed("english") == [old.memory_id]


# -- change log ---------------------------------------------------------------------------------


async def test_change_log_records_every_write_newest_first_without_content(lt: LongTerm) -> None:
    fact = await lt.memory.remember(lt.user, "Secret: loves mecha")
    lt.clock.advance(1)
    since = lt.clock.now()
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "mecha")
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "sports")
    newer = await lt.memory.supersede(lt.user, fact.memory_id, "Secret: loves sports manga")
    await lt.memory.forget(lt.user, newer.memory_id)
    changes = await lt.memory.changes(lt.user)
    # One entry per operation: a supersession is one entry, naming the new memory.
    assert [c.op for c in changes] == ["forget", "supersede", "upsert", "upsert", "remember"]
    assert changes[1].memory_id == fact.memory_id
    assert changes[1].related == newer.memory_id
    assert changes[-1].memory_id == fact.memory_id
    assert changes[-1].memory_type == "fact"
    assert all("mecha" not in c.summary and "sports" not in c.summary for c in changes)
    recent = await lt.memory.changes(lt.user, since=since)
    assert len(recent) == 4
    assert len(await lt.memory.changes(lt.user, limit=2)) == 2
    # The log is never listed or indexed as memories.
    assert all(
        r.memory_type != CHANGE_LOG_TYPE
        for r in await lt.memory.list(lt.user, include_superseded=True)
    )
    assert await lt.indexed("forgotten") == []


# -- forget -------------------------------------------------------------------------------------


async def test_forget_removes_from_store_and_index(lt: LongTerm) -> None:
    fact = await lt.memory.remember(lt.user, "Birthday is May 3")
    other = await lt.memory.remember(lt.user, "Birthday gift: Berserk deluxe")
    assert await lt.memory.forget(lt.user, fact.memory_id) is True
    assert await lt.memory.get(lt.user, fact.memory_id) is None
    assert await lt.indexed("birthday") == [other.memory_id]
    assert await lt.memory.forget(lt.user, fact.memory_id) is False
    assert [c.op for c in await lt.memory.changes(lt.user)][:1] == ["forget"]
    entry = (await lt.memory.changes(lt.user))[0]
    with pytest.raises(ValidationError, match="change-log"):
        await lt.memory.forget(lt.user, entry.entry_id)


async def test_forgetting_a_preference_forgets_its_history(lt: LongTerm) -> None:
    for value in ("seinen", "shonen", "josei"):
        await lt.memory.upsert_preference(lt.user, "favorite_genre", value)
    slot = preference_slot_id("favorite_genre")
    assert await lt.memory.forget(lt.user, slot) is True
    assert await lt.memory.list(lt.user, include_superseded=True) == []
    fresh = await lt.memory.upsert_preference(lt.user, "favorite_genre", "isekai")
    assert fresh.version == 1
    assert await lt.memory.preference_history(lt.user, "favorite_genre") == []


async def test_forget_session_cascades_and_keeps_what_was_said_elsewhere(lt: LongTerm) -> None:
    m, u = lt.memory, lt.user
    said = await m.remember(u, "Is saving for the Berserk box set", provenance=in_session("s-a", 1))
    derived = await m.remember(
        u, "Summary: budget-conscious collector", memory_type="interaction_summary",
        provenance=Provenance(source="rollup", memory_ids=(said.memory_id,)),
    )  # fmt: skip
    derived2 = await m.remember(
        u,
        "Profile: collector",
        provenance=Provenance(source="rollup", memory_ids=(derived.memory_id,)),
    )
    unrelated = await m.remember(u, "Reads on a Kindle", provenance=in_session("s-b", 0))
    twice = await m.remember(u, "Lives in Osaka", provenance=in_session("s-a", 2))
    await m.remember(u, "lives in osaka", provenance=in_session("s-b", 5))
    kept_from_a = await m.remember(u, "Likes cats", provenance=in_session("s-b", 1))
    await m.remember(u, "likes cats", provenance=in_session("s-a", 3))
    await m.upsert_preference(u, "favorite_genre", "seinen", provenance=in_session("s-b", 2))
    await m.upsert_preference(u, "favorite_genre", "shonen", provenance=in_session("s-a", 4))
    await m.upsert_preference(
        u, "opinion:genre:horror", "dislikes", provenance=in_session("s-a", 6)
    )

    forgotten = await m.forget_session(u, "s-a")

    assert forgotten == 5  # said, derived, derived2, the shonen value, the horror opinion
    for gone in (said, derived, derived2):
        assert await m.get(u, gone.memory_id) is None
    assert await lt.indexed("berserk") == []
    assert await lt.indexed("collector") == []
    assert await m.get_preference(u, "opinion:genre:horror") is None
    genre = await m.get_preference(u, "favorite_genre")
    assert genre is not None
    assert genre.metadata["preference_value"] == "seinen"
    assert genre.provenance == in_session("s-b", 2)
    assert await m.preference_history(u, "favorite_genre") == []
    assert await lt.indexed("seinen") == [genre.memory_id]
    osaka = await m.get(u, twice.memory_id)
    assert osaka is not None
    assert osaka.provenance == in_session("s-b", 5)
    assert "also_from" not in osaka.metadata
    cats = await m.get(u, kept_from_a.memory_id)
    assert cats is not None
    assert cats.provenance == in_session("s-b", 1)
    assert "also_from" not in cats.metadata
    assert await m.get(u, unrelated.memory_id) == unrelated
    assert {r.memory_id for r in await m.list(u, include_superseded=True)} == {
        unrelated.memory_id, twice.memory_id, kept_from_a.memory_id, genre.memory_id,
    }  # fmt: skip
    assert await m.forget_session(u, "s-a") == 0


async def test_purge_user_removes_memories_and_index(lt: LongTerm) -> None:
    other = fresh_id("u")
    await lt.memory.remember(lt.user, "Mine")
    kept = await lt.memory.remember(other, "Mine too")
    assert await lt.memory.purge_user(lt.user) >= 2  # the memory and its log entry
    assert await lt.memory.list(lt.user, include_superseded=True) == []
    assert await lt.memory.changes(lt.user) == []
    assert await lt.indexed("mine") == []
    assert await lt.memory.get(other, kept.memory_id) == kept
    assert await lt.indexed("mine", user=other) == [kept.memory_id]


# -- list, stats ----------------------------------------------------------------------------


async def test_list_filters_types_and_pages_through_many_records(lt: LongTerm) -> None:
    lt.memory._page = 3  # small pages: exercise paging and the one-instant widening
    facts = [await lt.memory.remember(lt.user, f"fact number {i}") for i in range(5)]
    lt.clock.advance(1)
    more = [await lt.memory.remember(lt.user, f"later fact {i}") for i in range(4)]
    summary = await lt.memory.remember(
        lt.user, "Talked about Berserk", memory_type="interaction_summary"
    )
    listed = await lt.memory.list(lt.user, types=["fact"])
    assert {r.memory_id for r in listed} == {r.memory_id for r in facts + more}
    assert [r.created_at for r in listed] == sorted((r.created_at for r in listed), reverse=True)
    assert len(await lt.memory.list(lt.user, limit=4)) == 4
    assert [r.memory_id for r in await lt.memory.list(lt.user, types=["interaction_summary"])] == [
        summary.memory_id
    ]
    with pytest.raises(ValidationError, match="unknown memory type"):
        await lt.memory.list(lt.user, types=["nope"])


async def test_stats(lt: LongTerm) -> None:
    counter = lt.memory.tokens
    first = lt.clock.now()
    a = await lt.memory.remember(lt.user, "Reads on a Kindle")
    lt.clock.advance(10)
    b = await lt.memory.remember(lt.user, "Weekly reader", memory_type="behavioral_pattern")
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen")
    lt.clock.advance(10)
    c = await lt.memory.upsert_preference(lt.user, "favorite_genre", "shonen")
    lt.clock.advance(31 * DAY)
    d = await lt.memory.supersede(lt.user, a.memory_id, "Reads on paper")
    stats = await lt.memory.stats(lt.user)
    assert stats.by_type == {"fact": 1, "preference": 1}
    assert stats.total == 2
    assert stats.total_tokens == counter.count(c.content) + counter.count(d.content)
    assert stats.oldest_created_at == c.created_at
    assert stats.newest_created_at == d.created_at
    assert stats.superseded == 2  # the old fact and the seinen history value
    assert stats.expired_awaiting_collection == 1  # b, on every backend in logical time
    assert stats.change_log_entries == 5
    assert b.created_at > first
    empty = await lt.memory.stats(fresh_id("u"))
    assert (empty.total, empty.oldest_created_at, empty.total_tokens) == (0, None, 0)


# -- recall delegation --------------------------------------------------------------------


async def test_recall_needs_a_recaller(lt: LongTerm) -> None:
    with pytest.raises(UnsupportedCapabilityError, match="recaller"):
        await lt.memory.recall(lt.user, "anything")


async def test_recall_delegates_with_its_arguments(durable: BackendUnderTest) -> None:
    fake = FakeRecaller()  # a fake: checks only what is passed through
    lt = make_longterm(durable, recaller=fake)
    assert await lt.memory.recall(lt.user, "seinen", types=["fact"], k=3) == []
    assert fake.calls == [{"user_id": lt.user, "query": "seinen", "types": ["fact"], "k": 3}]


async def test_recall_with_the_real_recaller_sees_only_current_memories(
    durable: BackendUnderTest,
) -> None:
    index = InProcessIndex()
    recaller = Recaller(durable.durable, index, clock=durable.clock)
    lt = make_longterm(durable, recaller=recaller)
    lt.index = index
    lt.memory.index = index
    old = await lt.memory.remember(lt.user, "Favourite series is Berserk")
    await lt.memory.supersede(lt.user, old.memory_id, "Favourite series is Vagabond")
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "seinen", text="prefers seinen")
    await lt.memory.upsert_preference(lt.user, "favorite_genre", "shonen", text="prefers shonen")
    hits = await lt.memory.recall(lt.user, "favourite series", k=5)
    assert [h.memory.content for h in hits if h.memory] == ["Favourite series is Vagabond"]
    prefs = await lt.memory.recall(lt.user, "prefers seinen shonen", k=5)
    assert [h.memory.content for h in prefs if h.memory] == ["prefers shonen"]


# -- remember_detected --------------------------------------------------------------------


async def test_remember_detected_routes_drafts(lt: LongTerm) -> None:
    drafts = [
        DetectedMemory(
            "preference", "prefers seinen", "prefer", key="favorite_genre", value="seinen"
        ),
        DetectedMemory("fact", "my birthday is May 3", "command", importance=0.8, explicit=True),
        DetectedMemory("fact", "Correction: I meant volume 3", "correction", tags=("correction",)),
    ]
    pref, explicit, correction = await lt.memory.remember_detected(
        lt.user, drafts, provenance=in_session("s-1", 4)
    )
    assert pref.memory_id == preference_slot_id("favorite_genre")
    assert (pref.content, pref.provenance.source) == ("prefers seinen", "auto")
    assert pref.metadata["detected_by"] == "prefer"
    assert explicit.provenance == in_session("s-1", 4, source="explicit")
    assert explicit.importance == 0.8
    assert correction.tags == ("correction",)
    assert correction.provenance.source == "auto"


# -- the service: auto-detection hook, purge across every tier -----------------------------


def service(backend: BackendUnderTest, **options: object) -> MemoryService:
    return MemoryService(
        backend.hot,
        backend.durable,
        clock=backend.clock,
        index=InProcessIndex(),
        **options,  # type: ignore[arg-type]
    )


async def test_user_turns_feed_long_term_memory_in_turn_order(durable: BackendUnderTest) -> None:
    memory = service(durable)
    user = fresh_id("u")
    session = await memory.session(fresh_id("s"), user_id=user)
    first = await session.add_turn("user", "I prefer seinen. Is Berserk vol. 42 in stock?")
    await session.add_turn("assistant", "I prefer to check: yes, it is.")  # not the user's
    second = await session.add_turn("user", "Hmm, actually I prefer shonen now")
    await session.add_turn("user", "!remember my birthday is May 3")
    await session.add_turn("user", "ホラーは苦手です")
    await session.close()  # waits for detection
    genre = await memory.longterm.get_preference(user, "favorite_genre")
    assert genre is not None
    assert (genre.content, genre.version) == ("prefers shonen", 2)
    assert genre.provenance == in_session(session.id, second.index)
    (old,) = await memory.longterm.preference_history(user, "favorite_genre")
    assert old.provenance == in_session(session.id, first.index)
    horror = await memory.longterm.get_preference(user, "opinion:genre:horror")
    assert horror is not None
    assert horror.content == "dislikes ホラー"
    facts = await memory.longterm.list(user, types=["fact"])
    assert [(f.content, f.provenance.source) for f in facts] == [
        ("my birthday is May 3", "explicit")
    ]
    assert memory.auto_detect_failures == 0
    await memory.longterm.aclose()


async def test_auto_detect_off_and_failures_are_counted(durable: BackendUnderTest) -> None:
    quiet = service(durable, auto_detect=False)
    user = fresh_id("u")
    session = await quiet.session(fresh_id("s"), user_id=user)
    await session.add_turn("user", "I prefer seinen")
    await quiet.drain()
    assert await quiet.longterm.list(user) == []
    # Re-run detection on demand.
    (pref,) = await session.remember_from_turns()
    assert pref.metadata["preference_value"] == "seinen"

    class Broken:
        def detect(self, text: str) -> tuple[DetectedMemory, ...]:
            return (DetectedMemory("mood", text, "broken"),)  # an unknown type: rejected

    failing = service(durable, detector=Broken())
    other = await failing.session(fresh_id("s"), user_id=user)
    turn = await other.add_turn("user", "hello")
    await failing.drain()
    assert turn.index == 0
    assert failing.auto_detect_failures == 1
    assert [t.text for t in await other.get_turns()] == ["hello"]


async def test_purge_user_erases_every_tier_and_spares_others(durable: BackendUnderTest) -> None:
    memory = service(durable)
    index = memory.longterm.index
    gone, stays = fresh_id("u"), fresh_id("u")
    sessions = {}
    for user in (gone, stays):
        s1 = await memory.session(fresh_id("s"), user_id=user)
        await s1.add_turn("user", "I prefer seinen")
        await s1.put_state("cart", {"items": [42]})
        s2 = await memory.session(fresh_id("s"), user_id=user)
        await s2.add_turn("user", "remember that I collect first editions")
        await memory.longterm.remember(user, "Lives in Osaka")
        sessions[user] = (s1.id, s2.id)
    await memory.drain()

    await memory.purge_user(gone)

    for sid in sessions[gone]:
        assert await durable.hot.load(sid, include_expired=True) is None
        assert await durable.durable.get_turns(sid) == []
        assert await durable.durable.get_record(sid, "metadata") is None
    assert await durable.durable.list_sessions(gone) == []
    assert await durable.durable.query_memories(gone, include_expired=True) == []
    assert await memory.longterm.list(gone, include_superseded=True) == []
    assert await index.search(gone, "seinen osaka editions", kinds=("memory",), limit=10) == []
    # The other user is untouched in every tier.
    for sid in sessions[stays]:
        snapshot = await durable.hot.load(sid)
        assert snapshot is not None
        assert snapshot.turns
        assert await durable.durable.get_turns(sid)
    assert len(await durable.durable.list_sessions(stays)) == 2
    assert len(await memory.longterm.list(stays)) == 3
    hits = await index.search(stays, "seinen osaka editions", kinds=("memory",), limit=10)
    assert len(hits) == 3
    await memory.longterm.aclose()


async def test_default_index_keeps_memories_recallable_after_a_restart(
    durable: BackendUnderTest,
) -> None:
    first = MemoryService(durable.hot, durable.durable, clock=durable.clock)
    user = fresh_id("u")
    fact = await first.longterm.remember(user, "Collects Berserk first editions")
    # A new process: same stores, a fresh (empty) index.
    restarted = MemoryService(durable.hot, durable.durable, clock=durable.clock)
    if Capability.PERSISTENT not in durable.durable.capabilities:
        assert isinstance(restarted.longterm.index, InProcessIndex)  # nothing survives anyway
        return
    assert isinstance(restarted.longterm.index, WarmingIndex)
    hits = await restarted.longterm.recall(user, "berserk editions")
    assert [h.doc_id for h in hits] == [fact.memory_id]
    await first.longterm.aclose()
    await restarted.longterm.aclose()


# -- the pure plan of forget_session --------------------------------------------------------


def _rec(memory_id: str, provenance: Provenance, **metadata: object) -> MemoryRecord:
    return MemoryRecord(
        memory_id=memory_id,
        user_id="u",
        memory_type="fact",
        content=memory_id,
        created_at=datetime(2030, 1, 1, tzinfo=UTC),
        provenance=provenance,
        metadata=metadata,
    )


def test_forget_plan_follows_derivation_cycles_and_keeps_other_sessions() -> None:
    records = {
        r.memory_id: r
        for r in [
            _rec("a", Provenance(session_id="s", memory_ids=("b",))),
            _rec("b", Provenance(source="rollup", memory_ids=("a",))),  # a cycle
            _rec("c", Provenance(source="rollup", memory_ids=("b",))),
            _rec("d", Provenance(session_id="t")),
            _rec("e", Provenance(session_id="t"), also_from=[{"session_id": "s", "at": "x"}]),
            _rec("f", Provenance(session_id="s"), also_from=[{"session_id": "t", "at": "x"}]),
            _rec("g", Provenance(source="import")),
        ]
    }
    plan = plan_forget_session(records, "s")
    assert plan.forgotten == {"a", "b", "c"}
    assert plan.rewrites == {
        "e": [Provenance(session_id="t").model_dump(mode="json")],
        "f": [{"session_id": "t", "at": "x"}],
    }
    assert plan.rollbacks == {}
    assert plan.deletions == ["a", "b", "c"]
