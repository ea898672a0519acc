"""Session 16 (H2): one matcher of "this favourite is the disliked value", and an explicit
way for an application to end a favourite.

* Detection, the redaction replay of an ending and the handoff's check that an ending
  stands each had their own comparison; now they share
  :func:`tiermem.longterm.endings.dislike_ending`. It refused a favourite of several
  values only when the rules knew each of them ("seinen and josei"): "horror and
  thrillers" (thrillers is no known genre) has one opinion key of its own, and
  ``same_value`` keys on the first genre, so a dislike of horror ended it, live and when
  a redaction replayed the ending. Now any list ("and", "or", commas, slashes, 「と」「や」)
  is refused. The list cases fail on fc45edb.
* ``LongTermMemory.retire_preference``: "forget that I like horror". Validated at the edge,
  recorded in history with why, undone by setting it again or by forgetting the session it
  came from, replayed as an ending by a redaction, and a late handoff of an earlier
  statement does not bring it back. All fail on fc45edb (no such method).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.summaries.test_s15_redact_ended_favourite import KEY, deployment
from tiermem.errors import NotFoundError, ValidationError
from tiermem.models import Provenance

PAIRINGS = ["memory+memory", "memory+sqlite"]


@pytest.mark.parametrize(
    ("said", "ended"),
    [
        ("horror", True),
        ("Horror", True),
        ("ホラー", True),
        ("horror and thrillers", False),
        ("thrillers and horror", False),
        ("horror, thrillers", False),
        ("horror / thrillers", False),
        ("horror or thrillers", False),
        ("ホラーとスリラー", False),
        ("seinen and horror", False),
        ("comedy", False),
    ],
)
def test_the_matcher_of_a_dislike_of_horror(said: str, ended: bool) -> None:
    from tiermem.longterm.endings import dislike_ending  # new in session 16

    found = dislike_ending("opinion:genre:horror")
    assert found is not None
    key, matches = found
    assert key == KEY
    assert matches(said) is ended


def test_the_matcher_takes_the_value_in_other_words() -> None:
    from tiermem.longterm.endings import dislike_ending

    found = dislike_ending("opinion:language:japanese")
    assert found is not None
    assert found[0] == "preferred_language"
    assert found[1]("日本語")
    assert not found[1]("日本語と英語")
    assert dislike_ending("opinion:horror_and_thrillers") is None  # no known kind


@pytest.mark.parametrize(
    ("stated", "value"),
    [
        ("My favorite genres are horror and thrillers.", "horror and thrillers"),
        ("好きなジャンルはホラーとスリラーです", "ホラーとスリラー"),
    ],
)
@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_dislike_of_one_leaves_a_favourite_of_several(
    name: str, stated: str, value: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say([stated, "I don't like horror anymore."])
        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == value


@pytest.mark.parametrize("name", PAIRINGS)
async def test_the_redaction_replay_leaves_a_favourite_of_several(
    name: str, tmp_path: Path
) -> None:
    # The replay's behaviour changed: it ended "horror and thrillers" (set again by the
    # replay, then the ending of horror replayed over it); detection never would.
    async with deployment(name, tmp_path) as d:
        await d.say(
            [
                "My favorite genres are horror and thrillers.",
                "My favorite genre is horror.",
                "I don't like horror anymore.",
            ]
        )
        assert await d.values() == ["ended horror", "set horror", "set horror and thrillers"]
        await d.redact(1)
        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == "horror and thrillers"


# -- retire_preference ---------------------------------------------------------------------


@pytest.mark.parametrize("name", PAIRINGS)
async def test_retiring_a_favourite_ends_it_with_why(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        lt = d.memory.longterm
        await lt.upsert_preference(d.user, KEY, "horror")
        retired = await lt.retire_preference(d.user, "Favorite Genre", reason="asked to forget it")
        assert retired.invalid_from is not None
        assert retired.content == "no longer favorite_genre: horror (asked to forget it)"
        assert retired.metadata["retired_reason"] == "asked to forget it"
        assert retired.provenance.source == "explicit"
        assert await d.favourite() is None
        assert [p for p in await lt.preferences(d.user) if "horror" in p.content] == []
        history = await lt.preference_history(d.user, KEY)
        assert [h.content for h in history] == [retired.content, "favorite_genre: horror"]
        changes = await lt.changes(d.user, limit=100)
        assert any("retired: asked to forget it" in c.summary for c in changes)
        # Set again, it is current again; the ending stays in history.
        await lt.upsert_preference(d.user, KEY, "horror")
        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == "horror"
        assert retired.content in [h.content for h in await lt.preference_history(d.user, KEY)]


@pytest.mark.parametrize("name", PAIRINGS)
async def test_retiring_validates_at_the_edge(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        lt = d.memory.longterm
        with pytest.raises(ValidationError, match="user_id"):
            await lt.retire_preference("bad\nuser", KEY, reason="why")
        with pytest.raises(ValidationError, match="reason"):
            await lt.retire_preference(d.user, KEY, reason="  ")
        with pytest.raises(NotFoundError, match="has no preference 'favorite_genre'"):
            await lt.retire_preference(d.user, KEY, reason="why")
        await lt.upsert_preference(d.user, KEY, "horror")
        await lt.retire_preference(d.user, KEY, reason="why")
        with pytest.raises(NotFoundError, match="already ended"):
            await lt.retire_preference(d.user, KEY, reason="why")


@pytest.mark.parametrize("name", PAIRINGS)
async def test_forgetting_the_session_of_the_retirement_undoes_it(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        lt = d.memory.longterm
        await d.say(["My favorite genre is horror."])
        await lt.retire_preference(
            d.user,
            KEY,
            reason="the user asked to forget it",
            provenance=Provenance(source="explicit", session_id="s-support"),
        )
        assert await d.favourite() is None
        await lt.forget_session(d.user, "s-support")
        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == "horror"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_redaction_replays_an_explicit_ending(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(["My favorite genre is comedy.", "My favorite genre is horror."])
        await d.memory.longterm.retire_preference(d.user, KEY, reason="asked to forget it")
        await d.redact(0)
        assert await d.favourite() is None
        ended = await d.favourite(include_retired=True)
        assert ended is not None
        assert ended.metadata["preference_value"] == "horror"
        assert ended.metadata["retired_reason"] == "asked to forget it"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_late_handoff_does_not_bring_back_a_retired_favourite(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        session = await d.memory.session(d.sid, user_id=d.user)
        await session.add_turn("user", "My favorite genre is horror.")
        await d.memory.drain()
        d.memory.clock.advance(timedelta(minutes=5))  # type: ignore[attr-defined]
        await d.memory.longterm.retire_preference(d.user, KEY, reason="asked to forget it")
        d.memory.clock.advance(timedelta(minutes=5))  # type: ignore[attr-defined]
        await session.add_turn("user", "Is Berserk vol 3 in stock?")
        await session.close()
        await d.memory.drain()
        assert await d.favourite() is None


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_redaction_replays_an_ending_whose_dislike_was_forgotten(
    name: str, tmp_path: Path
) -> None:
    # A guard (passes on fc45edb too): the replay builds the dislike's stand-in from the
    # ending, and the one matcher from the opinion key the ending recorded.
    async with deployment(name, tmp_path) as d:
        await d.say(
            [
                "My favorite genre is comedy.",
                "My favorite genre is horror.",
                "I don't like horror anymore.",
            ]
        )
        ended = await d.favourite(include_retired=True)
        assert ended is not None
        dislike_id = str(ended.metadata["retired_by"])
        assert await d.memory.longterm.forget(d.user, dislike_id)
        await d.redact(0)
        assert await d.favourite() is None
        again = await d.favourite(include_retired=True)
        assert again is not None
        assert again.metadata["preference_value"] == "horror"
        assert again.metadata["retired_by"] == dislike_id
        assert again.content == "no longer favorite_genre: horror (dislikes horror)"
