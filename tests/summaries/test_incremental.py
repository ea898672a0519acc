"""What keeps a pass's cost flat in the session's length (issues #8 and #9): kept analyses
give the same answers as fresh ones, a verbatim engine's ancient tier reads only the turns
rolled into it, and a long session's pass reads a bounded part of the archive."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

from tiermem.clock import FakeClock
from tiermem.models import TextBlock, Turn
from tiermem.models.content import ToolResultBlock, text_of
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries._lru import Lru, counted, text_key
from tiermem.summaries.models import SummaryText, SummaryTier
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.rolling import RollingBuilder, SummaryPolicy, TierTargets, plan_tiers
from tiermem.summaries.structured import (
    RuleStructuredExtractor,
    stated_in,
    states_value,
    turn_said,
)
from tiermem.summaries.validate import lost_slots, slot_items
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
LINE = re.compile(r"^- \[(\d+)\] [^:]+: (.*)$")


# -- kept analyses ---------------------------------------------------------------------------


def test_lru_drops_the_oldest_past_its_entries_and_its_characters() -> None:
    calls: list[str] = []

    def compute(key: str) -> str:
        calls.append(key)
        return key * 10

    cache: Lru[str, str] = Lru(3, max_chars=25, weigh=len)
    assert cache.get("a", lambda: compute("a")) == "a" * 10
    assert cache.get("a", lambda: compute("a")) == "a" * 10
    assert calls == ["a"]
    cache.get("b", lambda: compute("b"))
    cache.get("c", lambda: compute("c"))  # 30 characters: "a" goes
    assert len(cache) == 2
    cache.get("a", lambda: compute("a"))
    assert calls == ["a", "b", "c", "a"]
    small: Lru[int, int] = Lru(2)
    for key in range(5):
        small.get(key, lambda key=key: key)  # type: ignore[misc]
    assert len(small) == 2


def test_a_long_text_is_keyed_by_digest_and_a_changed_one_is_a_new_key() -> None:
    long = "x" * 1000
    assert text_key("short") == "short"
    assert isinstance(text_key(long), bytes)
    assert text_key(long) == text_key("x" * 1000)
    assert text_key(long) != text_key("x" * 999 + "y")


def test_kept_readings_are_the_rules_readings() -> None:
    conversation = generate_conversation(3, turns=120, facts=10, corrections=3)
    extractor = RuleStructuredExtractor(conversation.known_titles)
    for turn in conversation.indexed():
        text = turn_said(turn)
        user = turn.role == "user"
        assert extractor.read(text, role=turn.role) == list(extractor._read(text, user=user))
        assert extractor.read(text, role=turn.role) == list(extractor._read(text, user=user))


def test_salient_reading_stops_early_and_agrees_with_the_full_reading() -> None:
    conversation = generate_conversation(4, turns=200, facts=10, corrections=3, tool_calls=8)
    extractor = RuleStructuredExtractor()
    results = [
        text_of(block.content)
        for turn in conversation.turns
        for block in turn.content
        if isinstance(block, ToolResultBlock)
    ]
    assert results
    for text in results:
        full = [r for r in extractor._read(text, user=False) if r.salient]
        for limit in (1, 2, 5):
            assert extractor.read_salient(text, role="assistant", limit=limit) == full[:limit]
    assert extractor.read_salient(results[0], role="assistant", limit=0) == []


def test_stated_in_agrees_with_states_value() -> None:
    text = (
        "- [3] User: My budget is ¥8,000.\n- [5] User: Is Berserk vol 42 in stock?\n"
        "- [7] User: My postcode is 150-0001.\n- [9] User: order ORD-48213 please"
    )
    values = [
        ("¥8,000", "budget"),
        ("8000円", "budget"),
        ("¥18,000", "budget"),
        ("42", "volume"),
        ("3", "volume"),
        ("150-0001", "postcode"),
        ("ORD-48213", "order_id"),
        ("ORD-99999", "order_id"),
        ("Berserk", None),
        ("", None),
    ]
    check = stated_in(text)
    for value, slot in values:
        assert check(value, slot) == states_value(text, value, slot=slot), (value, slot)


def test_counted_counts_like_the_counter() -> None:
    for text in ("", "hello world", "予算は8000円です " * 40):
        assert counted(COUNTER, text) == COUNTER.count(text)
        assert counted(COUNTER, text) == COUNTER.count(text)


def test_lost_slots_agrees_with_the_item_by_item_rule() -> None:
    conversation = generate_conversation(5, turns=120, facts=12, corrections=4)
    extractor = RuleStructuredExtractor(conversation.known_titles)
    structured = extractor.extract_sync(conversation.indexed())
    items = slot_items(structured, 119)
    assert items
    summary = ExtractiveSummarizer(COUNTER).summarize_sync(
        conversation.indexed()[:60], target_tokens=300
    )
    from tiermem.summaries.validate import mentions

    assert lost_slots(summary, items) == [i for i in items if not mentions(summary, i)]


# -- the rolled ancient tier -----------------------------------------------------------------


def turn(index: int, text: str) -> Turn:
    return Turn(
        index=index,
        role="user" if index % 2 == 0 else "assistant",
        content=(TextBlock(text=text),),
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        token_count=COUNTER.count(text),
    )


def said(i: int) -> str:
    return f"My code for item {i} is CODE-{i:04d}. I'll take item {i}."


async def test_a_verbatim_engine_rolls_ancient_from_its_lines_and_the_rolled_turns() -> None:
    turns = {i: turn(i, said(i)) for i in range(56)}
    reads: list[tuple[int, int]] = []

    async def source(first: int, through: int) -> list[Turn]:
        reads.append((first, through))
        return [turns[i] for i in range(first, through + 1) if i in turns]

    engine = ExtractiveSummarizer(COUNTER)
    old_ancient = engine.summarize_sync([turns[i] for i in range(14)], target_tokens=300)
    clock = FakeClock()

    def text(kind: SummaryTier, first: int, through: int, body: str) -> SummaryText:
        return SummaryText(
            tier=kind,
            text=body,
            tokens=COUNTER.count(body),
            first_index=first,
            through_index=through,
            created_at=clock.now(),
            engine=engine.name,
        )

    current = [
        text(SummaryTier.ANCIENT, 0, 13, old_ancient),
        text(SummaryTier.MIDDLE, 14, 27, "- [20] User: middle text."),
        text(SummaryTier.RECENT, 28, 41, "- [30] User: recent text."),
    ]
    builder = RollingBuilder(
        engine, targets=TierTargets(), counter=COUNTER, clock=clock, turns=source
    )
    spans = plan_tiers(current, 55)
    assert builder.first_needed(spans, current) == 14
    ancient, middle, recent = await builder.build(spans, current)
    assert (ancient.span.first, ancient.span.through) == (0, 27)
    assert ancient.rolled
    assert ancient.from_raw
    assert (0, 27) not in reads
    assert (14, 27) in reads
    assert not middle.rolled
    assert not recent.rolled
    # Every line of the new ancient tier is a sentence of a raw turn of its span, as said.
    lines = ancient.text.text.splitlines()
    assert lines
    for line in lines:
        match = LINE.match(line)
        assert match is not None, line
        index, sentence = int(match.group(1)), match.group(2)
        assert 0 <= index <= 27
        assert sentence in said(index)
    assert ancient.text.tokens <= 300


async def test_an_ancient_tier_kept_from_expired_turns_is_not_rolled() -> None:
    engine = ExtractiveSummarizer(COUNTER)
    clock = FakeClock()

    async def source(first: int, through: int) -> Sequence[Turn]:
        return []

    def text(kind: SummaryTier, first: int, through: int, engine_name: str) -> SummaryText:
        return SummaryText(
            tier=kind,
            text="Old text.",
            tokens=3,
            first_index=first,
            through_index=through,
            created_at=clock.now(),
            engine=engine_name,
        )

    current = [
        text(SummaryTier.ANCIENT, 0, 13, "kept"),
        text(SummaryTier.MIDDLE, 14, 27, engine.name),
        text(SummaryTier.RECENT, 28, 41, engine.name),
    ]
    builder = RollingBuilder(
        engine, targets=TierTargets(), counter=COUNTER, clock=clock, turns=source
    )
    spans = plan_tiers(current, 55)
    assert builder.first_needed(spans, current) == 0
    ancient = (await builder.build(spans, current))[0]
    assert not ancient.rolled
    assert not ancient.from_raw
    assert ancient.text.engine == "kept"


async def test_a_long_sessions_pass_reads_a_bounded_part_of_the_archive() -> None:
    """The pass's archive read starts at the previous middle tier, not at turn 0, so its
    cost does not grow with the session (a real store, its reads recorded)."""
    clock = FakeClock()
    durable = MemoryDurableStore(clock=clock)
    starts: list[tuple[int, int]] = []
    real = durable.get_turns

    async def recording(session_id: str, start: int, end: int | None = None) -> list[Turn]:
        starts.append((start, end if end is not None else 1_000_000))
        return list(await real(session_id, start, end))

    durable.get_turns = recording  # type: ignore[method-assign,assignment]
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        durable,
        clock=clock,
        auto_detect=False,
        index_turns=False,
        summary_policy=SummaryPolicy(min_preservation=0.0, recover_preservation=0.0),
    )
    try:
        session = await memory.session("s-long", user_id="u-1")
        for i in range(240):
            await session.add_turn("user" if i % 2 == 0 else "assistant", said(i))
            await memory.drain()
        found = await session.summaries()
        assert found.watermarks.passes >= 10
        ancient = found.tier(SummaryTier.ANCIENT)
        assert ancient is not None
        assert ancient.first_index == 0
        widest = max(end - start for start, end in starts[-5:])
        assert widest <= 3 * memory.summaries.policy.every_turns + 12
    finally:
        await memory.aclose()
