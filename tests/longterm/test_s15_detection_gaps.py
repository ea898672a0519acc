"""Detection gaps a session-14 reviewer left open, through the service (user turns →
auto-detection → ``longterm``): a contrast replaces the favourite, one key for the language
preference (and old records of the other key), negations record dislikes, and the memory
types ``feedback`` and ``behavioral_pattern`` are detected. Each case here failed on the
code of session 15's start (b54ac72) unless its comment says otherwise.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.longterm.conftest import LongTerm
from tiermem.clock import FakeClock
from tiermem.longterm import _detect_rules as rules
from tiermem.longterm.detect import RuleMemoryDetector, detect_memories
from tiermem.longterm.preferences import PREFERENCE_KEY_ALIASES
from tiermem.longterm.records import preference_slot_id
from tiermem.models import MemoryRecord, Provenance
from tiermem.policies.phrases import normal_form
from tiermem.policies.turn_text import TurnText
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


@pytest.fixture
async def service() -> AsyncIterator[MemoryService]:
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with service:
        yield service


async def _say(service: MemoryService, *turns: str, session_id: str = "s1") -> None:
    session = await service.session(session_id, user_id="u")
    for text in turns:
        await session.add_turn("user", text)
    await service.drain()


async def _contents(service: MemoryService, *types: str) -> list[str]:
    return [m.content for m in await service.longterm.list("u", types=types or None)]


# ---------------------------------------------------------------- 1. a contrast chooses


@pytest.mark.parametrize(
    ("first", "second", "value", "content"),
    [
        ("I prefer shojo.", "I'm into seinen, not shojo.", "seinen", "prefers seinen"),
        ("My favorite genre is shojo.", "I love seinen, not shojo anymore.", "seinen",
         "prefers seinen"),
        ("少女のほうが好き", "少女じゃなくて青年が好き", "青年", "prefers 青年"),
        ("I prefer paperbacks.", "I enjoy ebooks instead of paperbacks.", "ebooks",
         "prefers ebooks"),
    ],
)  # fmt: skip
async def test_a_contrast_replaces_the_favourite_it_names(
    service: MemoryService, first: str, second: str, value: str, content: str
) -> None:
    await _say(service, first, second)
    key = "favorite_format" if "ebooks" in second else "favorite_genre"
    slot = await service.longterm.get_preference("u", key)
    assert slot is not None
    assert (slot.metadata["preference_value"], slot.content) == (value, content)
    (old,) = await service.longterm.preference_history("u", key)
    assert old.provenance.turn_indexes == (0,)
    contents = await _contents(service)
    assert old.content not in contents  # the old favourite is not current next to the new


async def test_a_contrast_of_two_categories_or_of_prose_chooses_nothing(
    service: MemoryService,
) -> None:
    # Passed before too: no favourite from a contrast that names no shared category.
    await _say(
        service,
        "I prefer shojo.",
        "I love Frieren, not Berserk.",  # titles, but no catalogue: no category
        "I love seinen, not just shojo.",  # prose
        "I'm into seinen, not ebooks.",  # a genre and a format
    )
    slot = await service.longterm.get_preference("u", "favorite_genre")
    assert slot is not None
    assert slot.content == "prefers shojo"


# ---------------------------------------------------------------- 2. one language key


@pytest.mark.parametrize(
    "turns",
    [
        ("My favorite language is Japanese.", "I prefer English."),
        ("I prefer Japanese.", "My preferred language is English."),
        ("好きな言語は日本語です", "I prefer English."),
    ],
)
async def test_the_language_preference_is_one_key(
    service: MemoryService, turns: tuple[str, str]
) -> None:
    await _say(service, *turns)
    slot = await service.longterm.get_preference("u", "preferred_language")
    assert slot is not None
    assert slot.metadata["preference_value"] == "English"
    (old,) = await service.longterm.preference_history("u", "preferred_language")
    assert old.metadata["preference_value"] in ("Japanese", "日本語")
    assert await service.longterm.get_preference("u", "favorite_language") == slot
    current = await _contents(service, "preference")
    assert len(current) == 1
    assert "English" in current[0]
    hits = await service.longterm.recall("u", "language Japanese English", k=5)
    assert [h.text for h in hits if "Japanese" in h.text or "日本語" in h.text] == []


async def _old_favorite_language(service: MemoryService, value: str) -> MemoryRecord:
    """A record as detection wrote it before session 15: key ``favorite_language``."""
    now = service.longterm.clock.now()
    record = MemoryRecord(
        memory_id=preference_slot_id("favorite_language"),
        user_id="u",
        memory_type="preference",
        content=f"favorite language: {value}",
        metadata={
            "preference_key": "favorite_language",
            "preference_value": value,
            "detected_by": "favorite",
        },
        importance=0.9,
        created_at=now,
        valid_from=now,
        provenance=Provenance(source="auto", session_id="s0", turn_indexes=(3,)),
    )
    return await service.longterm.durable.put_memory(record, expected_version=0)


async def test_an_old_favorite_language_record_is_read_and_then_superseded(
    service: MemoryService,
) -> None:
    assert PREFERENCE_KEY_ALIASES["favorite_language"] == "preferred_language"
    old = await _old_favorite_language(service, "Japanese")
    # Until the preference is stated again, the old record is the current value.
    assert await service.longterm.get_preference("u", "preferred_language") == old
    assert await _contents(service, "preference") == ["favorite language: Japanese"]
    clock = service.longterm.clock
    assert isinstance(clock, FakeClock)
    clock.advance(timedelta(days=1))
    await _say(service, "I prefer English.")
    slot = await service.longterm.get_preference("u", "preferred_language")
    assert slot is not None
    assert slot.content == "prefers English"
    assert await _contents(service, "preference") == ["prefers English"]
    (history,) = await service.longterm.preference_history("u", "preferred_language")
    assert history.content == "favorite language: Japanese"
    assert history.invalid_from == slot.valid_from
    context = await service.longterm.build_user_context(
        "u", "what should I read?", budget_tokens=200
    )
    assert "English" in context.text
    assert "Japanese" not in context.text
    # Setting the old key by name sets the new one.
    await service.longterm.upsert_preference("u", "favorite_language", "French")
    slot = await service.longterm.get_preference("u", "preferred_language")
    assert slot is not None
    assert slot.metadata["preference_value"] == "French"


def _old_record(user_id: str, value: str, now: datetime) -> MemoryRecord:
    return MemoryRecord(
        memory_id=preference_slot_id("favorite_language"),
        user_id=user_id,
        memory_type="preference",
        content=f"favorite language: {value}",
        metadata={"preference_key": "favorite_language", "preference_value": value},
        importance=0.9,
        created_at=now,
        valid_from=now,
    )


async def test_an_old_key_is_superseded_by_the_new_one_on_every_backend(lt: LongTerm) -> None:
    await lt.backend.durable.put_memory(
        _old_record(lt.user, "Japanese", lt.clock.now()), expected_version=0
    )
    await lt.memory._sync_index(lt.user, preference_slot_id("favorite_language"))  # as written
    assert await lt.indexed("Japanese") == [preference_slot_id("favorite_language")]
    found = await lt.memory.get_preference(lt.user, "favorite_language")
    assert found is not None
    assert found.content == "favorite language: Japanese"
    lt.clock.advance(timedelta(minutes=5))
    await lt.memory.upsert_preference(lt.user, "preferred_language", "English")
    current = await lt.memory.list(lt.user, types=["preference"])
    assert [m.content for m in current] == ["preferred_language: English"]
    everything = await lt.memory.list(lt.user, types=["preference"], include_superseded=True)
    assert "favorite language: Japanese" in [m.content for m in everything]
    (old,) = await lt.memory.preference_history(lt.user, "preferred_language")
    assert old.content == "favorite language: Japanese"
    assert old.invalid_from == lt.clock.now()
    assert await lt.indexed("Japanese") == []


# ---------------------------------------------------------------- 3. negations


@pytest.mark.parametrize(
    "negation",
    [
        "No horror.",
        "no horror please",
        "No more horror, please.",
        "Not a fan of horror.",
        "Honestly, not really into horror.",
        "I don't like horror.",  # passed before
        "ホラーは苦手",  # passed before
    ],
)
async def test_a_negation_is_a_dislike_and_a_later_love_supersedes_it(
    service: MemoryService, negation: str
) -> None:
    await _say(service, "I like seinen.", negation)
    slot = await service.longterm.get_preference("u", "opinion:genre:horror")
    assert slot is not None
    assert slot.metadata["preference_value"] == "dislikes"
    assert not [c for c in await _contents(service) if c.startswith(("likes", "loves"))
                and ("horror" in c or "ホラー" in c)]  # fmt: skip
    await _say(service, "Actually I love horror now.", session_id="s2")
    slot = await service.longterm.get_preference("u", "opinion:genre:horror")
    assert slot is not None
    assert slot.content == "loves horror"
    (old,) = await service.longterm.preference_history("u", "opinion:genre:horror")
    assert old.metadata["preference_value"] == "dislikes"


@pytest.mark.parametrize(
    "text",
    ["No, I meant volume 3.", "no thanks", "No spoilers please", "no rush", "Not sure yet",
     "not into it", "No problem!", "no horror?"],
)  # fmt: skip
def test_no_and_not_fragments_that_name_no_kind_of_thing_draft_no_opinion(text: str) -> None:
    assert [d for d in detect_memories(text) if d.key and d.key.startswith("opinion")] == []


# ---------------------------------------------------------------- 4. feedback, habits

FEEDBACK = [
    ("This recommendation was great!", "praise"),
    ("Thanks, that was really helpful.", "praise"),
    ("Great recommendation!", "praise"),
    ("I love your recommendations", "praise"),
    ("you're so helpful", "praise"),
    ("You keep suggesting the wrong volume.", "complaint"),
    ("The search is useless.", "complaint"),
    ("Your last suggestion was way off", "complaint"),
    ("the search results aren't helpful", "complaint"),
    ("you always show me the same titles", "complaint"),
    ("I don't like your suggestions.", "complaint"),
    ("おすすめが最高でした！", "praise"),
    ("検索が使えない", "complaint"),
    ("また違う巻を勧めてる", "complaint"),
]


@pytest.mark.parametrize(("text", "kind"), FEEDBACK)
async def test_praise_and_complaints_about_the_service_are_feedback(
    service: MemoryService, text: str, kind: str
) -> None:
    await _say(service, text)
    (record,) = await service.longterm.list("u", types=["feedback"])
    assert record.content == f"feedback ({kind}): {normal_form(text)}"
    assert record.tags == ("feedback", kind)
    assert record.expires_at == record.created_at + timedelta(days=180)
    assert record.provenance.source == "auto"
    assert await service.longterm.list("u", types=["preference"]) == []


NOT_FEEDBACK = [
    "This manga was great!",  # an opinion about a manga
    "Berserk's art is great",
    "The ending was terrible.",
    "この漫画は最高",
    "Give me some good recommendations for beginners",
    "I like it when you recommend new series",
    "Can you check if the search works?",
    "you're right",
    "いつもありがとう",
    "the search isn't bad",
]


@pytest.mark.parametrize("text", NOT_FEEDBACK)
def test_opinions_about_manga_and_requests_are_not_feedback(text: str) -> None:
    assert [d for d in detect_memories(text) if d.memory_type == "feedback"] == []


HABITS = [
    ("I always buy the whole set.", "habit: I always buy the whole set"),
    ("Honestly I usually read at night", "habit: I usually read at night"),
    ("I tend to preorder new volumes", "habit: I tend to preorder new volumes"),
    ("いつもセットで買います", "habit: いつもセットで買います"),
    ("普段は夜に読みます。", "habit: 普段は夜に読みます"),
    ("I always buy it on release day", "habit: I always buy it on release day"),
]


@pytest.mark.parametrize(("text", "content"), HABITS)
async def test_a_described_habit_is_a_behavioral_pattern(
    service: MemoryService, text: str, content: str
) -> None:
    await _say(service, text)
    (record,) = await service.longterm.list("u", types=["behavioral_pattern"])
    assert record.content == content
    assert record.expires_at == record.created_at + timedelta(days=30)


NOT_HABITS = [
    "My son always buys the whole set",  # someone else
    "息子はいつもセットで買います",
    "Do you usually restock on Fridays?",  # a question
    "I don't always buy the whole set",
    "If I always buy the set, is there a discount",
    "I always read it",  # nothing to recall
    "I usually get confused by the volume numbers",  # a state, not a habit
    "I usually like horror",  # an opinion (a preference), not a habit
]


@pytest.mark.parametrize("text", NOT_HABITS)
def test_other_peoples_habits_questions_and_negations_are_not_habits(text: str) -> None:
    assert [d for d in detect_memories(text) if d.memory_type == "behavioral_pattern"] == []


# ---------------------------------------------------------------- the trigger gate

GATE_TEXTS = [
    "I'm into seinen, not shojo.",
    "My favorite language is Japanese.",
    "好きな言語は日本語です",
    "No horror.",
    "Not a fan of horror.",
    *(text for text, _ in FEEDBACK),
    *NOT_FEEDBACK,
    *(text for text, _ in HABITS),
    *NOT_HABITS,
]


@pytest.mark.parametrize("text", GATE_TEXTS)
def test_the_trigger_gate_lets_the_new_rules_through(text: str) -> None:
    detector = RuleMemoryDetector()
    assert detector.detect(text) == detector._sentences(TurnText.of(text).said)


GATE_WORDS = [
    "I", "I'm", "you", "you're", "your", "keep", "suggesting", "always", "usually", "never",
    "buy", "read", "the", "whole", "set", "recommendation", "search", "was", "is", "great",
    "useless", "helpful", "thanks,", "that", "not", "a", "fan", "of", "into", "no", "horror",
    "seinen", "shojo", "love", "like", "don't", "prefer", "favorite", "language", "Japanese",
    ",", ".", "?", "!", "おすすめ", "が", "最高", "いつも", "セット", "で", "買います", "検索",
    "使えない", "ホラー", "好き", "じゃなくて", "セイネン", "pick", "good", "help",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(GATE_WORDS), min_size=1, max_size=12))
def test_the_trigger_gates_change_nothing_on_sentences_of_the_new_rules_words(
    words: list[str],
) -> None:
    text = " ".join(words)
    detector = RuleMemoryDetector()
    assert detector.detect(text) == detector._sentences(TurnText.of(text).said)


# ---------------------------------------------------------------- any_of (a speed change)


def _reference_any_of(strings: list[str]) -> re.Pattern[str]:
    """DRAFT_TRIGGERS as it was built before session 15: a plain alternation."""
    return re.compile("|".join(map(re.escape, dict.fromkeys(strings))))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet="abno y'ホラ", min_size=1, max_size=4), min_size=1, max_size=8),
    st.lists(st.text(alphabet="abno y'ホラ.", max_size=12), max_size=20),
)
def test_any_of_finds_what_a_plain_alternation_finds(strings: list[str], texts: list[str]) -> None:
    trie = rules.any_of(strings)
    reference = _reference_any_of(strings)
    gate = rules.Gated(re.compile(""), tuple(strings))
    for text in texts:
        found = reference.search(text) is not None
        assert (trie.search(text) is not None) == found
        assert gate.opens(text) == any(s in text for s in strings) == found


def test_the_turn_triggers_find_what_the_plain_alternation_of_their_strings_finds() -> None:
    strings = [
        *rules._UNGATED_TRIGGERS,
        *(s for gate in rules.DRAFTING_GATES for s in gate.requires),
    ]
    reference = _reference_any_of(strings)
    texts = [*GATE_TEXTS, *GATE_WORDS, "Hello!", "ok thanks", "Do you have Berserk vol 42?"]
    for text in texts:
        folded = TurnText.of(text).said.folded
        assert (rules.DRAFT_TRIGGERS.search(folded) is None) == (reference.search(folded) is None)


def test_any_of_rejects_no_strings_and_empty_ones() -> None:
    with pytest.raises(ValueError, match="one string or more"):
        rules.any_of([])
    with pytest.raises(ValueError, match="none of them empty"):
        rules.any_of(["a", ""])
