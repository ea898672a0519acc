"""Session 16 (H2): a late handoff does not overwrite a newer plain value set in another
session.

The handoff kept the slot's current value only when this session wrote it or it was set
after the session *ended*. Two open sessions of one user: "my favourite genre is horror"
in A, then romance in B (detected, or the application's ``upsert_preference``) while A is
still open; A closes later and its handoff wrote horror over the newer romance. Now the
value stands when it was set after the turn that *stated* the handoff's value (the turn's
time is kept in the prepared content: no archive read), and a value a handoff writes
keeps the time it was stated (``metadata["stated_at"]``), so a session whose older
statement is handed off later does not overwrite a newer one either.

The ``newer`` cases fail on fc45edb; the guards (a value stated later still wins, the
session's own change after a reopen replaces its earlier handoff value, a value set after
the session ended wins) pass on both. memory+memory and memory+sqlite."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.summaries.test_s15_reopen_after_close import deployment
from tiermem.clock import FakeClock
from tiermem.service import MemoryService

PAIRINGS = ["memory+memory", "memory+sqlite"]


async def genre(memory: MemoryService, user: str) -> str | None:
    slot = await memory.longterm.get_preference(user, "favorite_genre")
    if slot is None:
        return None
    value = slot.metadata["preference_value"]
    assert isinstance(value, str)
    return value


async def interleave(
    memory: MemoryService, clock: FakeClock, user: str, *, how: str, auto: bool = True
) -> None:
    """A states horror; later B sets romance (``how``); A goes on and closes."""
    first = await memory.session(f"s-a-{user}", user_id=user)
    await first.add_turn("user", "My favourite genre is horror.")
    await first.add_turn("assistant", "Noted: horror.")
    await memory.drain()
    clock.advance(timedelta(minutes=5))
    if how == "detected":
        second = await memory.session(f"s-b-{user}", user_id=user)
        await second.add_turn("user", "My favourite genre is romance.")
        await memory.drain()
        if not auto:
            await second.close()  # its handoff writes romance
    else:
        await memory.longterm.upsert_preference(user, "favorite_genre", "romance")
    assert await genre(memory, user) == "romance"
    clock.advance(timedelta(minutes=5))
    await first.add_turn("user", "Anyway, is Berserk vol 3 in stock?")
    await first.add_turn("assistant", "Yes, it is.")
    await first.close()
    await memory.drain()


@pytest.mark.parametrize("how", ["detected", "explicit"])
@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_newer_value_from_another_session_stands(
    name: str, how: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as (memory, clock):
        await interleave(memory, clock, "u-newer", how=how)
        assert await genre(memory, "u-newer") == "romance"
        history = await memory.longterm.preference_history("u-newer", "favorite_genre")
        assert [r.metadata["preference_value"] for r in history] == ["horror"]


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_newer_value_handed_off_first_stands_without_detection(
    name: str, tmp_path: Path
) -> None:
    # Auto-detection off: both values come from handoffs. B closes first (romance), then A
    # (horror, stated before romance): the handoff compares the statements' times.
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        await interleave(memory, clock, "u-handed", how="detected", auto=False)
        assert await genre(memory, "u-handed") == "romance"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_an_older_statement_handed_off_later_does_not_win(name: str, tmp_path: Path) -> None:
    # C states romance, A states horror later; A closes first, then C: C's handoff came
    # last but its statement is the older one.
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        user = "u-older"
        older = await memory.session("s-c", user_id=user)
        await older.add_turn("user", "My favourite genre is romance.")
        clock.advance(timedelta(minutes=5))
        newer = await memory.session("s-a", user_id=user)
        await newer.add_turn("user", "My favourite genre is horror.")
        await newer.close()
        assert await genre(memory, user) == "horror"
        clock.advance(timedelta(minutes=5))
        await older.add_turn("user", "Is Berserk vol 3 in stock?")
        await older.close()
        await memory.drain()
        assert await genre(memory, user) == "horror"
        slot = await memory.longterm.get_preference(user, "favorite_genre")
        assert slot is not None
        assert "stated_at" in slot.metadata


# -- guards (pass before and after) ------------------------------------------------------


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_value_stated_after_the_other_one_still_wins(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        user = "u-later"
        first = await memory.session("s-a", user_id=user)
        await first.add_turn("user", "Hello.")
        clock.advance(timedelta(minutes=5))
        await memory.longterm.upsert_preference(user, "favorite_genre", "romance")
        clock.advance(timedelta(minutes=5))
        await first.add_turn("user", "My favourite genre is horror.")
        await first.close()
        assert await genre(memory, user) == "horror"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_a_value_set_after_the_session_ended_wins(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        user = "u-after"
        first = await memory.session("s-a", user_id=user)
        await first.add_turn("user", "My favourite genre is horror.")
        clock.advance(timedelta(hours=3))  # the hot session expires; not swept yet
        await memory.longterm.upsert_preference(user, "favorite_genre", "romance")
        clock.advance(timedelta(minutes=1))
        await memory.sweeper().sweep_once(limit=100)
        assert await genre(memory, user) == "romance"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_the_reopened_session_replaces_its_own_handoff_value(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path, auto_detect=False) as (memory, clock):
        user = "u-reopened"
        session = await memory.session("s-a", user_id=user)
        await session.add_turn("user", "My favourite genre is horror.")
        await session.close()
        assert await genre(memory, user) == "horror"
        clock.advance(timedelta(minutes=5))
        await session.add_turn("user", "Actually my favourite genre is romance now.")
        await session.close()
        assert await genre(memory, user) == "romance"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_the_sessions_own_detection_wins(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as (memory, clock):
        user = "u-own"
        session = await memory.session("s-a", user_id=user)
        await session.add_turn("user", "My favourite genre is horror.")
        await memory.drain()
        clock.advance(timedelta(minutes=5))
        await session.add_turn("user", "My favourite genre is romance.")
        await session.close()
        await memory.drain()
        assert await genre(memory, user) == "romance"
