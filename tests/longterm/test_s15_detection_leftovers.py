"""Detection leftovers of session 15's review (H11), through the public API.

Since eab43be a detected dislike ends the favourite of its value, so a false dislike costs
the user their favourite, and a false like or favourite replaces it:

1. A purpose naming someone else ("..., for my daughter", 「娘に」「息子のために」) is their
   taste or a gift: no preference draft.
2. A Japanese sentence whose topic is someone else (「妹はホラーが苦手」) is their taste: no
   draft (it wrote the garbled key ``opinion:妹はホラー``).
3. Hedges ("probably", "maybe", 「たぶん」) are not part of a value: dropped, the value kept.
4. A like after a contrastive break takes back the dislike before it (「ホラーは苦手だけど
   好き」, "I don't like horror but I love it"): the like wins.
5. "I don't like horror as much as thrillers" ranks, it does not reject: no draft.

Every case in the ``*_FIXED`` tables fails on 87b1a17 (the code before this change); the
ordinary forms in ``STILL`` passed before and still do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.detect import detect_memories
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

NOT_THE_USERS = (
    # 1. a purpose naming someone else
    "I'm into seinen, not shojo, for my daughter.",
    "I love horror for my wife.",
    "I prefer seinen for my son.",
    "I like horror manga for my best friend.",
    "I don't like horror for my kids.",
    "My favorite genre for my son is shonen.",
    "I love seinen as a present.",
    "娘にセイネンが好き",
    "息子のためにセイネンが好き",
    # 2. someone else as the topic
    "妹はホラーが苦手",
    "妹はホラーが苦手です。",
    "母はセイネンが好き",
    "友達はホラーが嫌い",
    "姉はホラーが好きじゃない",
    "お母さんはホラーが苦手",
    "ホラーは弟が苦手",
    "娘の好きなジャンルはショウジョです",
    "夫はセイネンのほうが好き",
    # 5. a comparison, not a dislike
    "I don't like horror as much as thrillers.",
    "I don't like horror as much as I like thrillers.",
    "I don't really enjoy romance as much anymore.",
)


@pytest.mark.parametrize("text", NOT_THE_USERS)
def test_someone_elses_taste_or_a_comparison_drafts_no_preference(text: str) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == []


HEDGED_FIXED = (
    ("my favorite language is probably python", "preferred_language", "python"),
    ("My favorite genre is maybe seinen.", "favorite_genre", "seinen"),
    ("My favourite author is perhaps Urasawa.", "favorite_author", "Urasawa"),
    ("my favorite genre is seinen probably", "favorite_genre", "seinen"),
    ("my favorite genre is seinen I think", "favorite_genre", "seinen"),
    ("I probably prefer seinen.", "favorite_genre", "seinen"),
    ("I like maybe horror.", "opinion:genre:horror", "likes"),
    ("好きなジャンルはたぶんセイネンです", "favorite_genre", "セイネン"),
    ("好きなジャンルはセイネンかもしれません", "favorite_genre", "セイネン"),
    ("多分ホラーが好き", "opinion:genre:horror", "likes"),
)


@pytest.mark.parametrize(("text", "key", "value"), HEDGED_FIXED)
def test_a_hedge_is_not_part_of_the_value(text: str, key: str, value: str) -> None:
    """Kept, not dropped: the hedge says how sure the user is, and a tentative favourite
    is still the best answer to "what do I like?" (a later statement replaces it)."""
    assert [(d.key, d.value) for d in detect_memories(text)] == [(key, value)]


TAKEN_BACK_FIXED = (
    ("ホラーは苦手だけど好き", "likes"),
    ("ホラーは苦手だけど好きです。", "likes"),
    ("ホラーは苦手だけど、やっぱり大好き", "loves"),
    ("ホラーは苦手ですが好きです", "likes"),
    ("I don't like horror but I love it.", "loves"),
    ("I hate horror, but I still like it.", "likes"),
)


@pytest.mark.parametrize(("text", "value"), TAKEN_BACK_FIXED)
def test_a_like_after_but_takes_back_the_dislike(text: str, value: str) -> None:
    drafts = detect_memories(text)
    assert [(d.key, d.value, d.reason) for d in drafts] == [("opinion:genre:horror", value, "like")]
    assert drafts[0].content.startswith(f"{value} ")


STILL = (
    # The ordinary forms (passed before too).
    ("I don't like horror.", [("opinion:genre:horror", "dislikes")]),
    ("ホラーは苦手", [("opinion:genre:horror", "dislikes")]),
    ("ホラーは苦手です。", [("opinion:genre:horror", "dislikes")]),
    ("my favorite language is python", [("preferred_language", "python")]),
    ("I hate horror.", [("opinion:genre:horror", "hates")]),
    ("ホラーが好き", [("opinion:genre:horror", "likes")]),
    ("私はホラーが苦手", [("opinion:genre:horror", "dislikes")]),
    ("I kind of like horror.", [("opinion:genre:horror", "likes")]),
    ("I think I prefer seinen.", [("favorite_genre", "seinen")]),
    ("I'm shopping for my son. I love horror.", [("opinion:genre:horror", "loves")]),
    (
        "I'm into seinen, not shojo.",
        [
            ("opinion:genre:seinen", "likes"),
            ("favorite_genre", "seinen"),
            ("opinion:genre:shojo", "dislikes"),
        ],
    ),
    # Two statements of their own: a like with its own object does not take back the
    # dislike of another thing, and "and" is no contrast.
    (
        "ホラーは苦手だけど、セイネンが好き",
        [("opinion:genre:horror", "dislikes"), ("opinion:genre:seinen", "likes")],
    ),
    (
        "I don't like horror but I love seinen.",
        [("opinion:genre:horror", "dislikes"), ("opinion:genre:seinen", "loves")],
    ),
    ("I don't like horror and I love it.", [("opinion:genre:horror", "dislikes")]),
    ("I don't like horror much.", [("opinion:genre:horror", "dislikes")]),
)


@pytest.mark.parametrize(("text", "expected"), STILL)
def test_the_ordinary_forms_still_count(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == expected


# ------------------------------------------------------------------ the service path


@pytest.fixture
async def service() -> AsyncIterator[MemoryService]:
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with service:
        yield service


async def _say(service: MemoryService, session_id: str, *turns: str) -> None:
    session = await service.session(session_id, user_id="u")
    for text in turns:
        await session.add_turn("user", text)
    await service.drain()


async def _value(service: MemoryService, key: str) -> str | None:
    record = await service.longterm.get_preference("u", key)
    return None if record is None else str(record.metadata["preference_value"])


async def test_a_gift_for_a_daughter_keeps_the_users_favourite(service: MemoryService) -> None:
    await _say(service, "s1", "I prefer shojo.")
    await _say(service, "s2", "I'm into seinen, not shojo, for my daughter.")
    assert await _value(service, "favorite_genre") == "shojo"
    assert await service.longterm.get_preference("u", "opinion:genre:shojo") is None


async def test_a_like_after_but_keeps_the_favourite_a_dislike_would_end(
    service: MemoryService,
) -> None:
    await _say(service, "s1", "I prefer horror.")
    await _say(service, "s2", "ホラーは苦手だけど好き")
    assert await _value(service, "favorite_genre") == "horror"
    assert await _value(service, "opinion:genre:horror") == "likes"


async def test_a_sisters_dislike_writes_nothing_and_a_hedged_favourite_is_the_value(
    service: MemoryService,
) -> None:
    await _say(service, "s1", "妹はホラーが苦手です。", "my favorite language is probably python")
    contents = [m.content for m in await service.longterm.list("u")]
    assert not any("妹" in c for c in contents), contents
    assert await _value(service, "preferred_language") == "python"
