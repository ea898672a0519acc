"""Rolling tiers: triggers, tier rolls, quality-aware compression and the builder's rule
"from raw turns, or kept as it was" -- pure functions and a recording summarizer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import ValidationError
from tiermem.models import TextBlock, Turn
from tiermem.summaries.models import SummaryText, SummaryTier
from tiermem.summaries.rolling import (
    Compression,
    RollingBuilder,
    SummaryPolicy,
    TierSpan,
    TierTargets,
    adjust_compression,
    cut_to_tokens,
    plan_pass,
    plan_tiers,
)
from tiermem.tokens import ModelSpec, TiktokenCounter

COUNTER = TiktokenCounter()
BASE = Compression(keep_hot=6, trigger_tokens=8_000, every_turns=20)
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def turn(index: int, text: str | None = None, tokens: int = 10) -> Turn:
    return Turn(
        index=index,
        role="user" if index % 2 == 0 else "assistant",
        content=(TextBlock(text=text or f"turn {index} says fact-{index}."),),
        timestamp=T0,
        token_count=tokens,
    )


def tier(kind: SummaryTier, first: int, through: int, text: str) -> SummaryText:
    return SummaryText(
        tier=kind,
        text=text,
        tokens=COUNTER.count(text),
        first_index=first,
        through_index=through,
        created_at=T0,
        engine="test",
    )


class RecordingSummarizer:
    """Says which turns it was given; records every call (a test double: the real engines
    are tested in their own suites)."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], str | None, int, tuple[str, ...]]] = []

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        indexes = [t.index for t in turns]
        self.calls.append((indexes, prior, target_tokens, tuple(must_keep)))
        return f"turns {indexes[0]}-{indexes[-1]}" if indexes else ""


# -- triggers -------------------------------------------------------------------------------


def test_not_due_below_both_thresholds() -> None:
    pending = [(i, 10) for i in range(19)]
    assert plan_pass(pending, -1, BASE) is None


def test_count_trigger_keeps_the_newest_turns_raw() -> None:
    pending = [(i, 10) for i in range(20)]
    assert plan_pass(pending, -1, BASE) == 13  # 20 turns, 6 kept raw: 0..13


def test_count_trigger_counts_from_the_watermark() -> None:
    pending = [(i, 10) for i in range(14, 33)]  # 19 unsummarized after turn 13
    assert plan_pass(pending, 13, BASE) is None
    pending.append((33, 10))
    assert plan_pass(pending, 13, BASE) == 27


def test_token_trigger_fires_before_twenty_turns() -> None:
    pending = [(0, 50), (1, 50), (2, 4_000), (3, 4_000), (4, 50), (5, 50), (6, 50), (7, 50)]
    # 8,300 tokens > 8,000; the newest turns that fit in 4,000 stay raw (4 small + one big
    # would be 4,200): turns 4..7, so the pass goes through 3.
    assert plan_pass(pending, -1, BASE) == 3


def test_token_pressure_keeps_at_least_one_turn() -> None:
    pending = [(0, 5_000), (1, 5_000)]
    assert plan_pass(pending, -1, BASE) == 0


def test_nothing_to_summarize_when_everything_must_stay_raw() -> None:
    few = Compression(keep_hot=20, trigger_tokens=8_000, every_turns=20)
    assert plan_pass([(i, 10) for i in range(20)], -1, few) is None


def test_default_threshold_is_min_of_60_percent_of_window_and_8k() -> None:
    small = ModelSpec("tiny", context_window=8_192, max_output_tokens=1_024)
    large = ModelSpec("big", context_window=200_000, max_output_tokens=8_192)
    assert SummaryPolicy.for_model(small).trigger_tokens == 4_915
    assert SummaryPolicy.for_model(large).trigger_tokens == 8_000
    assert SummaryPolicy.for_model(None).trigger_tokens == 8_000


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValidationError):
        SummaryPolicy(every_turns=0)
    with pytest.raises(ValidationError):
        SummaryPolicy(keep_hot=30, max_keep_hot=12)
    with pytest.raises(ValidationError):
        TierTargets(recent=3)


# -- tier rolls ------------------------------------------------------------------------------


def test_first_pass_makes_one_recent_tier() -> None:
    assert plan_tiers((), 13) == [TierSpan(SummaryTier.RECENT, 0, 13)]


def test_second_pass_rolls_recent_into_middle() -> None:
    current = [tier(SummaryTier.RECENT, 0, 13, "a")]
    assert plan_tiers(current, 27) == [
        TierSpan(SummaryTier.MIDDLE, 0, 13),
        TierSpan(SummaryTier.RECENT, 14, 27),
    ]


def test_third_and_fourth_passes_roll_middle_into_ancient() -> None:
    current = [tier(SummaryTier.MIDDLE, 0, 13, "a"), tier(SummaryTier.RECENT, 14, 27, "b")]
    third = plan_tiers(current, 41)
    assert third == [
        TierSpan(SummaryTier.ANCIENT, 0, 13),
        TierSpan(SummaryTier.MIDDLE, 14, 27),
        TierSpan(SummaryTier.RECENT, 28, 41),
    ]
    current = [
        tier(SummaryTier.ANCIENT, 0, 13, "a"),
        tier(SummaryTier.MIDDLE, 14, 27, "b"),
        tier(SummaryTier.RECENT, 28, 41, "c"),
    ]
    assert plan_tiers(current, 55) == [
        TierSpan(SummaryTier.ANCIENT, 0, 27),
        TierSpan(SummaryTier.MIDDLE, 28, 41),
        TierSpan(SummaryTier.RECENT, 42, 55),
    ]


