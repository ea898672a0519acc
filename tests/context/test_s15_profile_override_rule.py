"""The rule of the conversation overriding the profile, as pure functions (session 15).

:func:`tiermem.longterm.context.override_by_entities` leaves out of the user context a
keyed preference that an active entity of its kind contradicts (the map is the detector's
``KIND_FAVORITE_KEY``; values compared as structured memory compares them), and
``assemble_context`` applies it to the profile and keeps the preference out of the recall
block too. The public API's behaviour is in ``test_s15_profile_override.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiermem.context import assemble_context
from tiermem.context.models import ContextWindow
from tiermem.longterm.context import (
    EMPTY_TEXT,
    UserContext,
    override_by_entities,
    render_user_context,
)
from tiermem.longterm.hits import RecallHit
from tiermem.models import ActiveEntity, MemoryRecord, Provenance
from tiermem.tokens import TiktokenCounter

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SYSTEM = "You are a manga shop assistant."


def _profile(window: ContextWindow) -> str:
    (profile,) = [i for i in window.items if i.kind == "profile"]
    return profile.text


def _preference(key: str, value: str, importance: float = 0.5) -> MemoryRecord:
    return MemoryRecord(
        memory_id=f"pref-{key}",
        user_id="u-1",
        memory_type="preference",
        content=f"{key}: {value}",
        metadata={"preference_key": key, "preference_value": value},
        importance=importance,
        created_at=T0,
        provenance=Provenance(source="explicit"),
    )


def _entity(kind: str, value: str) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=1, updated_at=T0)


def _context(counter: TiktokenCounter, *records: MemoryRecord) -> UserContext:
    return render_user_context("u-1", records, (), budget_tokens=1000, counter=counter)


@pytest.mark.parametrize(
    ("key", "value", "kind", "active", "left_out"),
    [
        ("preferred_language", "English", "language", "japanese", True),
        ("preferred_language", "english", "language", "english", False),
        ("preferred_language", "英語", "language", "english", False),
        ("preferred_language", "the Japanese edition", "language", "japanese", False),
        ("preferred_language", "Klingon", "language", "japanese", True),
        ("favorite_language", "English", "language", "japanese", True),
        # A genre or series being talked about is the topic, not a switch (R2 review):
        # "Berserk is a seinen, right?" does not hide a favourite shojo.
        ("favorite_genre", "shojo", "genre", "seinen", False),
        ("favorite_genre", "少女", "genre", "shojo", False),
        ("favorite_series", "Berserk", "series", "Vagabond", False),
        # A kind that is not the key's: nothing to compare.
        ("preferred_language", "English", "genre", "seinen", False),
        ("favorite_genre", "shojo", "volume", "42", False),
        # Keys no entity kind overrides: opinions, formats.
        ("opinion:genre:shojo", "loves", "genre", "seinen", False),
        ("preferred_format", "paperback", "genre", "seinen", False),
    ],
)
def test_which_preferences_an_active_entity_overrides(
    counter: TiktokenCounter, key: str, value: str, kind: str, active: str, left_out: bool
) -> None:
    other = _preference("preferred_format", "hardcover", importance=0.4)
    context = _context(counter, _preference(key, value), other)
    out = override_by_entities(context, [_entity(kind, active)], counter=counter)
    line = f"{key}: {value}"
    assert (line not in out.text) is left_out
    assert out.overridden == ((f"pref-{key}",) if left_out else ())
    assert "preferred_format: hardcover" in out.text
    assert out.tokens == counter.count(out.text)
    if not left_out:
        assert out is context


def test_no_entities_and_unkeyed_preferences_leave_the_context_as_it_is(
    counter: TiktokenCounter,
) -> None:
    unkeyed = MemoryRecord(
        memory_id="m-1",
        user_id="u-1",
        memory_type="preference",
        content="I prefer the English edition",
        created_at=T0,
    )
    context = _context(counter, unkeyed, _preference("favorite_genre", "shojo"))
    assert override_by_entities(context, [], counter=counter) is context
    out = override_by_entities(context, [_entity("language", "japanese")], counter=counter)
    assert out is context


def test_the_last_entity_of_a_kind_is_the_active_one(counter: TiktokenCounter) -> None:
    context = _context(counter, _preference("preferred_language", "English"))
    entities = [_entity("language", "english"), _entity("language", "japanese")]
    assert override_by_entities(context, entities, counter=counter).overridden == (
        "pref-preferred_language",
    )
    entities.reverse()
    assert override_by_entities(context, entities, counter=counter).overridden == ()


def test_a_profile_of_overridden_preferences_only_says_nothing_is_known(
    counter: TiktokenCounter,
) -> None:
    context = _context(counter, _preference("preferred_language", "English"))
    out = override_by_entities(context, [_entity("language", "japanese")], counter=counter)
    assert out.text == EMPTY_TEXT
    assert out.items == ()
    assert out.tokens <= context.tokens


def test_assemble_leaves_the_overridden_preference_out_of_recall_too(
    counter: TiktokenCounter,
) -> None:
    english = _preference("preferred_language", "English")
    context = _context(counter, english, _preference("favorite_genre", "seinen"))
    hit = RecallHit(
        kind="memory", doc_id=english.memory_id, text=english.content, score=0.9, memory=english
    )
    window = assemble_context(
        system=SYSTEM,
        user_context=context,
        entities={"language": _entity("language", "japanese")},
        recall=[hit],
        current="is it out in Japanese?",
        budget=4000,
        counter=counter,
    )
    text = "\n".join(i.text for i in window.items)
    assert "English" not in text
    assert "favorite_genre: seinen" in _profile(window)
    assert window.stats.recall_hits == 0
    # The same context with no entities: the profile is the user context's text.
    plain = assemble_context(
        system=SYSTEM, user_context=context, current="hi", budget=4000, counter=counter
    )
    assert _profile(plain) == context.text
