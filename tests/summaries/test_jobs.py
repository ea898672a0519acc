"""Summarization jobs through the service: triggers, tier rolls, records and watermarks,
read-your-writes, crashes mid-job, concurrent jobs, expired raw turns, quality-aware
compression and the context that uses the summaries. Offline engines, in-memory backends,
a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError, ValidationError
from tiermem.llm.chat import ModelFailedError
from tiermem.models import JsonValue, SessionRecord, Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import (
    STRUCTURED_RECORD,
    SUMMARY_RECORD,
    WATERMARKS_RECORD,
    JobOutcome,
    SummaryJobs,
    SummaryPolicy,
    SummaryTier,
)
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
STEADY = SummaryPolicy(min_preservation=0.0, recover_preservation=0.0)
"""Compression that never adapts, so spans are predictable (adaptation has its own test)."""


class Switchable:
    """The offline summarizer, made to fail on demand after the job has read everything
    (a test double: a real engine cannot be made to fail at a chosen point)."""

    name = "switchable"

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer(COUNTER)
        self.fail = False
        self.calls = 0

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        self.calls += 1
        if self.fail:
            raise ModelFailedError("the model is down")
        return await self.inner.summarize(
            turns, prior=prior, target_tokens=target_tokens, must_keep=must_keep
        )


def service(
    clock: FakeClock, durable: MemoryDurableStore | None = None, **kw: Any
) -> MemoryService:
    kw.setdefault("summary_policy", STEADY)
    return MemoryService(
        MemoryHotStore(clock=clock),
        durable or MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
        **kw,
    )


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def memory(clock: FakeClock) -> AsyncIterator[MemoryService]:
    svc = service(clock)
    yield svc
    await svc.aclose()


def line(i: int) -> str:
    return f"Turn {i}: the code for item {i} is CODE-{i:04d}."


async def add(memory: MemoryService, session: Any, start: int, count: int) -> None:
    for i in range(start, start + count):
        await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
        await memory.drain()


async def test_count_trigger_runs_a_pass_at_twenty_unsummarized_turns(
    memory: MemoryService,
) -> None:
    session = await memory.session("s-count", user_id="u-1")
    await add(memory, session, 0, 19)
    assert (await session.watermarks()).summarized_through == -1
    await add(memory, session, 19, 1)
    marks = await session.watermarks()
    assert marks.summarized_through == 13  # 20 turns, the newest 6 stay raw
    assert marks.extracted_through == 19
    # The response path checked the in-process watermark: one job to learn it, one pass.
    assert memory.summaries.stats.jobs == 2
    assert memory.summaries.stats.committed == 1
    durable = memory.tiers.durable
    for kind in (SUMMARY_RECORD, STRUCTURED_RECORD):
        record = await durable.get_record(session.id, kind)
        assert record is not None
        assert record.version == 1
    # The watermarks ride in the summary record: no record of their own is written.
    assert await durable.get_record(session.id, WATERMARKS_RECORD) is None
    summary = await durable.get_record(session.id, SUMMARY_RECORD)
    assert summary is not None
    assert summary.data[WATERMARKS_RECORD]["summarized_through"] == 13  # type: ignore[index]


async def test_token_trigger_runs_a_pass_before_twenty_turns(clock: FakeClock) -> None:
    memory = service(clock, summary_policy=SummaryPolicy(trigger_tokens=600, keep_hot=2))
    try:
        session = await memory.session("s-tokens", user_id="u-1")
        big = " ".join(f"Volume {n} of Berserk costs ¥{990 + n}." for n in range(40))
        assert 300 < COUNTER.count(big) < 600
        await session.add_turn("user", big)
        await memory.drain()
        assert (await session.watermarks()).summarized_through == -1  # under 600 tokens
        await session.add_turn("user", big)
        await memory.drain()
        # Two turns, over 600 tokens: due. The newest turn alone is more than half the
        # trigger, yet one turn always stays raw.
        assert (await session.watermarks()).summarized_through == 0
    finally:
        await memory.aclose()


async def test_tiers_roll_recent_middle_ancient_from_raw_turns(memory: MemoryService) -> None:
    session = await memory.session("s-roll", user_id="u-1")
    await add(memory, session, 0, 62)
    found = await session.summaries()
    spans = {t.tier: (t.first_index, t.through_index) for t in found.tiers}
    assert spans == {
        SummaryTier.ANCIENT: (0, 27),
        SummaryTier.MIDDLE: (28, 41),
        SummaryTier.RECENT: (42, 55),
    }
    assert found.watermarks.passes == 4
    targets = STEADY.targets
    for tier in found.tiers:
        assert tier.tokens <= targets.of(tier.tier) + 40  # must_keep may add a little
        assert tier.engine == "extractive"
    # Every code said in the summarized turns is in the tiers or the structured memory.
    ancient = found.tier(SummaryTier.ANCIENT)
    assert ancient is not None
    assert ancient.text


async def test_read_your_writes_runs_the_pass_inline(clock: FakeClock) -> None:
    memory = service(clock, auto_summarize=False)
    try:
        session = await memory.session("s-ryw", user_id="u-1")
        await session.add_turn("user", "My budget is ¥5,000 and I collect Berserk.")
        await session.add_turn("assistant", "Noted.")
        await session.add_turn("user", "Actually my budget is ¥8,000, not ¥5,000.")
        await memory.drain()
        assert (await session.watermarks()).summarized_through == -1  # nothing queued
        found = await session.summaries(wait_through=2)
        assert found.watermarks.summarized_through == 2
        assert found.structured.facts["budget"].value == "¥8,000"
        assert "8,000" in found.text
        again = await session.summaries(wait_through=1)  # already there: no new pass
        assert again.summary_version == found.summary_version
        with pytest.raises(ValidationError):
            await session.summaries(wait_through=3)
    finally:
        await memory.aclose()


async def test_a_failing_engine_leaves_the_previous_summary_and_the_job_is_retried(
    clock: FakeClock,
) -> None:
    engine = Switchable()
    memory = service(clock, summarizer=engine)
    try:
        session = await memory.session("s-crash", user_id="u-1")
        await add(memory, session, 0, 20)
        before = await session.summaries()
        assert before.watermarks.summarized_through == 13
        engine.fail = True
        await add(memory, session, 20, 14)  # the second pass is due at turn 33
        after = await session.summaries()
        assert after.tiers == before.tiers
        assert after.summary_version == before.summary_version
        assert memory.summaries.stats.failures == 1
        engine.fail = False
        await add(memory, session, 34, 1)  # the next turn queues the job again
        retried = await session.summaries()
        assert retried.watermarks.summarized_through == 28
        assert retried.summary_version == before.summary_version + 1
    finally:
        await memory.aclose()


class FlakyDurable(MemoryDurableStore):
    """Fails the next summary-record write (a test double for a backend that goes away
    between two writes of a job, which a real store cannot be told to do)."""

    fail_summary_writes = 0

    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: Any = None,
    ) -> SessionRecord:
        if kind == SUMMARY_RECORD and self.fail_summary_writes:
            self.fail_summary_writes -= 1
            raise BackendUnavailableError("lost the connection", backend="memory")
        return await super().put_record(
            session_id, kind, data, expected_version=expected_version, expires_at=expires_at
        )


async def test_a_crash_between_the_writes_is_finished_by_the_retry(clock: FakeClock) -> None:
    durable = FlakyDurable(clock=clock)
    memory = service(clock, durable)
    try:
        session = await memory.session("s-between", user_id="u-1")
        await add(memory, session, 0, 19)
        durable.fail_summary_writes = 1
        await add(memory, session, 19, 1)
        found = await session.summaries()
        assert found.tiers == ()  # the summary was not written...
        assert found.watermarks.extracted_through == 19  # ...structured memory was
        assert memory.summaries.stats.failures == 1
        await add(memory, session, 20, 1)
        found = await session.summaries()
        assert found.watermarks.summarized_through == 14
        assert found.structured_version == 2  # extended by the retry, not rewritten twice
    finally:
        await memory.aclose()


class Gate:
    """Holds every summarize call until ``count`` callers are inside, so two jobs surely
    read the same record version before either commits."""

    name = "gate"

    def __init__(self, count: int) -> None:
        self.inner = ExtractiveSummarizer(COUNTER)
        self.count = count
        self.inside = 0
        self.open = asyncio.Event()

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        self.inside += 1
        if self.inside >= self.count:
            self.open.set()
        await self.open.wait()
        return await self.inner.summarize(
            turns, prior=prior, target_tokens=target_tokens, must_keep=must_keep
        )


async def test_concurrent_jobs_for_one_turn_commit_once(clock: FakeClock) -> None:
    memory = service(clock, auto_summarize=False)
    try:
        session = await memory.session("s-race", user_id="u-1")
        await add(memory, session, 0, 20)
        durable = memory.tiers.durable
        workers = [
            SummaryJobs(
                durable,
                summarizer=Gate(2),
                extractor=RuleStructuredExtractor(),
                background=memory.background,
                clock=clock,
                tokens=COUNTER,
                policy=STEADY,
            )
            for _ in range(2)
        ]
        gate = Gate(2)
        for worker in workers:
            worker.summarizer = gate
        outcomes = await asyncio.gather(*(w.run(session.id, through=13) for w in workers))
        assert sorted(outcomes) == sorted([JobOutcome.COMMITTED, JobOutcome.LOST_RACE])
        record = await durable.get_record(session.id, SUMMARY_RECORD)
        assert record is not None
        assert record.version == 1
        assert record.data[WATERMARKS_RECORD]["passes"] == 1  # type: ignore[index]
        # Run again: already done, nothing written.
        assert await workers[0].run(session.id, through=13) is JobOutcome.ALREADY_DONE
    finally:
        await memory.aclose()


async def test_summaries_outlive_expired_raw_turns_and_old_tiers_are_kept(
    memory: MemoryService, clock: FakeClock
) -> None:
    session = await memory.session("s-expired", user_id="u-1")
    await add(memory, session, 0, 20)
    first = await session.summaries()
    old_recent = first.tier(SummaryTier.RECENT)
    assert old_recent is not None
    assert old_recent.through_index == 13
    clock.advance(timedelta(hours=25))  # the raw turns' 24 hours are over
    assert await session.get_turns(0, 20) == []
    assert (await session.summaries()).tiers == first.tiers  # records live 30 days
    await add(memory, session, 20, 14)
    found = await session.summaries()
    middle = found.tier(SummaryTier.MIDDLE)
    assert middle is not None
    assert middle.engine == "kept"
    assert middle.text == old_recent.text  # unchanged, never summarized again
    assert found.quality is not None
    assert found.quality.kept_tiers == ("middle",)
    recent = found.tier(SummaryTier.RECENT)
    assert recent is not None
    assert recent.engine == "extractive"


class Forgetful:
    """A summarizer that keeps nothing (a test double for a bad model)."""

    name = "forgetful"

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        return "The user and the assistant talked."


async def test_low_preservation_keeps_more_hot_turns_and_shows_it(clock: FakeClock) -> None:
    memory = service(clock, summarizer=Forgetful(), summary_policy=SummaryPolicy())
    try:
        session = await memory.session("s-quality", user_id="u-1")
        await session.add_turn("user", "My budget is ¥8,000. I collect Berserk.")
        await add(memory, session, 1, 19)
        found = await session.summaries()
        assert found.quality is not None
        assert found.quality.fact_preservation_first == 0.0
        assert found.quality.fact_preservation == 1.0  # appended verbatim
        assert "¥8,000" in found.text
        assert found.compression.keep_hot == 8  # 6 + 2
        assert found.compression.trigger_tokens == 10_000
        stats = memory.summaries.stats.snapshot()
        assert stats["compression_in_force"] == found.compression.model_dump()
        assert stats["verbatim_appends"] == 1
        # The next pass keeps 8 turns raw.
        await add(memory, session, 20, 14)
        assert (await session.watermarks()).summarized_through == 33 - 8
    finally:
        await memory.aclose()


async def test_context_uses_summaries_and_drops_the_turns_they_cover(
    memory: MemoryService,
) -> None:
    session = await memory.session("s-context", user_id="u-1")
    await session.add_turn("user", "My budget is ¥8,000 and I collect Berserk.")
    await add(memory, session, 1, 33)
    window = await session.context(budget=6_000)
    stats = window.stats
    assert stats.summary_active
    assert set(stats.summary_tiers) == {"middle", "recent"}
    assert stats.structured_memory["facts"] >= 1
    kept = [i.provenance.turn_indexes[0] for i in window.items if i.kind == "turn"]
    marks = await session.watermarks()
    assert kept
    assert min(kept) > marks.summarized_through - 6
    texts = "\n".join(str(i.content) for i in window.items if i.kind == "structured_memory")
    assert "¥8,000" in texts


async def test_an_llm_engine_summarizes_through_the_same_jobs(clock: FakeClock) -> None:
    from tiermem.llm.chat_scripted import ScriptedChatModel
    from tiermem.summaries import LLMStructuredExtractor, LLMSummarizer

    def respond(messages: Sequence[Any], system: str | None) -> dict[str, JsonValue]:
        if system is not None and "structured memory" in system:
            return {"facts": [{"slot": "budget", "value": "¥8,000", "turn": 0}]}
        return {"summary": "The user set a budget of ¥8,000 and browsed codes."}

    model = ScriptedChatModel(respond=respond)
    memory = service(
        clock, summarizer=LLMSummarizer(model), extractor=LLMStructuredExtractor(model)
    )
    try:
        session = await memory.session("s-llm", user_id="u-1")
        await add(memory, session, 0, 20)
        found = await session.summaries()
        assert found.text == "The user set a budget of ¥8,000 and browsed codes."
        assert found.structured.facts["budget"].value == "¥8,000"
        assert found.tiers[0].engine == "llm:scripted"
        assert found.quality is not None
        assert found.quality.fact_preservation_first == 1.0
    finally:
        await memory.aclose()


def test_settings_choose_the_engines_and_the_trigger() -> None:
    from tiermem.composition import summary_engines
    from tiermem.settings import TierMemSettings
    from tiermem.summaries import LLMSummarizer

    offline = summary_engines(TierMemSettings(llm="none", default_model="claude-3-5-sonnet"))
    assert "summarizer" not in offline
    assert offline["summary_policy"].trigger_tokens == 8_000
    llm = summary_engines(
        TierMemSettings(llm="openai", llm_model="qwen2.5", llm_base_url="http://127.0.0.1:9/v1")
    )
    assert isinstance(llm["summarizer"], LLMSummarizer)


async def test_300_turns_with_planted_facts_and_corrections_end_to_end() -> None:
    """Issue #9's acceptance, through the service: 300 turns, 30 planted facts, 10
    corrections, distractors and large tool outputs; every planted fact's latest value is in
    the summaries or structured memory and no superseded value is presented as current."""
    from tiermem.summaries.quality import fact_preservation, stale_facts
    from tiermem.testing.conversations import generate_conversation

    conversation = generate_conversation(1, turns=300, facts=30, corrections=10)
    clock = FakeClock(conversation.turns[0].timestamp)
    rules = RuleStructuredExtractor(conversation.known_titles)
    memory = service(
        clock,
        summarizer=ExtractiveSummarizer(COUNTER, extractor=rules),
        extractor=rules,
        summary_policy=SummaryPolicy(),
    )
    try:
        session = await memory.session("s-e2e", user_id="u-1")
        for turn in conversation.turns:
            clock.set(turn.timestamp)
            await session.add_turn(turn.role, list(turn.content), timestamp=turn.timestamp)
            await memory.drain()
        found = await session.summaries(wait_through=299)
        assert found.watermarks.passes > 10
        entities = rules.entities
        kept = fact_preservation(
            conversation.facts, found.text, found.structured, extractor=entities
        )
        assert kept == 1.0
        assert (
            stale_facts(conversation.facts, found.text, found.structured, extractor=entities) == []
        )
        for tier in found.tiers:  # bounded whatever the length
            assert tier.tokens <= memory.summaries.policy.targets.of(tier.tier)
    finally:
        await memory.aclose()


async def test_watermarks_stored_in_their_own_record_are_still_read(clock: FakeClock) -> None:
    """Sessions summarized before the watermarks moved into the summary record (or by a
    process of an older version) keep their pass count and compression in force: read from
    the ``watermarks`` record until the next pass writes them with the summary; and a
    redaction resets that record too."""
    memory = service(clock, auto_summarize=False)
    try:
        session = await memory.session("s-layout", user_id="u-1")
        await add(memory, session, 0, 20)
        await session.summaries(wait_through=13)
        durable = memory.tiers.durable
        summary = await durable.get_record(session.id, SUMMARY_RECORD)
        assert summary is not None
        # The old layout: the summary without watermarks, and a record of their own.
        old = {k: v for k, v in summary.data.items() if k != WATERMARKS_RECORD}
        await durable.put_record(session.id, SUMMARY_RECORD, old, expected_version=1)
        base = STEADY.base_compression()
        held = base.model_copy(update={"keep_hot": 10})
        marks = {"summarized_through": 13, "extracted_through": 19, "passes": 7,
                 "compression": held.model_dump(mode="json")}  # fmt: skip
        await durable.put_record(session.id, WATERMARKS_RECORD, marks, expected_version=0)
        other = service(clock, durable=durable)  # a process that has not seen the records
        try:
            found = await other.summaries.read(session.id)
            assert found.watermarks.passes == 7
            assert found.compression == held
            for i in range(20, 34):
                await session.add_turn("user" if i % 2 == 0 else "assistant", line(i))
            assert await other.summaries.run(session.id, next_index=34) is JobOutcome.COMMITTED
            after = await other.summaries.read(session.id)
            assert after.watermarks.passes == 8
            assert after.watermarks.summarized_through == 33 - 10  # the held keep_hot
            assert after.compression == held  # carried into the summary record
            stored = await durable.get_record(session.id, WATERMARKS_RECORD)
            assert stored is not None
            assert stored.version == 1  # not written by the pass
            await session.redact_turn(2)
            assert await other.summaries.redacted(session.id, 2) is False  # already reset
            reset = await other.summaries.read(session.id)
            assert reset.watermarks.summarized_through == -1
            assert reset.watermarks.passes == 8
            stored = await durable.get_record(session.id, WATERMARKS_RECORD)
            assert stored is not None
            assert stored.data["summarized_through"] == -1
        finally:
            await other.aclose()
    finally:
        await memory.aclose()
