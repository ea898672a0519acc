"""The roll-up counts a reopened session once: its second handoff's summary replaced the
first (superseded it, or was remembered beside it when the first was already rolled up),
and the week's digest is built from the newest one only. Needs /tmp/s15/h7/rollup.patch
(src/tiermem/summaries/rollup.py); fails without it ("(2 sessions)", the first summary's
line twice)."""

from __future__ import annotations

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries.rollup import RollupPolicy


async def test_a_reopened_session_is_one_session_of_its_week() -> None:
    clock = FakeClock()
    # A small individual budget: each session summary rolls into its week at once.
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        rollup_policy=RollupPolicy(individual_tokens=16, weekly_tokens=1000),
    )
    try:
        session = await memory.session("s-week", user_id="u-week")
        await session.add_turn("user", "I prefer seinen")
        await session.close()
        await session.add_turn("user", "Also, I prefer hardcover editions.")
        await session.close()
        await memory.drain()
        text = (await memory.rollup.history("u-week")).text
        assert "(1 session)" in text
        assert text.count("I prefer seinen") == 1
        assert "hardcover" in text
    finally:
        await memory.aclose()
