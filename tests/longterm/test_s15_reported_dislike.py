"""Review of session 15 (R2): a dislike the user denies or quotes is not their taste.

Since eab43be a detected dislike of the favourite's value ends the favourite. The dislike
rules read any "I don't like X" / "I hate X" in a sentence, so a user correcting the
assistant ("You said I don't like horror, but that's wrong") ended the very favourite they
were defending; in Japanese a relative clause (「ホラーが苦手な友達にプレゼントしたい」, "a
gift for a friend who dislikes horror") or a past state (「ホラーが苦手だった」) did the same.
Every case below fails on 9c40a30.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.detect import detect_memories
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

DENIED = (
    "You said I don't like horror, but that's wrong.",
    "I never said I hate horror.",
    "I never said I don't like horror!",
    "I wouldn't say I don't like horror.",
    "You seem to think I hate horror.",
    "Someone told you I don't like horror, but I love it.",
    "ホラーが苦手な友達にプレゼントしたい",
    "ホラーが苦手だった",
)


@pytest.mark.parametrize("text", DENIED)
def test_a_denied_or_quoted_dislike_is_no_dislike(text: str) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == []


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("I said I don't like horror.", "dislikes"),
        ("I'd say I hate horror now.", "hates"),
        ("I think I don't like horror anymore.", "dislikes"),
        ("Honestly, I hate horror now.", "hates"),
        ("ホラーは苦手なんです", "dislikes"),
        ("ホラーが苦手なので別のを", "dislikes"),
        ("ホラーは苦手になった", "dislikes"),
    ],
)
def test_the_users_own_dislike_still_counts(text: str, value: str) -> None:
    # Passed before too: the gate leaves the user's own statements alone.
    assert [(d.key, d.value) for d in detect_memories(text)] == [("opinion:genre:horror", value)]


@pytest.fixture
async def service() -> AsyncIterator[MemoryService]:
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with service:
        yield service


@pytest.mark.parametrize("text", DENIED)
async def test_a_denied_dislike_leaves_the_favourite(service: MemoryService, text: str) -> None:
    session = await service.session("s1", user_id="u")
    await session.add_turn("user", "My favorite genre is horror.")
    await session.add_turn("assistant", "Noted!")
    await session.add_turn("user", text)
    await service.drain()
    favourite = await service.longterm.get_preference("u", "favorite_genre")
    assert favourite is not None
    assert favourite.metadata["preference_value"] == "horror"
    assert [m.content for m in await service.longterm.list("u")] == [favourite.content]


# ----------------------------------- "not much" is a dislike of the thing, not of "X much"


@pytest.mark.parametrize(
    "text",
    [
        "I don't like horror much but love thrillers.",
        "I don't like horror that much.",
        "I don't like horror at all.",
    ],
)
def test_a_degree_word_is_not_part_of_the_disliked_thing(text: str) -> None:
    # Before: opinion:horror_much = "dislikes horror much", a key of its own.
    assert [(d.key, d.value, d.content) for d in detect_memories(text)] == [
        ("opinion:genre:horror", "dislikes", "dislikes horror")
    ]


async def test_loving_it_later_replaces_a_dislike_said_with_much(service: MemoryService) -> None:
    # Before, "dislikes horror much" stayed current next to "loves horror".
    session = await service.session("s1", user_id="u")
    await session.add_turn("user", "I don't like horror much.")
    await session.add_turn("user", "Actually I love horror now.")
    await service.drain()
    assert [m.content for m in await service.longterm.list("u")] == ["loves horror"]
