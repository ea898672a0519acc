"""Earlier sessions' summaries as recall sources (``tiermem.summaries.recall_docs``), end to
end through :class:`MemoryService` on each backend (memory, SQLite, Redis, Redis Cluster; the
summaries come from the offline extractive engine): a fact of a session whose raw turns have
expired (24 h) is recalled from its summary (30 days) with the summary's provenance; a
corrected value's stale line is not recalled after the next pass; a redaction removes the
lines; a line the index kept by mistake is never returned."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import open_backend, server_url
from tiermem.clock import FakeClock
from tiermem.context import ContextWindow
from tiermem.longterm.index import IndexedDoc, SearchIndex
from tiermem.longterm.recall import parse_summary_doc_id, summary_doc_id
from tiermem.service import MemoryService, Session
from tiermem.summaries.jobs import LINES_RECORD, LINES_REFRESH
from tiermem.summaries.models import SummaryText, SummaryTier
from tiermem.summaries.recall_docs import summary_lines

BACKENDS = ["memory", "sqlite", "redis", "redis-cluster"]
T0 = datetime(2030, 1, 7, 10, tzinfo=UTC)
FACT = "My address is 2-3 Kita, Sapporo 060-0001."
"""A sentence the offline (extractive) engine keeps in its summary."""
QUESTION = "What was my delivery address again?"


@dataclass
class Deployment:
    memory: MemoryService
    clock: FakeClock
    index: SearchIndex


@pytest.fixture(params=BACKENDS)
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Deployment]:
    name = request.param
    clock = FakeClock(T0)
    pair = await open_backend(name, clock, tmp_path)
    index: SearchIndex | None = None
    if name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex

        index = SQLiteIndex(tmp_path / "tiermem.db", clock=clock)
    elif name.startswith("redis"):
        from tests.backends.redis import fresh_prefix
        from tiermem.longterm.index_redis import RedisIndex

        cluster = name == "redis-cluster"
        index = RedisIndex.from_url(
            server_url(name), prefix=fresh_prefix(), clock=clock, cluster=cluster
        )
    memory = MemoryService(pair.hot, pair.durable, clock=clock, index=index, auto_detect=False)
    try:
        yield Deployment(memory, clock, memory.longterm.index)
    finally:
        await memory.aclose()
        await pair.hot.aclose()
        await pair.durable.aclose()


async def _earlier_session(memory: MemoryService, user: str) -> tuple[Session, int]:
    """A session that says its address at turn 4 and a budget at turn 2, summarized
    through its last turn. Returns it and its last turn index."""
    session = await memory.session(f"s-{uuid.uuid4().hex[:8]}", user_id=user)
    turns = [
        ("user", "Hi, I'm looking for some manga gifts."),
        ("assistant", "Happy to help! Who are they for?"),
        ("user", "My budget is ¥5,000 for this order."),
        ("assistant", "Noted."),
        ("user", FACT),
        ("assistant", "Got it, we ship to Sapporo in two days."),
    ]
    for i in range(8):
        turns += [("user", f"Is Berserk volume {i + 1} in stock?"), ("assistant", "Yes.")]
    for role, text in turns:
        await session.add_turn(role, text)
    await memory.drain()
    await session.summaries(wait_through=len(turns) - 1)
    return session, len(turns) - 1


async def _ask(memory: MemoryService, user: str, question: str) -> ContextWindow:
    later = await memory.session(f"s-{uuid.uuid4().hex[:8]}", user_id=user)
    await later.add_turn("user", question)
    await memory.drain()
    return await later.context(query=question, budget=2048)


def _recalled(window: ContextWindow) -> list[tuple[str, tuple[int, ...], str | None, str]]:
    return [
        (i.provenance.session_id or "", i.provenance.turn_indexes, i.provenance.summary_id, i.text)
        for i in window.items
        if i.kind == "recall"
    ]


async def test_a_fact_of_a_session_whose_turns_expired_is_recalled_from_its_summary(
    deployment: Deployment,
) -> None:
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, last = await _earlier_session(memory, user)
    assert FACT in (await earlier.summaries()).text, "the engine summarized the fact"

    clock.advance(timedelta(days=3))  # past the turns' 24 h, within the summaries' 30 days
    assert await memory.tiers.durable.get_turns(earlier.id, 0, last + 1) == []
    window = await _ask(memory, user, QUESTION)

    recalled = _recalled(window)
    from_summary = [r for r in recalled if r[0] == earlier.id and "Sapporo" in r[3]]
    assert len(from_summary) == 1, recalled  # the line and structured item of turn 4: one
    _session_id, indexes, summary_id, text = from_summary[0]
    assert indexes == (4,)
    # The sentence as said (the summary line), not the structured item of the same turn.
    assert summary_id is not None
    assert summary_id.startswith(f"{earlier.id}:summary:v")
    assert f"Session {earlier.id} — Monday 2030-01-07:" in text
    assert "[summary, turn 4] User: My address is 2-3 Kita, Sapporo 060-0001." in text
    item = next(i for i in window.items if i.kind == "recall" and i.provenance.turn_indexes)
    assert item.tokens > 0
    assert item.provenance.tier == "session"

    # Past the summaries' retention, nothing of the session is left to recall.
    clock.advance(timedelta(days=30))
    assert not [r for r in _recalled(await _ask(memory, user, QUESTION)) if r[0] == earlier.id]


async def test_a_corrected_value_is_not_recalled_from_the_stale_line_after_the_next_pass(
    deployment: Deployment,
) -> None:
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, last = await _earlier_session(memory, user)
    stale = "My budget is ¥5,000 for this order."
    assert stale in (await earlier.summaries()).text
    await earlier.add_turn("user", "Actually my budget is ¥8,000 now, not ¥5,000.")
    await earlier.add_turn("assistant", "Updated.")
    await memory.drain()
    await earlier.summaries(wait_through=last + 2)
    assert stale not in (await earlier.summaries()).text
    # The lines are written to the index again at most every LINES_REFRESH (meanwhile
    # recall checks every line against the records): the first pass after that removes
    # the previous version's line (checked before any recall, which would also remove a
    # line it meets that the records no longer hold).
    clock.advance(LINES_REFRESH)
    await earlier.add_turn("user", "Is Berserk volume 9 in stock?")
    await earlier.add_turn("assistant", "Yes.")
    await memory.drain()
    await earlier.summaries(wait_through=last + 4)
    found = await deployment.index.search(user, "budget 5,000 order", kinds=["chunk"], limit=20)
    stale_id = summary_doc_id(earlier.id, summary_lines([_tier(f"- [2] User: {stale}")])[0].key)
    assert stale_id not in {h.doc_id for h in found}
    assert any(parse_summary_doc_id(h.doc_id) for h in found)

    clock.advance(timedelta(days=2))
    recalled = _recalled(await _ask(memory, user, "What is my budget for the order?"))
    texts = "\n".join(r[3] for r in recalled)
    assert "¥8,000" in texts, recalled
    assert stale not in texts
    assert not [r for r in recalled if r[0] == earlier.id and r[1] == (2,)]


async def test_redacting_a_turn_removes_its_summary_lines_from_recall_and_the_index(
    deployment: Deployment,
) -> None:
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _ = await _earlier_session(memory, user)
    assert await deployment.index.search(user, "Kita Sapporo", kinds=["chunk"], limit=5)

    await earlier.redact_turn(4)
    # Removed by the redaction itself (before any recall could meet and remove them).
    assert await deployment.index.search(user, "Kita Sapporo", kinds=["chunk"], limit=5) == []
    clock.advance(timedelta(days=2))
    recalled = _recalled(await _ask(memory, user, QUESTION))
    assert not [r for r in recalled if "Sapporo" in r[3]], recalled


async def test_a_line_the_index_kept_by_mistake_is_never_recalled_and_is_removed(
    deployment: Deployment,
) -> None:
    """A crash between a pass's record write and its index cleanup leaves the previous
    version's line indexed: planted here by hand, as no real failure can be timed there."""
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _ = await _earlier_session(memory, user)
    ghost = "My address is 5 Naha, Okinawa 900-0001."
    (line,) = summary_lines([_tier(f"- [4] User: {ghost}")])
    ghost_id = summary_doc_id(earlier.id, line.key)
    await deployment.index.upsert(
        [IndexedDoc(user_id=user, doc_id=ghost_id, kind="chunk", text=ghost, created_at=T0)]
    )
    clock.advance(timedelta(days=2))
    recalled = _recalled(await _ask(memory, user, "Did I give you an address in Okinawa?"))
    assert not [r for r in recalled if "Okinawa" in r[3]], recalled
    await memory.longterm.recaller.aclose()  # wait for the background repair
    found = await deployment.index.search(user, "Okinawa", kinds=["chunk"], limit=5)
    assert ghost_id not in {h.doc_id for h in found}


