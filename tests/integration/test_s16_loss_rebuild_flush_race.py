"""Write-behind: a flush racing the rebuild after a hot loss archives no turn twice.

After the hot tier lost a session, the next write-behind append re-creates it numbered
from 0 (not from the archive's next index) and without metadata; its writer then rebuilds
the hot session as the durable view followed by the re-created turns, renumbered to
continue the archive. Until then other writers append on top of the re-created session,
and any of them (or a keyed writer, or a closing one) may flush it: the flush archives the
re-created turns at the hot tier's numbers wherever they are past the archive's end.

Before this change (fc45edb) the rebuild left its renumbered turns to the next flush and
counted none of them as archived, so:

* a flush between the re-creation and the rebuild archived turns that the rebuild then
  renumbered after them: the next flush archived them a second time (a new session:
  ``[a, b, a, b]``; a longer one: the turns past the archive's end twice);
* a flush that read the re-created session before the rebuild and wrote after it
  archived a turn under an index the rebuild had given another: the rebuilding writer's
  turn was never archived (acknowledged, then lost) and the flushed one was archived
  twice.

Now the rebuild counts a turn the archive holds at its index as archived, and archives the
rest itself (conditional on the archive's next index) before it rebuilds the hot session,
so a stale flush finds its index taken. The three flush tests fail on fc45edb on every
pairing.

A read of the half-built session (another process's ``view()``) replaced it with the
durable view, dropping the turns other writers had added on top (fc45edb). Now the read
archives them the same way first, and the writer's rebuild finds its own archived; the
reader tests fail on fc45edb (a turn lost) or on the first version of this fix (6fecbd8,
51ffeea: a turn archived twice, or lost).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from tests.integration import write_behind_races
from tests.integration.conftest import Pairing
from tests.integration.write_behind_races import (
    archived_and_shown,
    on_recreation,
    texts_of,
    write_behind,
)
from tiermem.models import Turn
from tiermem.testing.backend import fresh_id

every = write_behind_races.every  # the loss pairings, opened (a fixture)


async def test_a_flush_before_the_rebuild_of_a_new_session_archives_each_turn_once(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, other = write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)  # the hot tier lost the session before any turn

    async def pile() -> None:
        await b.add_turn("user", "b")  # on the re-created session
        await other.tiers.flush(sid)  # another process's flush (a keyed turn's, a close's)

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    assert texts_of(archived) == ["a", "b"]  # fc45edb: ['a', 'b', 'a', 'b']
    assert [t.index for t in archived] == [0, 1]
    assert stored.index == 0
    assert shown == archived


async def test_a_flush_before_the_rebuild_keeps_the_turns_it_archived_where_they_are(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, other = write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):  # crosses write_behind_every: archived at 0..4
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    assert await every.durable.next_index(sid) == 5
    await every.hot.delete(sid)

    async def pile() -> None:
        for i in range(5):  # at 1..5 of the re-created session: b4 past the archive's end
            await b.add_turn("user", f"b{i}")
        await other.tiers.flush(sid)  # archives b4 at 5

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    texts = texts_of(archived)
    assert Counter(texts) == Counter(
        [*(f"before {i}" for i in range(5)), "a", *(f"b{i}" for i in range(5))]
    )
    assert texts[:6] == [*(f"before {i}" for i in range(5)), "b4"]  # the flushed one stays
    assert [t.index for t in archived] == list(range(11))
    assert archived[stored.index] == stored
    assert shown == archived
    assert memory.metrics.lost_turns == other.metrics.lost_turns == 0


async def test_a_flush_that_read_the_recreated_session_cannot_archive_after_the_rebuild(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, other = write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)

    flushing: list[asyncio.Task[int]] = []
    waiting, rebuilt = asyncio.Event(), asyncio.Event()
    real_archive = every.durable.append_turns
    real_restore = every.hot.restore

    async def archive(*args: Any, **kwargs: Any) -> Any:
        if flushing and asyncio.current_task() is flushing[0]:
            waiting.set()  # read the re-created session and the archive's next index
            await rebuilt.wait()
        return await real_archive(*args, **kwargs)

    async def restore(*args: Any, **kwargs: Any) -> Any:
        done = await real_restore(*args, **kwargs)
        rebuilt.set()
        return done

    async def pile() -> None:
        for i in range(5):
            await b.add_turn("user", f"b{i}")
        flushing.append(asyncio.create_task(other.tiers.flush(sid)))
        await waiting.wait()

    monkeypatch.setattr(every.durable, "append_turns", archive)
    monkeypatch.setattr(every.hot, "restore", restore)
    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    await flushing[0]
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    texts = texts_of(archived)
    # fc45edb: 'a' missing, 'b4' twice (the stale flush wrote it over a's index)
    assert Counter(texts) == Counter(
        [*(f"before {i}" for i in range(5)), "a", *(f"b{i}" for i in range(5))]
    )
    assert texts[5:] == ["a", *(f"b{i}" for i in range(5))]
    assert [t.index for t in archived] == list(range(11))
    assert archived[stored.index] == stored
    assert shown == archived


async def test_a_rebuild_whose_turns_a_reader_reloaded_first_writes_them_once(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild archived the re-created turns, then lost the hot compare-and-set to a
    reader that replaced the half-built session with the durable view (which now holds
    them): its next attempt no longer finds its turn under the old numbering. It must
    not write the turn again (the first version of this fix did: 'a' archived twice)."""
    memory, other = write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)

    real_restore = every.hot.restore
    read: list[bool] = []

    async def restore(*args: Any, **kwargs: Any) -> Any:
        if not read:
            read.append(True)
            await other.tiers.view(sid)  # another process reads the half-built session
        return await real_restore(*args, **kwargs)

    async def pile() -> None:
        await b.add_turn("user", "b")
        monkeypatch.setattr(every.hot, "restore", restore)

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == read == [True]

    archived, shown = await archived_and_shown(memory, sid)
    assert texts_of(archived) == [*(f"before {i}" for i in range(5)), "a", "b"]
    assert [t.index for t in archived] == list(range(7))
    assert archived[stored.index] == stored
    assert shown == archived


