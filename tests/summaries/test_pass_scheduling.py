"""Summary passes kept off the turns' latency (issue #8): a pass yields to the event loop
between its stages, background passes are bounded per process, and they run beside the
background lanes, so the turns' jobs never queue behind one. Offline engines, in-memory
backends, a fake clock; the speed itself is measured by ``bench/turns.py``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from tiermem.background import BackgroundWork
from tiermem.clock import FakeClock
from tiermem.errors import ValidationError
from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import JobOutcome, SummaryPolicy, SummaryTier
from tiermem.summaries.models import StructuredMemory
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()


class Ticker:
    """Counts the event loop's turns given to other tasks: a stand-in for the turns
    waiting on the response path (each tick is one chance for them to run)."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class Stamped:
    """The offline summarizer and extractor, recording the ticker's count at each call
    (what the test checks is when the real engines ran, not what they returned)."""

    name = "extractive"
    verbatim = True

    def __init__(self, ticker: Ticker, calls: list[tuple[str, int]]) -> None:
        self.inner = ExtractiveSummarizer(COUNTER)
        self.extractor = RuleStructuredExtractor()
        self.ticker = ticker
        self.calls = calls

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        self.calls.append(("summarize", self.ticker.ticks))
        return await self.inner.summarize(
            turns, prior=prior, target_tokens=target_tokens, must_keep=must_keep
        )

    async def extract(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        self.calls.append(("extract", self.ticker.ticks))
        return await self.extractor.extract(turns, prior=prior)


def service(clock: FakeClock, **kw: Any) -> MemoryService:
    kw.setdefault("summary_policy", SummaryPolicy(min_preservation=0.0, recover_preservation=0.0))
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
        **kw,
    )


def line(i: int) -> str:
    return f"Turn {i}: the code for item {i} is CODE-{i:04d}."


async def test_a_pass_lets_other_tasks_run_between_each_of_its_stages() -> None:
    clock = FakeClock()
    memory = service(clock, auto_summarize=False)
    try:
        session = await memory.session("s-stages", user_id="u-1")
        for i in range(60):
            await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
        jobs = memory.summaries
        calls: list[tuple[str, int]] = []
        with Ticker() as ticker:
            stamped = Stamped(ticker, calls)
            jobs.summarizer = stamped
            jobs.extractor = stamped
            # Three passes: the third builds all three tiers (ancient, middle, recent).
            for through in (15, 30, 50):
                assert await jobs.run(session.id, through=through) is JobOutcome.COMMITTED
        third = await jobs.read(session.id)
        assert {t.tier for t in third.tiers} == set(SummaryTier)
        # In-memory backends never suspend: without the pass's own yields every stamp of
        # a pass would be equal. Each stage (extraction, each tier) starts after a tick.
        kinds = [k for k, _ in calls]
        assert kinds[0] == "extract"  # the first pass extracts through the last turn
        assert kinds.count("summarize") >= 6
        stamps = [t for _, t in calls]
        assert all(a < b for a, b in itertools.pairwise(stamps)), calls
    finally:
        await memory.aclose()


class Counting:
    """Wraps ``SummaryJobs.run`` to record how many passes are in flight at once."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self.inside = 0
        self.most = 0

    async def __call__(self, session_id: str, **kw: Any) -> JobOutcome:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            outcome: JobOutcome = await self._run(session_id, **kw)
            return outcome
        finally:
            self.inside -= 1


@pytest.mark.parametrize("limit", [1, 3])
async def test_background_passes_are_bounded_per_process(limit: int) -> None:
    clock = FakeClock()
    policy = SummaryPolicy(
        min_preservation=0.0, recover_preservation=0.0, max_concurrent_passes=limit
    )
    memory = service(clock, summary_policy=policy)
    try:
        sessions = [await memory.session(f"s-{n}", user_id=f"u-{n}") for n in range(6)]
        counting = Counting(memory.summaries.run)
        memory.summaries.run = counting  # type: ignore[method-assign]
        # Every session reaches the trigger on the same turn (the bench's wall of passes).
        for i in range(21):
            for s in sessions:
                await s.add_turn("user" if i % 2 == 0 else "assistant", line(i))
        await memory.drain()
        assert counting.most == limit  # never more; and the bound is used
        for s in sessions:
            assert (await s.watermarks()).summarized_through >= 13
    finally:
        await memory.aclose()


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="max_concurrent_passes"):
        SummaryPolicy(max_concurrent_passes=0)


async def test_a_job_beside_the_lanes_never_holds_the_turns_jobs_back() -> None:
    work = BackgroundWork(workers=1, max_pending=4)
    release = asyncio.Event()
    ran: list[str] = []

    async def long_pass() -> None:
        await release.wait()
        ran.append("pass")

    async def index_write() -> None:
        ran.append("index")

    beside = work.submit_beside("u-1", "s-1", long_pass)
    # More lane jobs than the lane holds: a pass on the lane would block these submits.
    futures = [await work.submit("u-1", "s-1", index_write) for _ in range(6)]
    await asyncio.wait_for(asyncio.gather(*futures), timeout=5)
    assert ran == ["index"] * 6
    assert not beside.done()
    # The scoped waits still cover it.
    waiter = asyncio.ensure_future(work.wait_for(session_id="s-1"))
    await asyncio.sleep(0)
    assert not waiter.done()
    release.set()
    await waiter
    assert ran[-1] == "pass"
    await work.aclose()


async def test_a_failing_job_beside_the_lanes_is_reported() -> None:
    work = BackgroundWork()

    async def fail() -> None:
        raise RuntimeError("boom")

    work.submit_beside("u-1", "s-1", fail)
    with pytest.raises(ExceptionGroup) as group:
        await work.drain()
    assert [str(e) for e in group.value.exceptions] == ["boom"]
    assert work.failures == 1
    await work.aclose()