def _tier(text: str) -> SummaryText:
    return SummaryText(
        tier=SummaryTier.RECENT,
        text=text,
        tokens=1,
        first_index=0,
        through_index=10,
        created_at=T0,
        engine="test",
    )


async def test_within_the_turns_retention_the_raw_turn_stands_for_its_summary_line(
    deployment: Deployment,
) -> None:
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _ = await _earlier_session(memory, user)
    clock.advance(timedelta(hours=2))  # the turns are still kept
    recalled = _recalled(await _ask(memory, user, QUESTION))
    of_turn_4 = [r for r in recalled if r[0] == earlier.id and r[1] == (4,)]
    assert len(of_turn_4) == 1, recalled
    assert of_turn_4[0][2] is None  # the archived turn, not a summary id
    assert "[user, turn 4] My address is 2-3 Kita, Sapporo 060-0001." in of_turn_4[0][3]


async def test_clearing_a_session_removes_its_summary_lines_from_the_index(
    deployment: Deployment,
) -> None:
    memory = deployment.memory
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _ = await _earlier_session(memory, user)
    assert await deployment.index.search(user, "Kita Sapporo", kinds=["chunk"], limit=5)
    await earlier.clear()
    assert await deployment.index.search(user, "Kita Sapporo", kinds=["chunk"], limit=5) == []