async def test_a_reader_of_the_recreated_session_before_its_rebuild_drops_no_turn(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process reads the re-created (half-built) session before its writer has
    rebuilt it: the read replaced it with the durable view, and the turn another writer
    had added on top was gone (fc45edb and 51ffeea: 'b' lost). Now the read archives the
    re-created turns first, and the writer's rebuild finds its own archived."""
    memory, other, reader = write_behind(every), write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)
    seen: list[list[str]] = []

    async def pile() -> None:
        await b.add_turn("user", "b")
        view = await reader.tiers.view(sid)
        assert view is not None
        seen.append(texts_of(view.turns))

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    expected = [*(f"before {i}" for i in range(5)), "a", "b"]
    assert seen == [expected]  # the reader saw both re-created turns
    archived, shown = await archived_and_shown(memory, sid)
    assert texts_of(archived) == expected
    assert [t.index for t in archived] == list(range(7))
    assert archived[stored.index] == stored
    assert shown == archived
    assert texts_of(await b.history()) == expected


async def test_a_reader_and_the_rebuild_archiving_at_once_archive_each_turn_once(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader archives the re-created turns right before the rebuild's own archive
    write, which then finds the archive moved: its next look counts them archived
    (equal but for the index), not pending."""
    memory, other, reader = write_behind(every), write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)
    real_archive = every.durable.append_turns
    read: list[bool] = []

    async def archive(*args: Any, **kwargs: Any) -> Any:
        if not read:
            read.append(True)
            await reader.tiers.view(sid)  # archives 'a' and 'b' first
        return await real_archive(*args, **kwargs)

    async def pile() -> None:
        await b.add_turn("user", "b")
        monkeypatch.setattr(every.durable, "append_turns", archive)

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == read == [True]

    expected = [*(f"before {i}" for i in range(5)), "a", "b"]
    archived, shown = await archived_and_shown(memory, sid)
    assert texts_of(archived) == expected
    assert [t.index for t in archived] == list(range(7))
    assert archived[stored.index] == stored
    assert shown == archived


async def test_a_keyed_turn_meeting_the_recreated_session_drops_no_turn(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed (written-through) turn after the loss, before the plain writer's rebuild:
    its hot append finds the re-created session at another index, and its rejoin
    replaced the session with the durable view, dropping the other writer's turn on top
    ('b'; fc45edb and 82b6907). Now the rejoin archives every turn of a half-built
    session, as a read does."""
    memory, other, third = write_behind(every), write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    k = await third.session(sid, user_id=uid)
    await every.hot.delete(sid)
    keyed: list[Turn] = []

    async def pile() -> None:
        await b.add_turn("user", "b")
        keyed.append(await k.add_turn("assistant", "keyed", idempotency_key="k-1"))

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    assert Counter(texts_of(archived)) == Counter(
        [*(f"before {i}" for i in range(5)), "keyed", "a", "b"]
    )
    assert [t.index for t in archived] == list(range(8))
    assert archived[keyed[0].index] == keyed[0]
    assert archived[stored.index] == stored
    assert shown == archived
