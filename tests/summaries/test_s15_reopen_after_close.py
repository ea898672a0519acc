"""A closed session reopens when it gets a turn, and its next handoff covers the whole
session: one live interaction summary (the earlier one superseded, kept in history), the
preferences of the new turns, two-phase idempotency across a crash of the second handoff,
the expiry sweeper's handoff of a reopened session, a handle that did not see the close,
and a redaction after the second handoff. On memory+memory, the embedded pairing
(memory+sqlite) and the production one (redis+dynamodb: the ``handoff`` record gained
``previous_memory_id``). Every test fails on the code before (b54ac72), where a turn
after a close left ``closed_at`` set and a second close handed off nothing new."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import open_pairing
from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError
from tiermem.models import MemoryRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import HANDOFF_RECORD

PAIRINGS = ["memory+memory", "memory+sqlite", "redis+dynamodb"]
FIRST = "I prefer seinen"
LATER = "Also, I prefer hardcover editions. Is Berserk vol 3 in stock?"


@asynccontextmanager
async def deployment(
    name: str, tmp_path: Path, **engines: Any
) -> AsyncIterator[tuple[MemoryService, FakeClock]]:
    if name == "memory+memory":
        clock = FakeClock()
        memory = MemoryService(
            MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, **engines
        )
        try:
            yield memory, clock
        finally:
            await memory.aclose()
        return
    async with open_pairing(name, tmp_path) as pairing:
        memory = pairing.service(**engines)
        try:
            yield memory, pairing.clock
        finally:
            await memory.aclose()


async def summaries_of(memory: MemoryService, user: str) -> list[MemoryRecord]:
    """Every interaction summary of the user, superseded ones included."""
    return await memory.longterm.list(
        user, types=["interaction_summary"], include_superseded=True, limit=1000
    )


def live(records: list[MemoryRecord]) -> list[MemoryRecord]:
    return [r for r in records if r.invalid_from is None]


async def close_reopen_close(memory: MemoryService, sid: str, user: str) -> Any:
    session = await memory.session(sid, user_id=user)
    await session.add_turn("user", FIRST)
    closed = await session.close()
    assert closed.closed_at is not None
    await session.add_turn("user", LATER)
    await session.close()
    await memory.drain()
    return session


def assert_one_summary_of_both_turns(records: list[MemoryRecord], sid: str) -> MemoryRecord:
    (current,) = live(records)
    assert current.provenance.session_id == sid
    assert current.metadata["turn_range"] == [0, 1]
    assert "seinen" in current.content
    assert "hardcover" in current.content
    (old,) = [r for r in records if r.memory_id != current.memory_id]
    assert "hardcover" not in old.content  # the first close's summary, of turn 0 only
    assert old.metadata["superseded_by"] == current.memory_id
    assert current.metadata["supersedes"] == old.memory_id
    return current


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_turn_reopens_a_closed_session_and_the_next_close_covers_it(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, _):
        user, sid = "u-reopen", "s-reopen"
        session = await memory.session(sid, user_id=user)
        await session.add_turn("user", FIRST)
        closed = await session.close()
        assert closed.closed_at is not None
        await session.add_turn("user", LATER)
        # Open again, for this handle and for anyone opening the session afresh.
        assert (await session.metadata()).closed_at is None
        other = await memory.session(sid, user_id=user)
        assert (await other.metadata()).closed_at is None
        again = await session.close()
        assert again.closed_at is not None
        await memory.drain()
        current = assert_one_summary_of_both_turns(await summaries_of(memory, user), sid)
        record = await memory.tiers.durable.get_record(sid, HANDOFF_RECORD)
        assert record is not None
        assert record.data["status"] == "done"
        assert record.data["last_turn"] == 1
        assert record.data["memory_id"] == current.memory_id
        # The handoff (auto-detection is off) wrote the new turn's preference.
        preferences = await memory.longterm.preferences(user)
        assert any("hardcover" in p.content for p in preferences)
        assert any("seinen" in p.content for p in preferences)
        # Closing again with nothing new writes nothing; neither does the sweeper.
        before = await summaries_of(memory, user)
        await session.close()
        memory.clock.advance(timedelta(hours=3))  # type: ignore[attr-defined]
        await memory.sweeper().sweep_once(limit=100)
        assert await summaries_of(memory, user) == before


async def test_with_auto_detection_the_reopened_part_lands_as_usual(tmp_path: Path) -> None:
    async with deployment("memory+sqlite", tmp_path) as (memory, _):
        await close_reopen_close(memory, "s-auto", "u-auto")
        assert_one_summary_of_both_turns(await summaries_of(memory, "u-auto"), "s-auto")
        preferences = await memory.longterm.preferences("u-auto")
        assert any("hardcover" in p.content for p in preferences)


async def test_a_value_the_session_changed_after_the_reopen_replaces_the_handed_off_one(
    tmp_path: Path,
) -> None:
    async with deployment("memory+memory", tmp_path, auto_detect=False) as (memory, _):
        session = await memory.session("s-genre", user_id="u-genre")
        await session.add_turn("user", "My favorite genre is seinen.")
        await session.close()
        await session.add_turn("user", "Actually my favorite genre is shonen now.")
        await session.close()
        current = await memory.longterm.get_preference("u-genre", "favorite_genre")
        assert current is not None
        assert current.metadata["preference_value"] == "shonen"


@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_the_sweeper_hands_a_reopened_session_off_again(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        session = await memory.session("s-swept", user_id="u-swept")
        await session.add_turn("user", FIRST)
        await session.close()
        await session.add_turn("user", LATER)  # ...and the user never closes it again
        clock.advance(timedelta(hours=3))  # the hot session expired
        swept = await memory.sweeper().sweep_once(limit=100)
        assert "s-swept" in swept.handed_off
        assert_one_summary_of_both_turns(await summaries_of(memory, "u-swept"), "s-swept")


@pytest.mark.parametrize("crash", ["before the supersede", "after the supersede"])
@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_crash_in_the_second_handoff_applies_once(
    name: str, crash: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        user, sid = f"u-crash-{crash[:5]}", f"s-crash-{crash[:5]}"
        session = await memory.session(sid, user_id=user)
        await session.add_turn("user", FIRST)
        await session.close()
        await session.add_turn("user", LATER)
        original = memory.longterm.supersede

        async def dies(*args: Any, **kwargs: Any) -> MemoryRecord:
            if crash == "after the supersede":
                await original(*args, **kwargs)
            raise BackendUnavailableError("the worker died", backend="test")

        # Fault injection: the process dies between the prepare and the end of the apply.
        monkeypatch.setattr(memory.longterm, "supersede", dies)
        await session.close()  # the handoff failure is logged, left to the sweeper
        monkeypatch.undo()
        record = await memory.tiers.durable.get_record(sid, HANDOFF_RECORD)
        assert record is not None
        assert record.data["status"] == "prepared"
        assert record.data["last_turn"] == 1
        assert record.data["previous_memory_id"]
        clock.advance(timedelta(hours=3))
        swept = await memory.sweeper().sweep_once(limit=100)
        assert sid in swept.handed_off
        view = await memory.tiers.durable_view(sid)
        assert view is not None
        await memory.handoff(view)  # a forced repeat writes nothing more
        records = await summaries_of(memory, user)
        assert len(records) == 2
        assert_one_summary_of_both_turns(records, sid)


async def test_a_handle_that_did_not_see_the_close_loses_nothing(tmp_path: Path) -> None:
    async with deployment("memory+sqlite", tmp_path, auto_detect=False) as (memory, _):
        user, sid = "u-stale", "s-stale"
        mine = await memory.session(sid, user_id=user)
        await mine.add_turn("user", FIRST)
        stale = await memory.session(sid, user_id=user)  # read while the session was open
        await mine.close()
        await stale.add_turn("user", LATER)
        # The close it did not see stands (the stored metadata is the truth)...
        assert (await mine.metadata()).closed_at is not None
        # ...and the next close hands the turn off anyway.
        await stale.close()
        assert_one_summary_of_both_turns(await summaries_of(memory, user), sid)


@pytest.mark.parametrize(
    ("index", "gone", "kept"), [(0, "seinen", "hardcover"), (1, "hardcover", "seinen")]
)
@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_redacting_a_turn_after_the_second_handoff(
    name: str, index: int, gone: str, kept: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, _):
        user, sid = "u-redact", "s-redact"
        session = await close_reopen_close(memory, sid, user)
        assert_one_summary_of_both_turns(await summaries_of(memory, user), sid)
        await session.redact_turn(index)
        await memory.drain()
        records = await summaries_of(memory, user)
        assert not any(gone in r.model_dump_json() for r in records)
        (current,) = live(records)  # rebuilt from what is left, every old version gone
        assert len(records) == 1
        assert kept in current.content
        assert not any(gone in p.content for p in await memory.longterm.preferences(user))
        record = await memory.tiers.durable.get_record(sid, HANDOFF_RECORD)
        assert record is not None
        assert record.data["status"] == "done"
        assert record.data["memory_id"] == current.memory_id


async def test_a_first_handoff_left_prepared_is_finished_then_the_reopen_handed_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployment("memory+memory", tmp_path, auto_detect=False) as (memory, _):
        user, sid = "u-left", "s-left"
        session = await memory.session(sid, user_id=user)
        await session.add_turn("user", FIRST)

        async def dies(*args: Any, **kwargs: Any) -> MemoryRecord:
            raise BackendUnavailableError("the worker died", backend="test")

        monkeypatch.setattr(memory.longterm, "remember", dies)
        await session.close()  # closed; its handoff is left prepared
        monkeypatch.undo()
        await session.add_turn("user", LATER)
        assert (await session.metadata()).closed_at is None
        await session.close()  # applies the prepared handoff, then hands the rest off
        records = await summaries_of(memory, user)
        assert len(records) == 2
        assert_one_summary_of_both_turns(records, sid)


@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_concurrent_handoffs_of_a_reopened_session_write_it_once(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, _):
        user, sid = "u-race", "s-race"
        session = await memory.session(sid, user_id=user)
        await session.add_turn("user", FIRST)
        await session.close()
        await session.add_turn("user", LATER)
        view = await memory.tiers.durable_view(sid)
        assert view is not None
        # Two sweepers at once (one session's handoffs interleave at every await).
        await asyncio.gather(memory.handoff(view), memory.handoff(view), memory.handoff(view))
        records = await summaries_of(memory, user)
        assert len(records) == 2
        assert_one_summary_of_both_turns(records, sid)
