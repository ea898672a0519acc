"""Review of session 16 (R2): the handoff's guard trusts ``metadata["stated_at"]`` only on
a value a handoff wrote.

cd0f7de compares when a slot's value was said with when the handoff's value was; for that
it reads ``metadata["stated_at"]`` of any current value. An application's own
``upsert_preference(..., metadata={"stated_at": ...})`` -- a name an application may well
use -- was read too: a date without a time zone ("2030-01-01") made every later handoff of
that key raise TypeError (naive against aware datetimes: the preference was not handed off,
nor the summary written), and any other time made the guard compare with the
application's, not with when the value was set. Now only a value whose provenance is a
handoff's is dated by it; any other by when it was written. Both cases fail on 5d94d0d."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.summaries.test_s15_reopen_after_close import deployment
from tests.summaries.test_s16_late_handoff_newer_value import genre


@pytest.mark.parametrize("stated", ["2030-01-01", "2001-01-01T00:00:00+00:00"])
async def test_an_applications_stated_at_does_not_steer_the_handoff(
    stated: str, tmp_path: Path
) -> None:
    async with deployment("memory+memory", tmp_path) as (memory, clock):
        user = "u-app-stated"
        await memory.longterm.upsert_preference(
            user, "favorite_genre", "romance", metadata={"stated_at": stated}
        )
        clock.advance(timedelta(minutes=5))
        session = await memory.session("s-later", user_id=user)
        await session.add_turn("user", "My favourite genre is horror.")
        await session.add_turn("assistant", "Noted: horror.")
        await memory.drain()
        # Auto-detection set it in the session; the application sets it again after.
        clock.advance(timedelta(minutes=5))
        await memory.longterm.upsert_preference(
            user, "favorite_genre", "romance", metadata={"stated_at": stated}
        )
        clock.advance(timedelta(minutes=5))
        await session.close()
        await memory.drain()
        assert memory.handoff.failures == 0
        # Set after the session stated horror: it stands (its own metadata says nothing
        # about when).
        assert await genre(memory, user) == "romance"
