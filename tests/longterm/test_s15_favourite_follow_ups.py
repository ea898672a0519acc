"""Follow-ups of session 15's detection and profile work (H8), through the public API:

1. A dislike of the favourite's value ends the favourite ("I prefer horror", later "I don't
   like horror anymore": no favourite genre, history says why); the reverse still works.
2. Forgetting the session that wrote ``preferred_language`` makes the old
   ``favorite_language`` record it had superseded current again.
3. An active ``language`` entity overrides an old record still keyed ``favorite_language``.

Each case failed on the code before this change (b4e2b02) unless its comment says
otherwise. The cases on ``lt`` run on every durable backend (scripts/test.sh).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.longterm.conftest import LongTerm
from tiermem.clock import FakeClock
from tiermem.context.models import ContextWindow
from tiermem.longterm.context import UserContext, UserContextItem, override_by_entities
from tiermem.longterm.detect import detect_memories
from tiermem.longterm.records import preference_slot_id
from tiermem.models import ActiveEntity, MemoryRecord, Provenance
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.tokens import TiktokenCounter

SYSTEM = "You are a manga shop assistant."


@pytest.fixture
async def service() -> AsyncIterator[MemoryService]:
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with service:
        yield service


def _advance(service: MemoryService, hours: int = 1) -> None:
    clock = service.longterm.clock
    assert isinstance(clock, FakeClock)
    clock.advance(timedelta(hours=hours))


async def _say(service: MemoryService, session_id: str, *turns: str) -> None:
    session = await service.session(session_id, user_id="u")
    for text in turns:
        await session.add_turn("user", text)
    await service.drain()


async def _current(service: MemoryService) -> list[str]:
    return [m.content for m in await service.longterm.list("u")]


# ------------------------------------------------------ 1. a dislike ends the favourite


@pytest.mark.parametrize(
    ("favourite", "dislike", "key", "value", "opinion"),
    [
        ("I prefer horror.", "I don't like horror anymore.", "favorite_genre", "horror",
         "dislikes horror"),
        ("My favorite genre is horror.", "I hate horror now.", "favorite_genre", "horror",
         "hates horror"),
        ("ホラーが一番好き", "ホラーは苦手になった", "favorite_genre", "ホラー",
         "dislikes ホラー"),
        ("I prefer English.", "I dislike English editions.", "preferred_language", "English",
         "dislikes English editions"),
        ("I prefer paperbacks.", "I'm not a fan of paperbacks anymore.", "favorite_format",
         "paperbacks", "dislikes paperbacks"),
        ("I prefer the deluxe edition.", "I don't like the deluxe edition anymore.",
         "favorite_edition", "the deluxe edition", "dislikes the deluxe edition"),
    ],
)  # fmt: skip
async def test_a_dislike_of_the_favourite_ends_it(
    service: MemoryService, favourite: str, dislike: str, key: str, value: str, opinion: str
) -> None:
    longterm = service.longterm
    await _say(service, "s1", favourite)
    before = await longterm.get_preference("u", key)
    assert before is not None
    assert before.metadata["preference_value"] == value
    _advance(service)
    await _say(service, "s2", "Hello again.", dislike)

    assert await longterm.get_preference("u", key) is None
    assert await _current(service) == [opinion]
    hits = await longterm.recall("u", f"{value} {key.replace('_', ' ')}", k=10)
    assert [h.text for h in hits if h.text == before.content] == []
    context = await longterm.build_user_context("u", "what should I read?", budget_tokens=300)
    assert opinion in context.text
    assert before.content not in context.text
    # The history says what ended it, when and where, then the value it had.
    retired, old = await longterm.preference_history("u", key)
    assert (old.content, old.provenance.session_id) == (before.content, "s1")
    (dislike_record,) = await longterm.list("u")
    assert retired.metadata["retired_by"] == dislike_record.memory_id
    assert retired.metadata["preference_value"] == value
    assert (retired.provenance.session_id, retired.provenance.turn_indexes) == ("s2", (1,))
    assert opinion in retired.content
    assert retired.invalid_from == dislike_record.created_at


async def test_a_dislike_of_another_value_leaves_the_favourite(service: MemoryService) -> None:
    # Passed before too: only the favourite of the disliked value ends.
    await _say(service, "s1", "I prefer seinen.", "I don't like horror.", "I prefer English.")
    await _say(service, "s2", "I don't like the Japanese edition.", "I hate paperbacks.")
    # A favourite of several values is not ended by a dislike of one of them.
    await _say(service, "s3", "I prefer shojo and josei.", "I don't like shojo anymore.")
    both = await service.longterm.get_preference("u", "favorite_genre")
    assert both is not None
    assert both.content == "prefers shojo and josei"
    await _say(service, "s1", "I prefer seinen.")
    genre = await service.longterm.get_preference("u", "favorite_genre")
    language = await service.longterm.get_preference("u", "preferred_language")
    assert genre is not None
    assert genre.content == "prefers seinen"
    assert language is not None
    assert language.content == "prefers English"
    history = await service.longterm.preference_history("u", "favorite_genre")
    assert [h.content for h in history] == ["prefers shojo and josei", "prefers seinen"]


async def test_a_dislike_then_a_love_is_one_opinion_and_a_favourite_said_again_is_back(
    service: MemoryService,
) -> None:
    # The first half passed before and still does (one opinion key, rewritten); the
    # second needs the retirement.
    await _say(service, "s1", "I don't like horror.")
    _advance(service)
    await _say(service, "s1", "Actually I love horror now.")
    assert await _current(service) == ["loves horror"]
    assert await service.longterm.get_preference("u", "favorite_genre") is None
    # A favourite ended by a dislike is set again by saying it again (the same value).
    await _say(service, "s2", "I prefer horror.", "I don't like horror anymore.")
    assert await service.longterm.get_preference("u", "favorite_genre") is None
    _advance(service)
    await _say(service, "s3", "I prefer horror.")
    slot = await service.longterm.get_preference("u", "favorite_genre")
    assert slot is not None
    assert (slot.content, slot.provenance.session_id) == ("prefers horror", "s3")
    assert sorted(await _current(service)) == ["dislikes horror", "prefers horror"]
    history = await service.longterm.preference_history("u", "favorite_genre")
    assert [h.provenance.session_id for h in history] == ["s2", "s2"]
    assert "retired_by" in history[0].metadata
    assert history[1].content == "prefers horror"


async def test_forgetting_the_session_of_the_dislike_brings_the_favourite_back(
    service: MemoryService,
) -> None:
    await _say(service, "s1", "I prefer horror.")
    _advance(service)
    await _say(service, "s2", "I don't like horror anymore.")
    assert await service.longterm.get_preference("u", "favorite_genre") is None
    await service.longterm.forget_session("u", "s2")
    slot = await service.longterm.get_preference("u", "favorite_genre")
    assert slot is not None
    assert (slot.content, slot.provenance.session_id) == ("prefers horror", "s1")
    assert await _current(service) == ["prefers horror"]
    assert await service.longterm.preference_history("u", "favorite_genre") == []


async def _detected(lt: LongTerm, text: str, session_id: str, turn: int) -> None:
    drafts = detect_memories(text)
    assert drafts
    provenance = Provenance(source="auto", session_id=session_id, turn_indexes=(turn,))
    await lt.memory.remember_detected(lt.user, drafts, provenance=provenance)


async def test_a_dislike_ends_the_favourite_on_every_backend(lt: LongTerm) -> None:
    await _detected(lt, "I prefer horror.", "s1", 0)
    slot_id = preference_slot_id("favorite_genre")
    assert await lt.indexed("horror") == [slot_id]
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I don't like horror anymore.", "s2", 4)
    assert await lt.memory.get_preference(lt.user, "favorite_genre") is None
    (dislike,) = await lt.memory.list(lt.user)
    assert dislike.content == "dislikes horror"
    assert await lt.indexed("horror") == [dislike.memory_id]
    retired = await lt.memory.get_preference(lt.user, "favorite_genre", include_retired=True)
    assert retired is not None
    assert retired.invalid_from == lt.clock.now()
    assert retired.provenance.turn_indexes == (4,)
    history = await lt.memory.preference_history(lt.user, "favorite_genre")
    assert [h.memory_id for h in history] == [slot_id, f"{slot_id}-v1"]
    # Forgetting where the dislike was said restores the favourite (and its index entry).
    assert await lt.memory.forget_session(lt.user, "s2") == 2
    slot = await lt.memory.get_preference(lt.user, "favorite_genre")
    assert slot is not None
    assert (slot.content, slot.invalid_from) == ("prefers horror", None)
    assert await lt.indexed("horror") == [slot_id]


async def test_a_dislike_ends_an_old_favorite_language_record_on_every_backend(
    lt: LongTerm,
) -> None:
    old = await lt.backend.durable.put_memory(
        _old_favorite_language(lt.user, "Japanese", lt.clock.now()), expected_version=0
    )
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I don't like the Japanese edition.", "s2", 1)
    assert await lt.memory.get_preference(lt.user, "preferred_language") is None
    assert await lt.memory.get_preference(lt.user, "favorite_language") is None
    assert [m.content for m in await lt.memory.list(lt.user)] == ["dislikes the Japanese edition"]
    history = await lt.memory.preference_history(lt.user, "preferred_language")
    assert [h.memory_id for h in history] == [
        preference_slot_id("preferred_language"),
        old.memory_id,
    ]
    await lt.memory.forget_session(lt.user, "s2")
    back = await lt.memory.get_preference(lt.user, "preferred_language")
    assert back is not None
    assert (back.memory_id, back.content) == (old.memory_id, old.content)


# ------------------------------------------- 2. forgetting restores across the alias


def _old_favorite_language(user_id: str, value: str, now: datetime) -> MemoryRecord:
    """A record as detection wrote it before session 15: key ``favorite_language``."""
    return MemoryRecord.model_validate(
        {
            "memory_id": preference_slot_id("favorite_language"),
            "user_id": user_id,
            "memory_type": "preference",
            "content": f"favorite language: {value}",
            "metadata": {"preference_key": "favorite_language", "preference_value": value},
            "importance": 0.9,
            "created_at": now,
            "valid_from": now,
            "provenance": {"source": "auto", "session_id": "s0", "turn_indexes": [3]},
        }
    )


async def test_forgetting_the_new_keys_session_restores_the_old_record_on_every_backend(
    lt: LongTerm,
) -> None:
    old = await lt.backend.durable.put_memory(
        _old_favorite_language(lt.user, "Japanese", lt.clock.now()), expected_version=0
    )
    await lt.memory._sync_index(lt.user, old.memory_id)  # as it was written then
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I prefer English.", "s1", 2)
    assert [m.content for m in await lt.memory.list(lt.user)] == ["prefers English"]

    assert await lt.memory.forget_session(lt.user, "s1") == 1
    current = await lt.memory.get_preference(lt.user, "preferred_language")
    assert current is not None
    assert (current.memory_id, current.content) == (old.memory_id, "favorite language: Japanese")
    assert current.invalid_from is None
    assert "superseded_by" not in current.metadata
    assert [m.content for m in await lt.memory.list(lt.user)] == ["favorite language: Japanese"]
    assert await lt.indexed("Japanese") == [old.memory_id]
    assert await lt.memory.preference_history(lt.user, "preferred_language") == []
    # Stated again later, the new key supersedes it once more.
    await _detected(lt, "I prefer French.", "s3", 0)
    assert [m.content for m in await lt.memory.list(lt.user)] == ["prefers French"]


async def test_a_rollback_to_an_earlier_value_of_the_new_key_keeps_the_old_record_superseded(
    lt: LongTerm,
) -> None:
    # Passed before too: the new key still has a value not from the session.
    old = await lt.backend.durable.put_memory(
        _old_favorite_language(lt.user, "Japanese", lt.clock.now()), expected_version=0
    )
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I prefer French.", "s1", 0)
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I prefer English.", "s2", 0)
    await lt.memory.forget_session(lt.user, "s2")
    current = await lt.memory.get_preference(lt.user, "preferred_language")
    assert current is not None
    assert current.content == "prefers French"
    kept = await lt.backend.durable.get_memory(lt.user, old.memory_id)
    assert kept is not None
    assert kept.invalid_from is not None


async def test_forgetting_both_sessions_leaves_no_language(lt: LongTerm) -> None:
    # Passed before too: the old record said in the forgotten session goes with it.
    record = _old_favorite_language(lt.user, "Japanese", lt.clock.now())
    record = record.model_copy(
        update={"provenance": Provenance(source="auto", session_id="s1", turn_indexes=(0,))}
    )
    await lt.backend.durable.put_memory(record, expected_version=0)
    lt.clock.advance(timedelta(minutes=5))
    await _detected(lt, "I prefer English.", "s1", 3)
    assert await lt.memory.forget_session(lt.user, "s1") == 2
    assert await lt.memory.get_preference(lt.user, "preferred_language") is None
    assert await lt.memory.list(lt.user) == []


# ------------------------------------------ 3. an active entity overrides the old key


def _profile(window: ContextWindow) -> str:
    (profile,) = [i for i in window.items if i.kind == "profile"]
    return profile.text


async def test_an_active_language_overrides_an_old_favorite_language_record(
    service: MemoryService,
) -> None:
    longterm = service.longterm
    await longterm.durable.put_memory(
        _old_favorite_language("u", "English", longterm.clock.now()), expected_version=0
    )
    await longterm.upsert_preference("u", "favorite_genre", "seinen")
    session = await service.session(user_id="u")
    await session.add_turn("user", "Hello again")
    before = await session.context("anything new?", system=SYSTEM)
    assert "favorite language: English" in _profile(before)
    await session.add_turn("user", "Do you have Vagabond in Japanese?")
    window = await session.context("is it in stock?", system=SYSTEM)
    assert "English" not in _profile(window)
    assert "favorite_genre: seinen" in _profile(window)


def test_override_by_entities_reads_an_old_key_as_its_new_name() -> None:
    counter = TiktokenCounter()
    provenance = Provenance(source="auto", session_id="s0", turn_indexes=(3,))
    items = tuple(
        UserContextItem(
            memory_id=f"m-{key}",
            memory_type="preference",
            section="preference",
            line=f"- {key}: {value}  [pref, session s0 turn 3]",
            score=0.9,
            provenance=provenance,
            preference_key=key,
            preference_value=value,
        )
        for key, value in (("favorite_language", "English"), ("favorite_genre", "seinen"))
    )
    text = "\n".join(["Known about this user:", "Preferences:", *(i.line for i in items)])
    context = UserContext(
        user_id="u",
        text=text,
        items=items,
        tokens=counter.count(text),
        budget_tokens=500,
        dropped=0,
    )
    at = datetime(2030, 1, 1, tzinfo=UTC)
    japanese = ActiveEntity(kind="language", value="japanese", turn_index=1, updated_at=at)
    out = override_by_entities(context, [japanese], counter=counter)
    assert out.overridden == ("m-favorite_language",)
    assert "English" not in out.text
    # An entity that agrees ("英語" is English) leaves it.
    english = ActiveEntity(kind="language", value="英語", turn_index=2, updated_at=at)
    assert override_by_entities(context, [english], counter=counter) is context
