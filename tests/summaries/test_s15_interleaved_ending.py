"""Review of session 15 (R2): a late handoff does not bring back a favourite a dislike
ended in another session.

9c40a30 kept a favourite ended when the session that ended it was handed off. Two open
sessions interleave (two devices): "I prefer horror" in s1, "I hate horror now" in s2
(the favourite ends), s1 goes on about something else and closes: its handoff wrote
``favorite_genre: horror`` back from its summary (s1 was active after the ending, so the
"set after the session ended" guard did not apply). Now an ending of the summary's very
value that came after the turn stating it stands (one archive read, in that case only).
Fails on 6ed6452. memory+memory, memory+sqlite, redis+dynamodb (with
the services)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.summaries.test_s15_reopen_after_close import deployment


@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite", "redis+dynamodb"])
async def test_closing_the_stating_session_late_keeps_the_favourite_ended(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as (memory, clock):
        user = "u-interleaved"
        first = await memory.session("s-first", user_id=user)
        await first.add_turn("user", "I prefer horror.")
        await first.add_turn("assistant", "Noted: horror.")
        await memory.drain()
        clock.advance(timedelta(minutes=5))
        second = await memory.session("s-second", user_id=user)
        await second.add_turn("user", "I hate horror now.")
        await memory.drain()
        assert await memory.longterm.get_preference(user, "favorite_genre") is None
        clock.advance(timedelta(minutes=5))
        await first.add_turn("user", "Anyway, is Berserk vol 3 in stock?")
        await first.add_turn("assistant", "Yes, it is.")
        await first.close()
        await second.close()
        await memory.drain()
        assert await memory.longterm.get_preference(user, "favorite_genre") is None
        ended = await memory.longterm.get_preference(user, "favorite_genre", include_retired=True)
        assert ended is not None
        assert ended.provenance.session_id == "s-second"
        assert "hates horror" in [m.content for m in await memory.longterm.list(user)]


@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_a_restatement_after_the_ending_still_sets_it_again(
    name: str, tmp_path: Path
) -> None:
    # Passed before too (the handoff wrote the summary's value back). Now detection sets
    # it live ("after all" is no longer part of the value): the summary still cites the
    # first statement, older than the ending, so the handoff alone would not.
    async with deployment(name, tmp_path) as (memory, clock):
        user = "u-restated"
        first = await memory.session("s-first", user_id=user)
        await first.add_turn("user", "I prefer horror.")
        await memory.drain()
        clock.advance(timedelta(minutes=5))
        second = await memory.session("s-second", user_id=user)
        await second.add_turn("user", "I hate horror now.")
        await memory.drain()
        clock.advance(timedelta(minutes=5))
        await first.add_turn("user", "Actually I do prefer horror after all.")
        await first.close()
        await second.close()
        await memory.drain()
        slot = await memory.longterm.get_preference(user, "favorite_genre")
        assert slot is not None
        assert slot.metadata["preference_value"] == "horror"
        assert slot.provenance.session_id == "s-first"
