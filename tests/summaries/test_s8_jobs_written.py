"""A pass starts from the models its previous pass wrote, not from a parse of the records
(issue #8), and that changes nothing it commits.

Two identical runs of passes over the same turns: one keeps the models of what it wrote
(as the jobs do), the other forgets them before every pass, so it validates the records
again as the code did before. Every record written must be the same, byte for byte, through
conversations with corrections (structured memory changes), adapting compression, another
process's commits (the records held go stale) and a redaction that resets the summaries.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from tiermem.background import BackgroundWork
from tiermem.clock import FakeClock
from tiermem.models import NewTurn
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.codec import encode_data
from tiermem.summaries import STRUCTURED_RECORD, SUMMARY_RECORD, SummaryJobs
from tiermem.summaries.jobs import WATERMARKS_RECORD
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
WHEN = datetime(2026, 1, 5, tzinfo=UTC)
SESSION = "s-written"


def _jobs(durable: MemoryDurableStore, clock: FakeClock) -> SummaryJobs:
    return SummaryJobs(
        durable,
        summarizer=ExtractiveSummarizer(COUNTER),
        extractor=RuleStructuredExtractor(),
        background=BackgroundWork(),
        clock=clock,
        tokens=COUNTER,
    )


async def _run(seed: int, *, reuse: bool) -> tuple[list[tuple[str, ...]], int]:
    """The records (JSON) after every step of a seeded script, and how many passes started
    from kept models."""
    rng = random.Random(seed)
    conversation = generate_conversation(seed, turns=260, facts=12, corrections=6).turns
    clock = FakeClock(WHEN)
    durable = MemoryDurableStore(clock=clock)
    jobs = _jobs(durable, clock)
    other = _jobs(durable, clock)  # another process over the same store
    seen: list[tuple[str, ...]] = []
    reused = 0
    at = 0
    while at < len(conversation):
        step = rng.randint(1, 9)
        await durable.append_turns(
            SESSION,
            [
                NewTurn(role=t.role, content=tuple(t.content), timestamp=WHEN)  # type: ignore[arg-type]
                for t in conversation[at : at + step]
            ],
        )
        at += step
        clock.advance(rng.uniform(1, 90))
        roll = rng.random()
        if roll < 0.05 and at > 40:
            await other.run(SESSION, through=at - 1 - rng.randint(0, 8))
            outcome = "other"
        elif roll < 0.08 and at > 40:
            outcome = str(await jobs.redacted(SESSION, rng.randrange(at)))
        else:
            if not reuse:
                jobs._written.clear()
            elif (held := jobs._written.get(SESSION)) is not None:
                summary = jobs._records.get(SESSION, {}).get(SUMMARY_RECORD)
                reused += held.summary is summary
            outcome = str(await jobs.run(SESSION, next_index=at))
        records = [
            await durable.get_record(SESSION, kind)
            for kind in (SUMMARY_RECORD, STRUCTURED_RECORD, WATERMARKS_RECORD)
        ]
        seen.append(
            (
                outcome,
                *(
                    "-" if r is None else f"{r.version} {encode_data(r.data, what='r')}"
                    for r in records
                ),
            )
        )
    return seen, reused


@pytest.mark.parametrize("seed", [1, 7, 23, 101])
async def test_passes_from_kept_models_write_what_passes_from_parsed_records_write(
    seed: int,
) -> None:
    kept, reused = await _run(seed, reuse=True)
    parsed, _ = await _run(seed, reuse=False)
    assert reused >= 10  # the kept models were used, not only held
    assert sum(step[0] == "committed" for step in kept) >= 10
    assert kept == parsed
