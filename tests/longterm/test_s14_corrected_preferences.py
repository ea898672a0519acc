"""A corrected preference supersedes the old one (ARCHITECTURE: "a changed fact supersedes the
old one"): the correction forms seed 000's users write ("Actually, call me Kenji", "No, call
me Kenji, not Ken", "I'm into seinen now, not shojo anymore", "Actually I prefer hardcover
now") through the service (user turns → auto-detection → ``longterm.list`` / ``recall``),
and the detector's drafts for them, in English and Japanese.

Before session 14 the old value stayed current in every English case and the Japanese
opinion and format cases; 「いや、ケンジと呼んで」 and the prose guard passed then too.
"""

from __future__ import annotations

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm import _detect_rules as rules
from tiermem.longterm.detect import RuleMemoryDetector, detect_memories
from tiermem.models import MemoryRecord
from tiermem.policies.turn_text import TurnText
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


def _service() -> MemoryService:
    return MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )


async def _current_after(*turns: str) -> tuple[MemoryService, list[MemoryRecord]]:
    """A service (open) whose user "u" said ``turns``, detection drained, and the user's
    current memories."""
    service = _service()
    await service.__aenter__()
    session = await service.session("s1", user_id="u")
    for text in turns:
        await session.add_turn("user", text)
    await service.drain()
    return service, await service.longterm.list("u")


SUPERSEDED: list[tuple[tuple[str, str], str, str, str]] = [
    # (turns, preference key, current content, the content it replaced)
    (("Call me Ken.", "Actually, call me Kenji."),
     "addressed_as", "wants to be called Kenji", "wants to be called Ken"),
    (("Call me Ken.", "No, call me Kenji, not Ken."),
     "addressed_as", "wants to be called Kenji", "wants to be called Ken"),
    (("Call me Ken.", "Sorry, call me Kenji not Ken"),
     "addressed_as", "wants to be called Kenji", "wants to be called Ken"),
    (("Call me Ken.", "Wait, call me Kenji from now on."),
     "addressed_as", "wants to be called Kenji", "wants to be called Ken"),
    (("I love shojo.", "Actually I'm into seinen now, not shojo anymore."),
     "opinion:genre:shojo", "dislikes shojo", "loves shojo"),
    (("I like Frieren.", "I love Chainsaw Man, not Frieren."),
     "opinion:frieren", "dislikes Frieren", "likes Frieren"),
    (("I prefer paperback.", "Actually I prefer hardcover now."),
     "favorite_format", "prefers hardcover", "prefers paperback"),
    (("I prefer ebooks.", "I prefer paperback copies instead."),
     "favorite_format", "prefers paperback copies", "prefers ebooks"),
    (("I prefer first editions.", "I prefer collector's editions"),
     "favorite_edition", "prefers collector's editions", "prefers first editions"),
    (("My preferred format is digital.", "I prefer paperback now, not ebooks"),
     "favorite_format", "prefers paperback", "favorite format: digital"),
    (("I prefer tankobon.", "Actually, my preferred edition is kanzenban."),
     "favorite_edition", "favorite edition: kanzenban", "prefers tankobon"),
    (("ホラーが大好き", "ホラーじゃなくてセイネンが好き"),
     "opinion:genre:horror", "dislikes ホラー", "loves ホラー"),
    (("電子書籍のほうが好き", "紙の本のほうがいい"),
     "favorite_format", "prefers 紙の本", "prefers 電子書籍"),
    (("ケンと呼んで", "いや、ケンジと呼んでください"),
     "addressed_as", "wants to be called ケンジ", "wants to be called ケン"),
]  # fmt: skip


@pytest.mark.parametrize(("turns", "key", "current", "replaced"), SUPERSEDED)
async def test_a_corrected_preference_supersedes_the_old_one(
    turns: tuple[str, str], key: str, current: str, replaced: str
) -> None:
    service, memories = await _current_after(*turns)
    try:
        contents = [m.content for m in memories]
        assert current in contents
        assert replaced not in contents, f"{replaced!r} is still current: {contents}"
        slot = await service.longterm.get_preference("u", key)
        assert slot is not None
        assert slot.content == current
        # The old value is kept, in the key's history, with where it was said.
        (old,) = await service.longterm.preference_history("u", key)
        assert old.content == replaced
        assert old.invalid_from is not None
        assert old.provenance.session_id == "s1"
        assert old.provenance.turn_indexes == (0,)
        assert slot.provenance.turn_indexes == (1,)
    finally:
        await service.__aexit__(None, None, None)


async def test_the_reviewers_turns_leave_one_current_value_per_thing() -> None:
    # /tmp/rv/p11.py of the session-14 review, as a test.
    service, memories = await _current_after(
        "I love shojo.",
        "Actually I'm into seinen now, not shojo anymore.",
        "Call me Ken.",
        "Sorry, call me Kenji, not Ken.",
    )
    try:
        assert sorted(m.content for m in memories) == [
            "dislikes shojo",
            "likes seinen",
            "prefers seinen",  # favorite_genre, since session 15 (a choice between genres)
            "wants to be called Kenji",
        ]
        hits = await service.longterm.recall("u", "shojo", k=5)
        assert [h.text for h in hits if "shojo" in h.text] == ["dislikes shojo"]
        context = await service.longterm.build_user_context(
            "u", "what should I read?", budget_tokens=200
        )
        lines = [line.split("  [")[0] for line in context.text.splitlines()]
        assert "- wants to be called Kenji" in lines
        assert "- dislikes shojo" in lines
        assert "- wants to be called Ken" not in lines
        assert "- loves shojo" not in lines
    finally:
        await service.__aexit__(None, None, None)


