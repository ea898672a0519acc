"""The summary jobs' cheaper bookkeeping (issue #8) commits what it committed before.

* A kept turn's size is carried from the previous pass (not counted again) only for the
  very turn object it was counted on: the sizes and the total are what counting gives.
* The turns handed to extraction are taken from the planning read alone when extraction
  has reached the summaries (a steady session), else from every turn read: either way,
  exactly the turns after ``extracted_through`` up to the last one.

Two identical seeded scripts of passes -- with another process's commits, redactions and
a structured record set back by an older writer (extraction then lags the summaries) --
one with the previous pass's turns kept (as the jobs do), one forgetting them before every
pass (so every pass reads its turns and counts every size): every record written must be
the same, byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from tiermem.background import BackgroundWork
from tiermem.clock import FakeClock
from tiermem.errors import ConflictError
from tiermem.models import NewTurn, Turn
from tiermem.models.content import TextBlock
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.codec import encode_data
from tiermem.summaries import STRUCTURED_RECORD, SUMMARY_RECORD, SummaryJobs
from tiermem.summaries.jobs import TURN_CACHE_TURNS, _chars, _PassTurns
from tiermem.summaries.models import StructuredMemory
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
WHEN = datetime(2026, 1, 5, tzinfo=UTC)
SESSION = "s-bookkeeping"


@dataclass
class _Recording:
    """The rule extractor, noting the indexes of the turns each call was given and the
    prior's reach (the extractor's own work is unchanged)."""

    inner: RuleStructuredExtractor = field(default_factory=RuleStructuredExtractor)
    calls: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def entities(self) -> object:
        return self.inner.entities

    async def extract(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        reach = -1 if prior is None else prior.through_index
        self.calls.append((reach, [t.index for t in turns]))
        return await self.inner.extract(turns, prior=prior)


def _jobs(durable: MemoryDurableStore, clock: FakeClock, extractor: object) -> SummaryJobs:
    return SummaryJobs(
        durable,
        summarizer=ExtractiveSummarizer(COUNTER),
        extractor=extractor,  # type: ignore[arg-type]
        background=BackgroundWork(),
        clock=clock,
        tokens=COUNTER,
    )


async def _run(seed: int, *, keep: bool) -> tuple[list[tuple[str, ...]], _Recording, int]:
    """The records (JSON) after every step of a seeded script, the extraction calls, and
    how many passes started from the previous pass's turns."""
    rng = random.Random(seed)
    conversation = generate_conversation(seed, turns=300, facts=12, corrections=6).turns
    clock = FakeClock(WHEN)
    durable = MemoryDurableStore(clock=clock)
    recording = _Recording()
    jobs = _jobs(durable, clock, recording)
    other = _jobs(durable, clock, RuleStructuredExtractor())  # another process
    seen: list[tuple[str, ...]] = []
    carried = 0
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
        if roll < 0.04 and at > 40:
            await other.run(SESSION, through=at - 1 - rng.randint(0, 8))
            outcome = "other"
        elif roll < 0.06 and at > 40:
            outcome = str(await jobs.redacted(SESSION, rng.randrange(at)))
        elif roll < 0.13 and at > 40:
            # An older writer sets structured memory back: extraction lags the summaries.
            current = await durable.get_record(SESSION, STRUCTURED_RECORD)
            await durable.put_record(
                SESSION,
                STRUCTURED_RECORD,
                StructuredMemory().model_dump(mode="json"),
                expected_version=current.version if current else 0,
            )
            outcome = "set back"
        else:
            if not keep:
                jobs._drop_pass_turns(SESSION)
            elif SESSION in jobs._pass_turns:
                carried += 1
            try:
                outcome = str(await jobs.run(SESSION, next_index=at))
            except ConflictError:
                outcome = "conflict"
        records = [
            await durable.get_record(SESSION, kind) for kind in (SUMMARY_RECORD, STRUCTURED_RECORD)
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
    return seen, recording, carried


@pytest.mark.parametrize("seed", [2, 9, 31])
async def test_passes_with_carried_turns_and_sizes_commit_what_counting_commits(
    seed: int,
) -> None:
    kept, recording, carried = await _run(seed, keep=True)
    counted, _, _ = await _run(seed, keep=False)
    assert carried >= 10  # the previous pass's turns (and sizes) were used
    assert sum(step[0] == "committed" for step in kept) >= 10
    assert sum(step[0] == "set back" for step in kept) >= 2
    assert kept == counted
    # Extraction got exactly the turns after its prior's reach, steady or lagging.
    lagging = 0
    for reach, indexes in recording.calls:
        assert indexes == list(range(reach + 1, reach + 1 + len(indexes)))
        lagging += len(indexes) > 20
    assert lagging >= 1  # a set-back record made one pass extract from far back


def _turn(index: int, text: str) -> Turn:
    return NewTurn(role="user", content=(TextBlock(text=text),), timestamp=WHEN).with_index(index)


def test_carried_sizes_are_the_counted_sizes() -> None:
    """A turn replaced at its index (a redaction: another object) is counted again."""
    rng = random.Random(4)
    jobs = _jobs(MemoryDurableStore(), FakeClock(WHEN), RuleStructuredExtractor())
    by_index = {i: _turn(i, "x" * rng.randrange(200)) for i in range(300)}
    for target in range(20, 300, 13):
        prior = jobs._pass_turns.get(SESSION)
        if prior is not None and rng.random() < 0.5:  # replace some turns the prior holds
            for i in rng.sample(sorted(prior.turns), 5):
                by_index[i] = _turn(i, "y" * rng.randrange(200))
        window = {i: t for i, t in by_index.items() if i <= target + 10}
        jobs._keep_turns(SESSION, 1, window, target, WHEN, prior)
        held = jobs._pass_turns[SESSION]
        assert isinstance(held, _PassTurns)
        expected = {i: t for i, t in window.items() if target - TURN_CACHE_TURNS < i <= target}
        assert held.turns == expected
        assert held.sizes == {i: _chars(t) for i, t in expected.items()}
        assert held.chars == sum(held.sizes.values()) == jobs._pass_turn_chars
