"""Session 16 (H2): a hedged dislike never ends a favourite by itself.

"I probably don't like horror", "maybe I don't like horror anymore", 「たぶんホラーは苦手かも」
drafted ``opinion:genre:horror = dislikes`` as a plain dislike does, which ends a favourite
horror (and replaces a like of horror: one opinion key). Now a dislike with a hedge in its
clause drafts nothing (docs/memory-detection.md says why: nothing rather than a dislike
that keeps the favourite). The hedged cases fail on fc45edb; the plain dislikes, "kind of"
(a softener, not a doubt), "I think" / "I guess" (an opinion, as a dislike is) and a hedged
favourite (kept since 86e9023) pass on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.summaries.test_s15_redact_ended_favourite import deployment
from tiermem.longterm.detect import detect_memories

HEDGED = [
    "I probably don't like horror.",
    "Maybe I don't like horror anymore.",
    "I maybe don't like horror.",
    "Perhaps I dislike horror.",
    "I don't like horror, maybe.",
    "I possibly hate horror now.",
    "I'm probably not a fan of horror.",
    "たぶんホラーは苦手かも",
    "多分ホラーは嫌い",
    "ホラーは苦手かもしれない",
    "おそらくホラーは好きじゃない",
]
PLAIN = [
    ("I don't like horror.", "dislikes"),
    ("I hate horror now.", "hates"),
    ("I kind of hate horror.", "hates"),
    ("I think I hate horror now.", "hates"),
    ("I guess I don't like horror.", "dislikes"),
    ("I'm not a fan of horror.", "dislikes"),
    ("ホラーは苦手です", "dislikes"),
    ("ホラーは嫌い", "dislikes"),
]


@pytest.mark.parametrize("text", HEDGED)
def test_a_hedged_dislike_drafts_nothing(text: str) -> None:
    assert detect_memories(text) == ()


@pytest.mark.parametrize(("text", "value"), PLAIN)
def test_a_plain_dislike_still_counts(text: str, value: str) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == [("opinion:genre:horror", value)]


def test_a_hedged_favourite_is_still_kept() -> None:
    drafts = detect_memories("My favorite language is probably python.")
    assert [(d.key, d.value) for d in drafts] == [("preferred_language", "python")]


@pytest.mark.parametrize(
    "hedged",
    ["I probably don't like horror.", "たぶんホラーは苦手かも", "Maybe I hate horror now."],
)
@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_a_hedged_dislike_keeps_the_favourite_and_the_like(
    name: str, hedged: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(["My favorite genre is horror.", "I love horror.", hedged])
        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == "horror"
        opinion = await d.memory.longterm.get_preference(d.user, "opinion:genre:horror")
        assert opinion is not None
        assert opinion.metadata["preference_value"] == "loves"
        # A plain dislike after it still ends the favourite.
        await d.say(["I don't like horror anymore."])
        assert await d.favourite() is None
        ended = await d.favourite(include_retired=True)
        assert ended is not None
        assert ended.metadata["preference_value"] == "horror"
