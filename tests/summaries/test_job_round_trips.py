"""Durable round trips of the automatic summary jobs (issue #8), and their in-process caches
under several processes.

A pass decides and builds from what this process last read or wrote (records, the turns it
summarized), so in steady state it makes one archive read and its three compare-and-set
writes. The caches must never change what is committed: another process's pass or
redaction makes them stale, which costs a conflict and a fresh read. Two ``SummaryJobs``
over one durable store stand in for two processes (each has its own caches). In-memory
backends and a fake clock; the counting wrapper below counts calls at the durable store's
interface, the round trips a real backend would make.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

from tiermem.clock import FakeClock
from tiermem.models import JsonValue, SessionRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import DurableStore
from tiermem.summaries import (
    STRUCTURED_RECORD,
    SUMMARY_RECORD,
    JobOutcome,
    SummaryJobs,
    SummaryPolicy,
)
from tiermem.summaries import jobs as jobs_module
from tiermem.summaries.jobs import TURN_CACHE_AGE
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
STEADY = SummaryPolicy(min_preservation=0.0, recover_preservation=0.0)
"""Compression that never adapts, so the passes fall on the same turns in every run."""


class CountingDurable:
    """A durable store that counts the calls made through it (one per round trip)."""

    def __init__(self, inner: DurableStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args, **kwargs)

        return counted


def line(i: int) -> str:
    return f"My code for item {i} is CODE-{i:04d}. I'll take item {i} on Friday."


def service(clock: FakeClock, *, auto_summarize: bool = True) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
        auto_summarize=auto_summarize,
        summary_policy=STEADY,
    )


def jobs(durable: DurableStore, memory: MemoryService, clock: FakeClock) -> SummaryJobs:
    return SummaryJobs(
        durable,
        summarizer=ExtractiveSummarizer(COUNTER),
        extractor=RuleStructuredExtractor(),
        background=memory.background,
        clock=clock,
        tokens=COUNTER,
        policy=STEADY,
    )


async def test_a_steady_session_pass_makes_one_read_and_two_writes() -> None:
    """After a session's first pass in this process, each pass reads only the new turns
    (no record reads, no ``next_index``) and writes structured memory and the summary (with
    the watermarks in it): a regression in the jobs' round trips fails here."""
    clock = FakeClock()
    memory = service(clock)
    try:
        session = await memory.session("s-trips", user_id="u-1")
        for i in range(30):  # the first pass reads the records once
            await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
            await memory.drain()
        counting = CountingDurable(memory.summaries.durable)
        memory.summaries.durable = counting  # type: ignore[assignment]
        committed = memory.summaries.stats.committed
        turns = 140
        for i in range(30, 30 + turns):
            await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
            await memory.drain()
        passes = memory.summaries.stats.committed - committed
        assert passes >= 8
        assert memory.summaries.stats.failures == 0
        assert dict(counting.calls) == {"get_turns": passes, "put_record": 2 * passes}
        found = await session.summaries()
        assert found.watermarks.summarized_through >= 30 + turns - 1 - STEADY.every_turns
    finally:
        await memory.aclose()


async def test_turns_held_too_long_are_read_again() -> None:
    """The turns a pass keeps for the next one serve it only within ``TURN_CACHE_AGE`` of
    their read: a pass after a longer pause reads the earlier turns from the archive again
    (the archive's expiry, not the cache, decides what is summarized)."""
    clock = FakeClock()
    memory = service(clock)
    try:
        session = await memory.session("s-pause", user_id="u-1")
        i = 0

        async def until_a_pass() -> None:
            nonlocal i
            committed = memory.summaries.stats.committed
            while memory.summaries.stats.committed == committed:
                await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
                await memory.drain()
                i += 1

        for _ in range(3):
            await until_a_pass()
        counting = CountingDurable(memory.summaries.durable)
        memory.summaries.durable = counting  # type: ignore[assignment]
        await until_a_pass()
        assert counting.calls["get_turns"] == 1
        clock.advance(TURN_CACHE_AGE + timedelta(seconds=1))
        await until_a_pass()
        assert counting.calls["get_turns"] == 3
    finally:
        await memory.aclose()


def _tiers(record: SessionRecord | None) -> list[tuple[Any, ...]]:
    """The committed tiers, without their timestamps."""
    assert record is not None
    raw = record.data["tiers"]
    assert isinstance(raw, list)
    out = []
    for tier in raw:
        assert isinstance(tier, dict)
        out.append((tier["tier"], tier["first_index"], tier["through_index"], tier["text"]))
    return out


def _structured(record: SessionRecord | None) -> dict[str, JsonValue]:
    assert record is not None
    return {k: v for k, v in record.data.items() if k not in ("updated_at",)}