async def test_not_x_alone_does_not_create_a_positive_x_and_prose_is_not_a_value() -> None:
    service, memories = await _current_after(
        "I love Berserk because it's not boring.",
        "I love Vagabond, not gonna lie.",
        "I love seinen, not just shojo.",
    )
    try:
        assert sorted(m.content for m in memories) == [
            "loves Berserk",
            "loves Vagabond",
            "loves seinen",
        ]
    finally:
        await service.__aexit__(None, None, None)


Draft = tuple[str, str | None, str | None]
"""(reason, key, value) of a draft."""

DRAFTS: list[tuple[str, list[Draft]]] = [
    # correction openings before "call me"
    ("Actually, call me Kenji.", [("addressed_as", "addressed_as", "Kenji")]),
    ("No, call me Kenji, not Ken.", [("addressed_as", "addressed_as", "Kenji")]),
    ("Oh, call me Kenji instead", [("addressed_as", "addressed_as", "Kenji")]),
    ("Make that: call me Kenji", [("addressed_as", "addressed_as", "Kenji")]),
    ("My name is Kenji not Ken", [("name", "name", "Kenji")]),
    # a value replaced next to a liked one becomes a dislike; the liked one is as before,
    # and (session 15) is the favourite of the category both values share
    ("I love seinen but not shojo", [
        ("like", "opinion:genre:seinen", "loves"),
        ("contrast", "favorite_genre", "seinen"),
        ("contrast", "opinion:genre:shojo", "dislikes")]),
    ("I'm a fan of seinen, no longer shojo", [
        ("like", "opinion:genre:seinen", "likes"),
        ("contrast", "favorite_genre", "seinen"),
        ("contrast", "opinion:genre:shojo", "dislikes")]),
    ("I enjoy ebooks instead of paperbacks", [
        ("like", "opinion:format:digital", "likes"),
        ("contrast", "favorite_format", "ebooks"),
        ("contrast", "opinion:format:paperback", "dislikes")]),
    ("ホラーじゃなくてセイネンが好き", [
        ("like", "opinion:genre:seinen", "likes"),
        ("contrast", "favorite_genre", "セイネン"),
        ("contrast", "opinion:genre:horror", "dislikes")]),
    # next to a favourite or a preference, "not X" says X is not the favourite: the key
    # replaces it, and nothing says X is disliked
    ("I prefer hardcover instead of paperback", [("prefer", "favorite_format", "hardcover")]),
    ("Actually, my favorite genre is romance, not shojo.", [
        ("favorite", "favorite_genre", "romance")]),
    ("少年じゃなくて青年のほうが好き", [("prefer", "favorite_genre", "青年")]),
    ("好きなジャンルはホラーじゃなくてセイネンです", [
        ("favorite", "favorite_genre", "セイネン")]),
    # comparisons replace nothing
    ("I prefer seinen over shojo", [("prefer", "favorite_genre", "seinen")]),
    ("少年より青年のほうが好き", [("prefer", "favorite_genre", "青年")]),
    # formats and editions are categories, for "prefer" and for opinions alike
    ("I prefer the hardcover edition", [("prefer", "favorite_format", "the hardcover edition")]),
    ("I prefer kanzenban", [("prefer", "favorite_edition", "kanzenban")]),
    ("I love paperbacks", [("like", "opinion:format:paperback", "loves")]),
    ("I'd prefer the Japanese edition", [
        ("prefer", "preferred_language", "the Japanese edition")]),
    ("my favorite format is paperback", [("favorite", "favorite_format", "paperback")]),
    # what stays as it was
    ("I love Berserk because it's not boring", [("like", "opinion:berserk", "loves")]),
    ("I love seinen, not just shojo", [("like", "opinion:genre:seinen", "loves")]),
    ("I'm not into seinen, not shojo", [("dislike", "opinion:genre:seinen", "dislikes")]),
    ("ケンじゃなくてケンジと呼んでください", [("addressed_as", "addressed_as", "ケンジ")]),
    ("3巻じゃなくて4巻です", [("correction", None, None)]),
    ("No, I meant volume 3, not 4", [("correction", None, None)]),
    ("Actually, call me back", []),
    ("no, don't call me Ken", []),
    ("I prefer not to get spoilers", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), DRAFTS)
def test_correction_drafts(text: str, expected: list[Draft]) -> None:
    assert [(d.reason, d.key, d.value) for d in detect_memories(text)] == expected


@pytest.mark.parametrize(
    "text", [t for t, _ in DRAFTS] + [t for pair, *_ in SUPERSEDED for t in pair]
)
def test_the_trigger_gate_changes_nothing_on_corrections(text: str) -> None:
    detector = RuleMemoryDetector()
    assert rules.DRAFT_TRIGGERS.search(TurnText.of(text).said.folded) or not detector.detect(text)
    assert detector.detect(text) == detector._sentences(TurnText.of(text).said)
