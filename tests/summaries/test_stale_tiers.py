"""No tier presents a superseded value as current, whichever pass built it (issue #9).

A tier summarizes its own span, so a tier built before a correction states the old value;
each pass re-checks every tier against the latest structured memory's ``previous`` values
(:func:`~tiermem.summaries.validate.drop_stale`). The end-to-end tests add turns without
waiting for the background passes, so the tier boundaries (and which tier was built before
which correction) depend on the timing: the result must not.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.models import TextBlock, Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.summaries import SUMMARY_RECORD
from tiermem.summaries.models import Fact, StructuredMemory, SummaryText, SummaryTier
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.quality import stale_facts
from tiermem.summaries.rolling import RollingBuilder, TierTargets, plan_tiers
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.summaries.validate import drop_stale, validated_pass
from tiermem.testing.conversations import Domain, generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
T0 = datetime(2030, 1, 1, tzinfo=UTC)


class EchoSummarizer:
    """Returns the span's turns as said (a test double: the point is which tier states
    what, not how it is summarized)."""

    name = "echo"

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        return "\n".join(t.text for t in turns)


def turn(index: int, text: str) -> Turn:
    return Turn(
        index=index,
        role="user",
        content=(TextBlock(text=text),),
        timestamp=T0,
        token_count=COUNTER.count(text),
    )


CORRECTED = StructuredMemory(
    entities={"series": Fact(slot="series", value="Blame!", turn_index=33, previous=("Berserk",))},
    facts={"budget": Fact(slot="budget", value="¥8,000", turn_index=31, previous=("¥5,000",))},
    through_index=39,
)
OLD_TIER = "I'm reading Berserk lately. My budget is ¥5,000. I moved from ¥5,000 to ¥8,000."


async def older_tier_after_correction(structured: StructuredMemory) -> tuple[str, int]:
    """The ancient tier after a pass whose structured memory is ``structured``: the
    ancient text was built (and its raw turns expired) before turns 30..39 arrived; and
    how many sentences the pass dropped as stale."""
    previous = [
        SummaryText(
            tier=SummaryTier.ANCIENT,
            text=OLD_TIER,
            tokens=COUNTER.count(OLD_TIER),
            first_index=0,
            through_index=9,
            created_at=T0,
            engine="echo",
        ),
        SummaryText(
            tier=SummaryTier.MIDDLE,
            text="Filler.",
            tokens=2,
            first_index=10,
            through_index=19,
            created_at=T0,
            engine="echo",
        ),
        SummaryText(
            tier=SummaryTier.RECENT,
            text="More filler.",
            tokens=3,
            first_index=20,
            through_index=29,
            created_at=T0,
            engine="echo",
        ),
    ]
    fresh = {i: turn(i, f"Filler turn {i}.") for i in range(30, 40)}
    fresh[31] = turn(31, "Actually my budget is ¥8,000.")
    fresh[33] = turn(33, "Forget that, show me Blame! instead.")

    async def source(first: int, through: int) -> list[Turn]:
        return [fresh[i] for i in range(first, through + 1) if i in fresh]  # 0..29 expired

    builder = RollingBuilder(
        EchoSummarizer(),
        targets=TierTargets(),
        counter=COUNTER,
        clock=FakeClock(T0),
        turns=source,
    )
    spans = plan_tiers(previous, 39)
    built, quality = await validated_pass(builder, spans, previous, structured, check=False)
    ancient = next(b for b in built if b.span.tier is SummaryTier.ANCIENT)
    assert ancient.text.engine == "kept"  # built by an earlier pass, never rebuilt
    return ancient.text.text, quality.stale_dropped


async def test_a_correction_after_the_older_tier_was_built_removes_its_old_values() -> None:
    text, dropped = await older_tier_after_correction(CORRECTED)
    assert dropped == 2
    assert "Berserk" not in text  # an entity kind's replaced value
    assert "My budget is ¥5,000." not in text  # a fact's replaced value
    assert "I moved from ¥5,000 to ¥8,000." in text  # the history, with the latest value
    # Without the correction recorded, the same tier keeps what it said.
    uncorrected = StructuredMemory(
        entities={"series": Fact(slot="series", value="Berserk", turn_index=0)},
        facts={"budget": Fact(slot="budget", value="¥5,000", turn_index=1)},
        through_index=39,
    )
    text, dropped = await older_tier_after_correction(uncorrected)
    assert (OLD_TIER in text, dropped) == (True, 0)


def test_drop_stale_finds_a_series_by_its_other_names() -> None:
    rules = RuleStructuredExtractor(
        {"shingeki no kyojin": "Attack on Titan", "attack on titan": "Attack on Titan"}
    )
    memory = StructuredMemory(
        entities={
            "series": Fact(
                slot="series", value="Blame!", turn_index=5, previous=("Attack on Titan",)
            )
        }
    )
    text, dropped = drop_stale(
        "I love Shingeki no Kyojin.\nShipping is free.", memory, extractor=rules.entities
    )
    assert (text, dropped) == ("Shipping is free.", 1)


def settings_for(backend: str, tmp_path: Path) -> TierMemSettings:
    if backend == "sqlite":
        return TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "tm.db"
        )
    return TierMemSettings(hot_backend="memory", durable_backend="memory")


@pytest.mark.parametrize("domain", ["manga", "assistant"])
@pytest.mark.parametrize("backend", ["sqlite", "memory"])
@pytest.mark.parametrize(("seed", "drain_every"), [(1, None), (2, 17), (3, 5)])
async def test_tiers_state_no_superseded_value_however_the_passes_were_timed(
    tmp_path: Path, backend: str, domain: Domain, seed: int, drain_every: int | None
) -> None:
    """Turns are added without waiting for each pass (``drain_every`` turns, or never),
    then the summaries are awaited: neither what is read nor the committed record states
    a superseded value without the latest one."""
    conversation = generate_conversation(seed, turns=300, facts=30, corrections=10, domain=domain)
    assert any(f.superseded for f in conversation.facts)
    clock = FakeClock(conversation.turns[0].timestamp)
    rules = RuleStructuredExtractor(conversation.known_titles)
    async with MemoryService.from_settings(
        settings_for(backend, tmp_path),
        clock=clock,
        summarizer=ExtractiveSummarizer(COUNTER, extractor=rules),
        extractor=rules,
    ) as service:
        session = await service.session("s-timing", user_id="u-1")
        for i, said in enumerate(conversation.turns):
            clock.set(said.timestamp)
            await session.add_turn(said.role, list(said.content), timestamp=said.timestamp)
            if drain_every is not None and i % drain_every == 0:
                await service.drain()
        found = await session.summaries(wait_through=len(conversation.turns) - 1)
        assert found.tiers
        facts = conversation.facts
        assert stale_facts(facts, found.text, found.structured, extractor=rules.entities) == []
        # The pass itself committed clean tiers (not only the read view).
        record = await service.summaries.durable.get_record("s-timing", SUMMARY_RECORD)
        assert record is not None
        raw = record.data["tiers"]
        assert isinstance(raw, list)
        committed = "\n".join(SummaryText.model_validate(t).text for t in raw)
        assert stale_facts(facts, committed, found.structured, extractor=rules.entities) == []


def test_active_entities_follow_structured_memory_corrections() -> None:
    """The hot tier's entity tracking reads no corrections ("French, not German" leaves
    German active): the context's entities take structured memory's latest values, unless
    the entity was said after the slot's latest statement."""
    from tiermem.models import ActiveEntity
    from tiermem.summaries.jobs import current_entities

    def active(kind: str, value: str, turn_index: int) -> ActiveEntity:
        return ActiveEntity(kind=kind, value=value, turn_index=turn_index, updated_at=T0)

    memory = StructuredMemory(
        entities={
            "language": Fact(slot="language", value="french", turn_index=272, previous=("german",)),
            "series": Fact(slot="series", value="Blame!", turn_index=250, previous=("Naruto",)),
        },
        facts={
            "anniversary": Fact(
                slot="anniversary", value="2015-12-12", turn_index=270, previous=("2015-08-21",)
            ),
            "budget": Fact(
                slot="budget", value="about 8000 yen", turn_index=20, previous=("¥5,000",)
            ),
            "delivery_date": Fact(
                slot="delivery_date",
                value="after the holidays",
                turn_index=40,
                previous=("2026-07-13",),
            ),
        },
        through_index=299,
    )
    held = {
        "language": active("language", "German", 272),  # the correction's wrong value
        "date": active("date", "2015-08-21", 270),  # a fact's superseded value
        "series": active("series", "Naruto", 280),  # said again after the correction
        "money": active("money", "¥5,000", 20),  # the budget's new amount, as an entity
        "volume": active("volume", "3", 12),  # nothing to do with a correction
    }
    now = current_entities(held, memory)
    assert {k: v.value for k, v in now.items()} == {
        "language": "french",
        "date": "2015-12-12",
        "series": "Naruto",
        "money": "JPY 8000",
        "volume": "3",
    }
    # A superseded date whose slot's new value names no date is left out.
    assert current_entities({"date": active("date", "2026-07-13", 30)}, memory) == {}
