"""Session handoff into long-term memory: on close, on expiry through the sweeper, and
idempotent across crashes -- including a sweeper that dies mid-handoff or abandons its
lease on the production pairing (real Redis + DynamoDB Local via scripts/test.sh)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import open_pairing
from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError
from tiermem.models import MemoryRecord, Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import HANDOFF_RECORD
from tiermem.summaries.handoff import detect_sentiment

CONVERSATION = [
    ("user", "Hi! I'm looking for Berserk volume 42, my budget is ¥5,000."),
    ("assistant", "Berserk vol 42 is ¥990 and in stock."),
    ("user", "Actually my budget is ¥8,000, not ¥5,000. My favorite genre is seinen."),
    ("assistant", "Noted. Anything else?"),
    ("user", "Great, thanks, that was helpful!"),
]


def service(clock: FakeClock, **kw: Any) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, **kw
    )


@pytest.fixture
async def memory() -> AsyncIterator[MemoryService]:
    svc = service(FakeClock(), auto_detect=False)
    yield svc
    await svc.aclose()


async def converse(memory: MemoryService, session_id: str, user: str) -> Any:
    session = await memory.session(session_id, user_id=user)
    for role, text in CONVERSATION:
        await session.add_turn(role, text)
    await memory.drain()
    return session


async def summaries_of(memory: MemoryService, user: str) -> list[MemoryRecord]:
    return await memory.longterm.list(
        user, types=["interaction_summary"], include_superseded=True, limit=1000
    )


def test_sentiment_from_the_users_words() -> None:
    def turns(*texts: str) -> list[Turn]:
        from datetime import UTC, datetime

        from tiermem.models import TextBlock

        return [
            Turn(index=i, role="user", content=(TextBlock(text=t),), timestamp=datetime.now(UTC))
            for i, t in enumerate(texts)
        ]

    assert detect_sentiment(turns("Thanks, great help!")) == "positive"
    assert detect_sentiment(turns("This is terrible, I want a refund.")) == "negative"
    assert detect_sentiment(turns("Where is my order?")) == "neutral"
    assert detect_sentiment(turns("Thanks!", "But the box arrived damaged.")) == "mixed"


async def test_close_writes_summary_topics_sentiment_and_preferences(
    memory: MemoryService,
) -> None:
    session = await converse(memory, "s-close", "u-close")
    await session.close()
    (record,) = await summaries_of(memory, "u-close")
    assert record.provenance.source == "handoff"
    assert record.provenance.session_id == "s-close"
    assert record.content.startswith("Session on 2030-01-01: ")
    assert "8,000" in record.content or "8000" in record.content
    assert record.metadata["sentiment"] == "positive"
    assert record.metadata["topics"] == ["budget", "favorite genre"]
    facts = record.metadata["facts"]
    assert isinstance(facts, dict)
    assert facts["budget"] == "¥8,000"
    assert record.metadata["superseded_values"] == {"budget": ["¥5,000"]}
    assert record.metadata["turn_range"] == [0, 4]
    preferences = await memory.longterm.preferences("u-close")
    handed = [p for p in preferences if p.provenance.source == "handoff"]
    assert handed
    assert all(p.provenance.session_id == "s-close" for p in handed)
    assert any("seinen" in p.content for p in handed)
    stored = await memory.tiers.durable.get_record("s-close", HANDOFF_RECORD)
    assert stored is not None
    assert stored.data["status"] == "done"
    assert stored.data["memory_id"] == record.memory_id


async def test_a_second_handoff_writes_nothing(memory: MemoryService) -> None:
    session = await converse(memory, "s-twice", "u-twice")
    await session.close()
    view = await memory.tiers.durable_view("s-twice")
    assert view is not None
    before = await summaries_of(memory, "u-twice")
    await memory.handoff(view)
    await session.close()
    assert await summaries_of(memory, "u-twice") == before
    # The expiry sweeper later finds the closed session: still nothing new.
    memory.clock.advance(timedelta(hours=3))  # type: ignore[attr-defined]
    swept = await memory.sweeper().sweep_once(limit=100)
    assert "s-twice" in swept.handed_off
    assert await summaries_of(memory, "u-twice") == before


async def test_a_crash_after_prepare_is_finished_with_the_prepared_content(
    memory: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await converse(memory, "s-prep", "u-prep")
    view = await memory.tiers.durable_view("s-prep")
    assert view is not None
    calls = 0
    original = memory.longterm.remember

    async def dies(*args: Any, **kwargs: Any) -> MemoryRecord:
        nonlocal calls
        calls += 1
        raise BackendUnavailableError("the worker lost the store", backend="memory")

    # Fault injection: the process dies between the prepare and the apply phase.
    monkeypatch.setattr(memory.longterm, "remember", dies)
    with pytest.raises(BackendUnavailableError):
        await memory.handoff(view)
    prepared = await memory.tiers.durable.get_record("s-prep", HANDOFF_RECORD)
    assert prepared is not None
    assert prepared.data["status"] == "prepared"
    monkeypatch.setattr(memory.longterm, "remember", original)
    # More turns came in meanwhile: the retry still writes what was prepared, once.
    await session.add_turn("user", "One more thing about Vagabond.")
    await memory.handoff(view)
    await memory.handoff(view)
    (record,) = await summaries_of(memory, "u-prep")
    assert record.content == prepared.data["summary"]
    assert calls == 1


async def test_a_late_handoff_never_overwrites_a_newer_preference(
    memory: MemoryService,
) -> None:
    await converse(memory, "s-old", "u-late")
    memory.clock.advance(timedelta(hours=1))  # type: ignore[attr-defined]
    newer = await memory.longterm.upsert_preference("u-late", "favorite_genre", "shonen")
    view = await memory.tiers.durable_view("s-old")
    assert view is not None
    await memory.handoff(view)
    current = await memory.longterm.get_preference("u-late", "favorite_genre")
    assert current is not None
    assert current.version == newer.version
    assert current.metadata["preference_value"] == "shonen"


async def test_auto_detected_preferences_are_not_written_twice() -> None:
    memory = service(FakeClock())  # auto-detection on
    try:
        session = await converse(memory, "s-auto", "u-auto")
        before = {p.memory_id: p.version for p in await memory.longterm.preferences("u-auto")}
        assert before
        await session.close()
        after = {p.memory_id: p.version for p in await memory.longterm.preferences("u-auto")}
        assert after == before
    finally:
        await memory.aclose()


# -- across a sweeper crash, on the production pairing ---------------------------------------


@pytest.mark.parametrize("crash", ["raises mid-handoff", "abandons its lease"])
@pytest.mark.parametrize("name", ["redis+dynamodb", "memory+sqlite"])
async def test_handoff_survives_a_sweeper_crash(
    name: str, crash: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pairing(name, tmp_path) as pairing:
        memory = pairing.service(auto_detect=False)
        try:
            user = f"u-sweep-{crash[:5]}"
            session = await converse(memory, f"s-sweep-{crash[:5]}", user)
            pairing.clock.advance(timedelta(hours=3))  # the hot session expired
            if crash == "raises mid-handoff":

                async def dies(*args: Any, **kwargs: Any) -> MemoryRecord:
                    raise BackendUnavailableError("worker died", backend="test")

                monkeypatch.setattr(memory.longterm, "remember", dies)
                first = await memory.sweeper(owner="doomed").sweep_once(limit=100)
                assert session.id in first.failed
                monkeypatch.undo()
                record = await pairing.durable.get_record(session.id, HANDOFF_RECORD)
                assert record is not None
                assert record.data["status"] == "prepared"
            else:
                claimed = await pairing.hot.claim_expired(
                    owner="doomed", lease=memory.tiers.config.sweep_lease, limit=100
                )
                assert session.id in claimed  # ...and the worker is gone
            survivor = memory.sweeper(owner="survivor")
            assert session.id not in (await survivor.sweep_once(limit=100)).handed_off
            pairing.clock.advance(memory.tiers.config.sweep_lease + timedelta(seconds=1))
            done = await survivor.sweep_once(limit=100)
            assert session.id in done.handed_off
            (summary,) = await summaries_of(memory, user)
            assert summary.provenance.session_id == session.id
            record = await pairing.durable.get_record(session.id, HANDOFF_RECORD)
            assert record is not None
            assert record.data["status"] == "done"
            # Nothing is left to claim, and a forced repeat writes nothing.
            assert session.id not in (await survivor.sweep_once(limit=100)).handed_off
            view = await memory.tiers.durable_view(session.id)
            assert view is not None
            await memory.handoff(view)
            assert len(await summaries_of(memory, user)) == 1
        finally:
            await memory.aclose()
