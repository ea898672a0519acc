"""The jobs' cheaper bookkeeping (issue #8) counts what it counted before: the characters a
kept turn holds (one plain text block without a generator) and the turns a pass takes from
the previous pass's (a miss still means "read them")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.background import BackgroundWork
from tiermem.clock import FakeClock
from tiermem.models import NewTurn, SessionRecord, Turn
from tiermem.models.content import (
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_of,
)
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.summaries import SummaryJobs
from tiermem.summaries.jobs import SUMMARY_RECORD, _chars
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.tokens import TiktokenCounter

WHEN = datetime(2026, 1, 5, tzinfo=UTC)

_BLOCKS = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=40)),
    st.builds(ReasoningBlock, text=st.text(max_size=20)),
    st.builds(
        ToolUseBlock,
        tool_use_id=st.just("t1"),
        name=st.text(min_size=1, max_size=8),
        input=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    ),
    st.builds(
        ToolResultBlock,
        tool_use_id=st.just("t1"),
        content=st.tuples(st.builds(TextBlock, text=st.text(max_size=10))),
    ),
)


def _chars_before(turn: Turn) -> int:
    """The count as written before the one-block shortcut."""
    return sum(
        len(block.text) if type(block) is TextBlock else len(text_of((block,)))
        for block in turn.content
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_BLOCKS, min_size=1, max_size=4))
def test_chars_counts_what_it_counted_before(blocks: list[object]) -> None:
    role = "assistant" if any(isinstance(b, ToolUseBlock) for b in blocks) else "user"
    if any(isinstance(b, ToolResultBlock) for b in blocks):
        role = "user"
    turn = NewTurn(role=role, content=tuple(blocks), timestamp=WHEN).with_index(0)  # type: ignore[arg-type]
    assert _chars(turn) == _chars_before(turn)


def _turn(index: int) -> Turn:
    return NewTurn(
        role="user", content=(TextBlock(text=f"turn {index}"),), timestamp=WHEN
    ).with_index(index)


def test_earlier_turns_come_from_the_previous_pass_only_when_all_are_held() -> None:
    clock = FakeClock(WHEN)
    jobs = SummaryJobs(
        MemoryDurableStore(clock=clock),
        summarizer=ExtractiveSummarizer(TiktokenCounter()),
        extractor=RuleStructuredExtractor(),
        background=BackgroundWork(),
        clock=clock,
        tokens=TiktokenCounter(),
    )
    record = SessionRecord(kind=SUMMARY_RECORD, data={}, version=3, updated_at=WHEN)
    held = {i: _turn(i) for i in (*range(10, 20), *range(21, 30))}  # turn 20 missing
    jobs._keep_turns("s", 3, held, 29, WHEN)
    assert jobs._earlier_turns("s", record, 12, 18) == ([held[i] for i in range(12, 19)], WHEN)
    jobs._keep_turns("s", 3, held, 29, WHEN)
    assert jobs._earlier_turns("s", record, 15, 25) is None  # a gap: read them
    jobs._keep_turns("s", 3, held, 29, WHEN)
    assert jobs._earlier_turns("s", record, 8, 12) is None  # before what is held
    jobs._keep_turns("s", 3, held, 29, WHEN)
    clock.advance(timedelta(hours=1))
    assert jobs._earlier_turns("s", record, 12, 18) is None  # held too long
