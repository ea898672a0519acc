"""Closing a session runs a final summary pass through its last turn before the handoff
reads the records, so the turns after the last triggered pass still become summary lines
and are recalled after the raw turns' 24 h retention; a retried handoff adds nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

T0 = datetime(2030, 1, 7, 10, tzinfo=UTC)
FACT = "My address is 2-3 Kita, Sapporo 060-0001."


async def test_the_last_turns_are_summarized_at_close_and_recalled_after_expiry() -> None:
    clock = FakeClock(T0)
    memory = MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, auto_detect=False
    )
    try:
        session = await memory.session("s-final", user_id="u-final")
        await session.add_turn("user", "Hi, I'm looking for some manga gifts.")
        await session.add_turn("assistant", "Happy to help!")
        said = await session.add_turn("user", FACT)  # the last turns: far below a trigger
        last = await session.add_turn("assistant", "Got it.")
        await memory.drain()
        assert (await memory.summaries.read(session.id)).watermarks.summarized_through < 0

        await session.close()
        summaries = await memory.summaries.read(session.id)
        assert summaries.watermarks.summarized_through == last.index
        assert FACT in summaries.text
        passes = summaries.watermarks.passes
        handed = await memory.longterm.list("u-final", types=["interaction_summary"])
        assert len(handed) == 1

        # A retried handoff (the sweeper finding the closed session) adds nothing.
        view = await memory.tiers.durable_view(session.id)
        assert view is not None
        await memory.handoff(view)
        assert (await memory.summaries.read(session.id)).watermarks.passes == passes
        assert await memory.longterm.list("u-final", types=["interaction_summary"]) == handed

        clock.advance(timedelta(days=3))  # past the turns' 24 h, within the records' 30 days
        assert await memory.tiers.durable.get_turns(session.id, 0, last.index + 1) == []
        later = await memory.session("s-later", user_id="u-final")
        question = "What was my delivery address again?"
        await later.add_turn("user", question)
        await memory.drain()
        window = await later.context(query=question, budget=2048)
        lines = [
            i
            for i in window.items
            if i.kind == "recall"
            and i.provenance.session_id == session.id
            and (i.provenance.summary_id or "").startswith(f"{session.id}:summary:v")
        ]
        assert [i.provenance.turn_indexes for i in lines] == [(said.index,)]
        assert "Sapporo" in lines[0].text
    finally:
        await memory.aclose()
