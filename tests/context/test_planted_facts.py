"""Issue #10's acceptance: #7's 300-turn conversation assembled at 4k tokens keeps every
planted fact's latest value, and presents no superseded value as current.

Through the public API only: a service from settings (the embedded default — memory hot
tier, SQLite durable tier in ``tmp_path`` — and memory+memory), the offline summary engines
with the store's title catalogue, 300 turns added, the summaries' watermark awaited, then
``session.context(budget=4096, model=...)`` with and without a query, rendered for a
provider. The check (:func:`tiermem.testing.context_facts.check_facts`) is
:mod:`tiermem.summaries.quality`'s functions applied to what is rendered; two tests show
it fails when the context cannot hold the facts (a 300-token budget; summaries never
run), one that it catches a stale value on hand-made windows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.context import ContextWindow
from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.testing.context_facts import FactCheck, check_facts
from tiermem.testing.conversations import Conversation, PlantedFact, generate_conversation
from tiermem.tokens import TiktokenCounter

T0 = datetime(2030, 1, 1, tzinfo=UTC)
MODEL = "claude-3-5-sonnet"
QUERY = "Remind me of my budget, my postcode and the order number."


def settings_for(pairing: str, tmp_path: Path) -> TierMemSettings:
    if pairing == "memory+sqlite":  # the embedded default
        return TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "tm.db"
        )
    return TierMemSettings(hot_backend="memory", durable_backend="memory")


async def add_conversation(
    service: MemoryService, clock: FakeClock, conversation: Conversation
) -> Session:
    session = await service.session("s-planted", user_id="u-1")
    for turn in conversation.turns:
        clock.set(turn.timestamp)
        await session.add_turn(turn.role, list(turn.content), timestamp=turn.timestamp)
        await service.drain()  # background passes finish in turn order: deterministic tiers
    return session


@dataclass
class Served:
    service: MemoryService
    session: Session
    conversation: Conversation
    entities: RuleEntityExtractor


@pytest.fixture(params=["memory+sqlite", "memory+memory"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    conversation = generate_conversation(1, turns=300, facts=30, corrections=10)
    clock = FakeClock(conversation.turns[0].timestamp)
    rules = RuleStructuredExtractor(conversation.known_titles)
    async with MemoryService.from_settings(
        settings_for(request.param, tmp_path),
        clock=clock,
        summarizer=ExtractiveSummarizer(TiktokenCounter(), extractor=rules),
        extractor=rules,
    ) as service:
        session = await add_conversation(service, clock, conversation)
        yield Served(service, session, conversation, rules.entities)


async def test_300_turns_at_4k_keep_every_latest_value_and_nothing_stale(served: Served) -> None:
    conversation = served.conversation
    assert len(conversation.facts) == 30
    assert len(conversation.corrections) == 10
    found = await served.session.summaries(wait_through=len(conversation.turns) - 1)
    assert found.watermarks.summarized_through == len(conversation.turns) - 1
    for query in (None, QUERY):
        window = await served.session.context(query=query, budget=4096, model=MODEL)
        assert window.total_tokens <= window.budget_tokens
        assert window.stats.summary_active
        assert window.stats.structured_memory is not None
        check = check_facts(window, conversation.facts, served.entities)
        assert check == FactCheck(lost=(), stale=()), f"query={query!r}"
        # The latest turn is still there, after the derived memory.
        turns = [i for i in window.items if i.kind == "turn"]
        assert turns[-1].provenance.turn_indexes == (len(conversation.turns) - 1,)


async def test_with_summaries_a_query_still_gets_recall_at_4k(served: Served) -> None:
    """Profile, summaries and structured memory would fill the 20% memory share on their
    own: recall still gets room (the hot share's unused part, a quarter of the memory room
    kept for it), so the turns that answer the query are in the window by provenance."""
    conversation = served.conversation
    await served.session.summaries(wait_through=len(conversation.turns) - 1)
    window = await served.session.context(query=QUERY, budget=4096, model=MODEL)
    assert window.total_tokens <= window.budget_tokens
    assert window.stats.summary_active
    by_slot = {f.slot: f for f in conversation.facts}
    # The turns that state each asked-for slot's latest value (a correction's turn if any).
    evidence = {
        slot: f.corrected_at if f.corrected_at is not None else f.turn_index
        for slot, f in by_slot.items()
        if slot in ("budget", "postcode", "order_id")
    }
    assert len(evidence) == 3
    recalled = {
        index
        for item in window.items
        if item.kind == "recall" and item.provenance.session_id in (None, "s-planted")
        for index in item.provenance.turn_indexes
    }
    hot = {i.provenance.turn_indexes[0] for i in window.items if i.kind == "turn"}
    for slot, index in evidence.items():
        assert index not in hot, slot  # beyond the hot window: only recall can bring it
        assert index in recalled, slot


async def test_the_check_fails_when_the_budget_cannot_hold_the_facts(served: Served) -> None:
    await served.session.summaries(wait_through=len(served.conversation.turns) - 1)
    window = await served.session.context(budget=300, model=MODEL)
    check = check_facts(window, served.conversation.facts, served.entities)
    assert len(check.lost) > 20


async def test_without_summaries_the_hot_window_alone_loses_facts(tmp_path: Path) -> None:
    """Summaries never run (``auto_summarize=False`` and nobody waits for them): the 4k
    window holds only the newest turns, and the check reports the facts said earlier."""
    conversation = generate_conversation(1, turns=300, facts=30, corrections=10)
    clock = FakeClock(conversation.turns[0].timestamp)
    rules = RuleStructuredExtractor(conversation.known_titles)
    async with MemoryService.from_settings(
        settings_for("memory+memory", tmp_path), clock=clock, auto_summarize=False
    ) as service:
        session = await add_conversation(service, clock, conversation)
        window = await session.context(budget=4096, model=MODEL)
        assert not window.stats.summary_active
        check = check_facts(window, conversation.facts, rules.entities)
        assert len(check.lost) > 10


def test_a_superseded_value_in_state_or_in_the_last_word_is_stale() -> None:
    """The checker itself, on hand-made windows: an old value in a summary, or an old value
    in a turn after the correction's turn (or after a summary line quoting a later turn),
    is reported; the correction after it is not."""
    from tiermem.context import ContextSection, assemble_context
    from tiermem.models import TextBlock, Turn

    fact = PlantedFact(
        slot="budget", value="¥8,000", turn_index=0, superseded=("¥5,000",), corrected_at=2
    )
    entities = RuleEntityExtractor()

    def window(summary: str, said: Sequence[str]) -> ContextWindow:
        turns = [
            Turn(index=i, role="user", content=(TextBlock(text=t),), timestamp=T0)
            for i, t in enumerate(said)
        ]
        return assemble_context(
            sections=[ContextSection(kind="summary", text=summary)], turns=turns, budget=2_000
        )

    ok = window("The budget is ¥8,000.", ["My budget is ¥5,000.", "Actually it is ¥8,000."])
    assert check_facts(ok, [fact], entities) == FactCheck(lost=(), stale=())
    old_summary = window("The budget is ¥5,000.", ["Actually my budget is ¥8,000."])
    assert check_facts(old_summary, [fact], entities).stale == ("budget",)
    old_last = window("Shopping for manga.", ["My budget is ¥8,000.", "My budget is ¥5,000."])
    assert check_facts(old_last, [fact], entities) == FactCheck(lost=(), stale=("budget",))
    # A summary line quoting a turn is a dated statement: a correction quoted from turn 2
    # follows the old value said at turn 0; a value quoted from turn 0 does not follow
    # the old value said at turn 1.
    dated = window("- [2] User: Actually my budget is ¥8,000.", ["My budget is ¥5,000."])
    assert check_facts(dated, [fact], entities) == FactCheck(lost=(), stale=())
    undone = window("- [0] User: My budget is ¥8,000.", ["Hi.", "My budget is ¥5,000."])
    assert check_facts(undone, [fact], entities) == FactCheck(lost=(), stale=("budget",))


def test_structured_memory_is_served_before_summaries_when_the_share_is_short() -> None:
    """The memory room holds structured memory whole and cuts the summary: structured
    memory states every current value in a few tokens; a summary cut short loses facts.
    The room is the 20% memory share plus the part of the 65% hot share the conversation
    leaves unused: all of it with no turns, none with turns that fill the hot share."""
    from tiermem.context import ContextSection, assemble_context
    from tiermem.models import TextBlock, Turn

    facts = "; ".join(f"slot{i}=value{i}" for i in range(40))
    sections = [
        ContextSection(kind="summary", text="The user talked about manga. " * 400),
        ContextSection(kind="structured_memory", text=f"Facts: {facts}"),
    ]
    chatty = [
        Turn(
            index=i,
            role="user" if i % 2 == 0 else "assistant",
            content=(TextBlock(text=f"turn {i} " + "chatter " * 40),),
            timestamp=T0,
        )
        for i in range(40)
    ]
    # budget 2,000: a 400-token memory share, a 1,300-token hot share.
    for turns, bound in (([], 400 + 1_300), (chatty, 400)):
        window = assemble_context(sections=sections, turns=turns, budget=2_000)
        derived = [i for i in window.items if i.kind in ("summary", "structured_memory")]
        kinds = {i.kind: i for i in derived}
        assert [i.kind for i in derived] == ["summary", "structured_memory"]  # layout kept
        assert not kinds["structured_memory"].truncated
        assert kinds["summary"].truncated
        assert sum(i.tokens for i in derived) <= bound