async def test_an_index_warmed_from_the_store_loads_the_summary_lines() -> None:
    """A deployment without a search index of its own (DynamoDB alone) warms one per user
    from the durable store: after a restart, earlier sessions' summary lines are loaded too
    (here on the in-memory store; the loader reads only the session list and records)."""
    from tiermem.longterm.index_memory import WarmingIndex
    from tiermem.longterm.recall import memory_loader, turn_loader
    from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

    clock = FakeClock(T0)
    hot, durable = MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock)
    before = MemoryService(hot, durable, clock=clock, auto_detect=False)
    earlier, _ = await _earlier_session(before, "u1")
    await before.drain()

    clock.advance(timedelta(days=3))
    warming = WarmingIndex([memory_loader(durable), turn_loader(durable)], clock=clock)
    after = MemoryService(hot, durable, clock=clock, index=warming, auto_detect=False)
    try:
        recalled = _recalled(await _ask(after, "u1", QUESTION))
        assert [r for r in recalled if r[0] == earlier.id and r[1] == (4,) and r[2]], recalled
    finally:
        await after.aclose()


async def _more_turns(memory: MemoryService, session: Session, first: int, count: int) -> int:
    for i in range(first, first + count):
        await session.add_turn("user", f"Is Vagabond volume {i} in stock?")
        await session.add_turn("assistant", f"Volume {i} ships tomorrow.")
    await memory.drain()
    last = (await session.metadata()).turn_count - 1
    await session.summaries(wait_through=last)
    return last


async def test_passes_write_lines_at_most_every_refresh_and_the_claim_names_them(
    deployment: Deployment,
) -> None:
    # Writing every pass's lines cost more than the turn itself on Redis: a pass writes
    # the lines only when LINES_REFRESH has passed since the last time (the raw turns are
    # searchable meanwhile), then all of them (renewing their expiry) and removes the ones
    # gone; the summary_lines record names every document the index may hold. A line
    # the summary keeps stays recallable past its first expiry.
    memory, clock = deployment.memory, deployment.clock
    jobs = memory.summaries
    recall = jobs.recall
    assert recall is not None
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _last = await _earlier_session(memory, user)

    async def lines() -> set[str]:
        current = await jobs.current_for_recall(earlier.id, True)
        return {ln.key for ln in recall.lines(current.tiers, current.structured)}

    async def claimed() -> set[str]:
        rec = await memory.tiers.durable.get_record(earlier.id, LINES_RECORD)
        assert rec is not None
        assert isinstance(rec.data, dict)
        keys = rec.data["keys"]
        assert isinstance(keys, list)
        return {str(k) for k in keys}

    first, first_claim = await lines(), await claimed()
    assert first_claim, "the session's first pass wrote its lines"
    indexed, removed = recall.counters.indexed, recall.counters.removed
    await _more_turns(memory, earlier, 100, 12)
    assert await lines() != first, "the pass changed the summary"
    assert (recall.counters.indexed, recall.counters.removed) == (indexed, removed)
    assert await claimed() == first_claim

    clock.advance(LINES_REFRESH)
    await _more_turns(memory, earlier, 200, 12)
    # (Auto passes run while the turns arrive: the refresh is the first of them.)
    refreshed = await claimed()
    assert refreshed != first_claim
    assert recall.counters.indexed - indexed >= len(refreshed), "a refresh writes every line"
    assert recall.counters.removed > removed, "and removes the lines gone"

    # Past the first pass's 30 days: the refresh moved the lines' expiry with the records'.
    retention = jobs.policy.record_retention
    assert retention is not None
    clock.advance(retention - LINES_REFRESH)
    recalled = [r for r in _recalled(await _ask(memory, user, QUESTION)) if r[0] == earlier.id]
    assert any("Sapporo" in r[3] for r in recalled), recalled


async def test_closing_a_session_writes_its_last_lines(deployment: Deployment) -> None:
    memory, clock = deployment.memory, deployment.clock
    user = f"u-{uuid.uuid4().hex[:8]}"
    earlier, _last = await _earlier_session(memory, user)
    await earlier.add_turn("user", "Ship the next order to 7-1 Minami, Hakodate 040-0001 please.")
    await earlier.add_turn("assistant", "Will do.")
    await memory.drain()
    await earlier.close()
    clock.advance(timedelta(days=3))  # the raw turns are gone
    recalled = _recalled(await _ask(memory, user, "Where should the next order ship, Hakodate?"))
    assert any(r[0] == earlier.id and "Hakodate" in r[3] for r in recalled), recalled