def test_a_pass_must_move_forward() -> None:
    with pytest.raises(ValidationError):
        plan_tiers([tier(SummaryTier.RECENT, 0, 13, "a")], 13)


# -- quality-aware compression --------------------------------------------------------------


def test_low_preservation_keeps_more_raw_and_triggers_later() -> None:
    policy = SummaryPolicy()
    worse = adjust_compression(policy.base_compression(), policy, 0.5)
    assert worse.keep_hot == 8
    assert worse.trigger_tokens == 10_000
    assert worse.every_turns == 20  # never above the hot window


def test_adaptation_is_capped() -> None:
    policy = SummaryPolicy()
    current = policy.base_compression()
    for _ in range(10):
        current = adjust_compression(current, policy, 0.0)
    assert current.keep_hot == policy.max_keep_hot
    assert current.trigger_tokens == 16_000


def test_good_passes_step_back_to_the_base_values() -> None:
    policy = SummaryPolicy()
    worse = adjust_compression(policy.base_compression(), policy, 0.5)
    middling = adjust_compression(worse, policy, 0.95)
    assert middling == worse  # between the thresholds: no change
    back = adjust_compression(worse, policy, 1.0)
    assert back == policy.base_compression()
    assert adjust_compression(back, policy, 1.0) == back
    assert adjust_compression(back, policy, None) == back


# -- the builder -----------------------------------------------------------------------------


def builder(turns: dict[int, Turn], summarizer: RecordingSummarizer) -> RollingBuilder:
    async def source(first: int, through: int) -> list[Turn]:
        return [turns[i] for i in range(first, through + 1) if i in turns]

    return RollingBuilder(
        summarizer, targets=TierTargets(), counter=COUNTER, clock=FakeClock(), turns=source
    )


async def test_every_tier_is_built_from_raw_turns_with_the_older_tier_as_context() -> None:
    turns = {i: turn(i) for i in range(56)}
    summarizer = RecordingSummarizer()
    current = [
        tier(SummaryTier.ANCIENT, 0, 13, "old ancient"),
        tier(SummaryTier.MIDDLE, 14, 27, "old middle"),
        tier(SummaryTier.RECENT, 28, 41, "old recent"),
    ]
    built = await builder(turns, summarizer).build(plan_tiers(current, 55), current)
    assert [(b.span.tier, b.from_raw) for b in built] == [
        (SummaryTier.ANCIENT, True),
        (SummaryTier.MIDDLE, True),
        (SummaryTier.RECENT, True),
    ]
    indexes = [call[0] for call in summarizer.calls]
    assert indexes == [list(range(28)), list(range(28, 42)), list(range(42, 56))]
    # The prior is the tier just built (never the text the tier replaces).
    assert [call[1] for call in summarizer.calls] == [None, "turns 0-27", "turns 28-41"]
    assert [call[2] for call in summarizer.calls] == [300, 500, 700]


async def test_expired_raw_turns_keep_the_older_tiers_as_they_are() -> None:
    # Turns 0..27 have expired (24 h retention); the summaries of them remain.
    turns = {i: turn(i) for i in range(28, 56)}
    summarizer = RecordingSummarizer()
    current = [
        tier(SummaryTier.ANCIENT, 0, 13, "Ancient text."),
        tier(SummaryTier.MIDDLE, 14, 27, "Middle text."),
        tier(SummaryTier.RECENT, 28, 41, "Recent text."),
    ]
    built = await builder(turns, summarizer).build(plan_tiers(current, 55), current)
    ancient, middle, recent = built
    assert not ancient.from_raw
    assert ancient.text.text == "Ancient text. Middle text."
    assert ancient.text.engine == "kept"
    assert middle.from_raw
    assert recent.from_raw
    # Nothing was asked to summarize a summary: only raw spans went to the engine.
    assert [call[0] for call in summarizer.calls] == [list(range(28, 42)), list(range(42, 56))]
    assert summarizer.calls[0][1] == "Ancient text. Middle text."


def test_cut_to_tokens_drops_the_oldest_sentences_without_rewording() -> None:
    text = "First old sentence. Second sentence here. Newest sentence kept."
    cut = cut_to_tokens(text, 8, COUNTER)
    assert cut == "Newest sentence kept."
    assert cut_to_tokens(text, 100, COUNTER) == text
    assert COUNTER.count(cut_to_tokens("one two three four five six seven", 3, COUNTER)) <= 3


def test_turns_that_expired_unsummarized_still_count() -> None:
    # Turns 14..19 expired before a pass; 20..33 are archived: 20 unsummarized by index.
    pending = [(i, 10) for i in range(20, 34)]
    assert len(pending) == 14
    assert plan_pass(pending, 13, BASE) == 27
    assert plan_pass(pending[:-1], 13, BASE) is None  # 19 by index
