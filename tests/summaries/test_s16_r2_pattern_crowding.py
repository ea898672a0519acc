"""Review of session 16 (R2): observed patterns do not crowd the roll-up's summaries out.

cd9a458 reads the patterns in the roll-up's one list call (newest first, ``MAX_RECORDS``).
Every session that brings a pattern's topic up supersedes it, and superseded versions
stay for the type's 30 days, so a user with a few recurring topics has several pattern
versions per session, all newer than the older summaries. Once the two together passed
the limit, the oldest summaries were no longer read: the roll-up planned digests and
counted patterns without them, and forgot (then wrote again) every pattern citing one,
on every roll-up. Now, when the list is full, the summaries are read on their own (one
more call, for such users only). Fails on 5d94d0d (the repeat roll-up wrote again)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiermem.clock import FakeClock
from tiermem.composition import catalogue_engines
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import rollup
from tiermem.summaries.patterns import PATTERN_KEY

START = datetime(2030, 1, 1, 9, tzinfo=UTC)
USER = "u-crowd"


async def test_a_full_list_still_reads_every_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollup, "MAX_RECORDS", 16)  # 2,000 in production
    clock = FakeClock(START)
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        **dict(catalogue_engines({"Berserk": "Berserk", "Vagabond": "Vagabond"})),
    )
    try:
        for at in range(7):
            session = await memory.session(f"s-{at}", user_id=USER)
            await session.add_turn(
                "user", "Is Berserk or Vagabond out yet?", intent="release_dates"
            )
            await session.add_turn("assistant", "Both next week.")
            await session.close()
            await memory.drain()
            if at < 6:  # no day passes after the last (a week's digest would be due)
                clock.advance(timedelta(days=1))
        assert memory.handoff.failures == 0
        listed = await memory.longterm.list(
            USER,
            types=["interaction_summary", "behavioral_pattern"],
            include_superseded=True,
            limit=100,
        )
        assert len(listed) > rollup.MAX_RECORDS  # the list is full: the case under test
        assert await memory.roll_up(USER) == 0  # nothing new: nothing written
        current = await memory.longterm.list(USER, types=["behavioral_pattern"], limit=100)
        texts = sorted(r.content for r in current if PATTERN_KEY in r.metadata)
        assert len(texts) == 2  # Vagabond (the session's series) and the intent
        assert all("(7 sessions from 2030-01-01 to 2030-01-07)" in t for t in texts)
    finally:
        await memory.aclose()
