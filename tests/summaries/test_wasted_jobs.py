"""Background summary jobs are not wasted (issue #8): turns appended while a session's pass
runs are judged against the watermark that pass leaves, so they do not queue a job that
only reads the turns and finds no pass due; and when they do make a pass due, it runs.

An embedded service (in-process hot tier, real SQLite file as the durable tier) with the
default trigger. Not timed: the tests count the jobs and their outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.summaries import SummaryPolicy
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.tokens import TiktokenCounter

EVERY = SummaryPolicy().base_compression().every_turns


def message(i: int) -> str:
    return (
        f"Turn {i}: my code for item {i} is CODE-{i:04d}, and I'd like vol {i % 40 + 1} "
        "of Berserk delivered to Osaka by 2026-03-14."
    )


def role(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


def settings(tmp_path: Path) -> TierMemSettings:
    return TierMemSettings(
        hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "t.db"
    )


class Chatty:
    """The offline summarizer, appending one more turn to the session (through its public
    API) each time a pass asks it for a tier: the user writing while the pass runs, at
    a chosen point (the real engine finishes too fast on a quiet loop to be caught at
    one). What it returns is the real engine's."""

    name = "extractive"
    verbatim = True

    def __init__(self, per_call: int = 1) -> None:
        self.inner = ExtractiveSummarizer(TiktokenCounter())
        self.session: Session | None = None
        self.per_call = per_call
        self.added = 0
        self.budget = 0

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        for _ in range(self.per_call):
            if self.session is None or self.added >= self.budget:
                break
            i = (await self.session.history())[-1].index + 1
            await self.session.add_turn(role(i), message(i))
            self.added += 1
        return await self.inner.summarize(
            turns, prior=prior, target_tokens=target_tokens, must_keep=must_keep
        )


async def test_turns_during_a_pass_queue_no_job_that_finds_nothing_due(tmp_path: Path) -> None:
    engine = Chatty()
    async with MemoryService.from_settings(settings(tmp_path), summarizer=engine) as memory:
        session = await memory.session(user_id="u-1")
        engine.session, engine.budget = session, 100
        written = 200
        for i in range(written):
            await session.add_turn(role(i), message(i))
            # A request boundary, as a server's: the background passes run as turns come
            # (add_turn itself does not yield to the loop when nothing makes it wait).
            await asyncio.sleep(0)
        await memory.drain()
        stats = memory.summaries.stats
        turns = written + engine.added
        assert engine.added >= 20  # turns did arrive during passes
        assert stats.failures == 0
        # The first turn's job reads the unknown session and finds nothing due; every
        # other job commits a pass (before, the turns that arrived during a pass queued
        # jobs that read the turns and found nothing due).
        assert stats.not_due <= 1, stats.snapshot()
        assert stats.jobs == stats.committed + stats.not_due
        # What arrived during the last passes was judged, not dropped: no pass is due.
        summaries = await session.summaries()
        last = (await session.history())[-1].index
        assert last == turns - 1
        assert last - summaries.watermarks.summarized_through < summaries.compression.every_turns


async def test_turns_during_a_pass_that_make_one_due_run_it(tmp_path: Path) -> None:
    """A pass that finds a whole trigger's worth of turns arrived while it ran runs the
    next pass in the same job."""
    engine = Chatty(per_call=EVERY + 10)
    async with MemoryService.from_settings(settings(tmp_path), summarizer=engine) as memory:
        session = await memory.session(user_id="u-1")
        for i in range(EVERY):
            await session.add_turn(role(i), message(i))
        await memory.drain()
        first = (await session.summaries()).watermarks.summarized_through
        # The next pass's engine writes more than a trigger's worth of turns at once.
        engine.session, engine.budget = session, EVERY + 10
        i = EVERY
        while engine.added == 0:
            await session.add_turn(role(i), message(i))
            await memory.drain()
            i += 1
        stats = memory.summaries.stats
        after = await session.summaries()
        last = (await session.history())[-1].index
        assert engine.added == EVERY + 10
        assert stats.failures == 0
        assert stats.not_due <= 1, stats.snapshot()
        assert stats.committed == 3  # the first, the one the engine wrote in, the one after
        assert after.watermarks.summarized_through > first
        assert last - after.watermarks.summarized_through < after.compression.every_turns