class CommitLog:
    """A durable store that records, in order, the turn each committed summary reaches."""

    def __init__(self, inner: DurableStore) -> None:
        self.inner = inner
        self.commits: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put_record(self, session_id: str, kind: str, data: Any, **kw: Any) -> Any:
        written = await self.inner.put_record(session_id, kind, data, **kw)
        if kind == SUMMARY_RECORD:
            self.commits.append(data["through_index"])
        return written


async def test_two_processes_caches_never_lose_or_regress_a_summary() -> None:
    """Two workers (two processes' caches) take turns, and sometimes race, summarizing one
    session while turns arrive, and a third process redacts a summarized turn. A worker with no
    cache replays the same commits (the same targets, in order) on a second store: the
    records must be equal after every round, so no stale cache changed what was committed;
    the summaries never go back but for the redaction's reset, and the redacted text never
    reaches them."""
    clock = FakeClock()
    main = service(clock, auto_summarize=False)
    reference = service(clock, auto_summarize=False)
    try:
        log = CommitLog(main.tiers.durable)
        durable: DurableStore = log  # type: ignore[assignment]
        ref_durable = reference.tiers.durable
        a, b = jobs(durable, main, clock), jobs(durable, main, clock)
        session = await main.session("s-two", user_id="u-1")
        ref_session = await reference.session("s-two", user_id="u-1")
        replayed = 0
        reached = -1
        secret = 32
        for round_ in range(16):
            for i in range(round_ * 11, round_ * 11 + 11):
                role = "user" if i % 2 == 0 else "assistant"
                await session.add_turn(role, line(i))
                await ref_session.add_turn(role, line(i))
            next_index = (round_ + 1) * 11
            if round_ == 6:  # turn ``secret`` is summarized by now: a third process resets
                assert f"CODE-{secret:04d}" in (await a.read("s-two")).text
                await log.inner.redact_turn("s-two", secret)
                assert await jobs(log.inner, main, clock).redacted("s-two", secret)
                await ref_durable.redact_turn("s-two", secret)
                assert await jobs(ref_durable, reference, clock).redacted("s-two", secret)
                reached = -1
            if round_ % 3 == 2:  # both at once: one commits, the other loses the race
                await asyncio.gather(
                    a.run("s-two", next_index=next_index), b.run("s-two", next_index=next_index)
                )
            else:
                worker = a if round_ % 2 == 0 else b
                await worker.run("s-two", next_index=next_index)
            for target in log.commits[replayed:]:
                outcome = await jobs(ref_durable, reference, clock).run("s-two", through=target)
                assert outcome is JobOutcome.COMMITTED
            replayed = len(log.commits)
            summary = await log.inner.get_record("s-two", SUMMARY_RECORD)
            ref_summary = await ref_durable.get_record("s-two", SUMMARY_RECORD)
            if ref_summary is None:
                assert summary is None
                continue
            assert _tiers(summary) == _tiers(ref_summary)
            assert _structured(
                await log.inner.get_record("s-two", STRUCTURED_RECORD)
            ) == _structured(await ref_durable.get_record("s-two", STRUCTURED_RECORD))
            assert summary is not None
            through = summary.data["through_index"]
            assert isinstance(through, int)
            assert through >= reached
            reached = through
        assert len(log.commits) >= 6
        assert reached >= 16 * 11 - 1 - 2 * STEADY.every_turns
        assert log.commits[-1] == reached
        text = (await a.read("s-two")).text
        assert f"CODE-{secret:04d}" not in text
        assert "CODE-0034" in text  # its neighbours are summarized again
        # The stale caches were exercised: a pass met the other worker's commit.
        assert a.stats.lost_races + b.stats.lost_races > 0
    finally:
        await main.aclose()
        await reference.aclose()


async def test_kept_turns_are_bounded_by_their_text(monkeypatch: Any) -> None:
    """The turns kept for the next pass are bounded by characters as well as by sessions:
    past ``TURN_CACHE_CHARS`` the least recently kept sessions are dropped, and a pass
    over more text than the bound keeps nothing (its next pass reads the archive)."""
    clock = FakeClock()
    memory = service(clock)
    monkeypatch.setattr(jobs_module, "TURN_CACHE_CHARS", 3_000)
    try:
        sessions = [await memory.session(f"s-{n}", user_id="u-1") for n in range(6)]
        for i in range(40):
            for session in sessions:
                await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
            await memory.drain()
        held = memory.summaries._pass_turns
        assert held, "some passes kept their turns"
        chars = sum(sum(len(t.text) for t in kept.turns.values()) for kept in held.values())
        assert chars == memory.summaries._pass_turn_chars <= 3_000
        assert len(held) < len(sessions)  # the bound dropped some
    finally:
        await memory.aclose()
