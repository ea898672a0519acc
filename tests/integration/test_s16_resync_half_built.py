"""Write-behind: a resync of a half-built session drops none of its turns.

After the hot tier lost a session, the next write-behind append re-creates it numbered
from 0 and without metadata (a half-built session); until its writer rebuilds it, other
writers append on top. Reads (82b6907) and keyed turns (c4005f6) archive such a session's
turns before they replace it with the durable view. ``TieredSessionStore._resync`` did
not (fc45edb to c4005f6): it replaced the half-built session with the durable view as
it stood. A user reaches it through ``redact_turn`` in that window: the redaction
rebuilds the hot window when the hot session holds a turn at the redacted index, and the
re-created numbering (from 0) usually does. The turns other writers had added on top
were gone; the writer's rebuild, finding its own turn gone, wrote it again.

Now ``_resync`` archives the half-built session's turns first, as a read does
(``_adopted``), and a re-created turn a flush archived and the redaction then redacted
counts as archived (the hot copy is not archived again, which would undo the
redaction). The writer's rebuild, when its compare-and-set attempts run out (other
writers kept appending), falls back to the same resync. All three tests fail on c4005f6
on every pairing ('b' lost; 'b0'..'b3' lost; the turns piled after the last archive
write lost); the second also fails with the resync fixed but the redaction rule left
out ('b4' archived again from its hot copy).
"""

from __future__ import annotations

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
from tiermem.models.turns import REDACTED_TEXT
from tiermem.retry import CAS_ATTEMPTS
from tiermem.testing.backend import fresh_id
from tiermem.tiers import tiered

every = write_behind_races.every  # the loss pairings, opened (a fixture)


async def test_a_redaction_before_the_rebuild_drops_no_recreated_turn(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process redacts an archived turn between the re-creation and its writer's
    rebuild: the re-created session holds a turn at that index (numbered from 0), so the
    redaction resyncs it. c4005f6: 'b' (another writer's turn on top) lost."""
    memory, other, third = write_behind(every), write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):  # crosses write_behind_every: archived at 0..4
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    r = await third.session(sid, user_id=uid)
    assert await every.durable.next_index(sid) == 5
    await every.hot.delete(sid)  # the hot tier lost the session

    async def pile() -> None:
        await b.add_turn("user", "b")  # at 1 of the re-created session
        await r.redact_turn(1)  # an archived turn ('before 1')

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    expected = ["before 0", REDACTED_TEXT, "before 2", "before 3", "before 4", "a", "b"]
    assert texts_of(archived) == expected  # c4005f6: [..., 'before 4', 'a']
    assert [t.index for t in archived] == list(range(7))
    assert archived[stored.index] == stored
    assert shown == archived
    assert texts_of(await b.history()) == expected
    assert memory.metrics.lost_turns == other.metrics.lost_turns == third.metrics.lost_turns == 0


async def test_a_recreated_turn_flushed_and_redacted_before_the_rebuild_stays_redacted(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redaction's flush archives a re-created turn past the archive's end at its
    hot index, the redaction redacts it there, and its resync replaces the half-built
    session: the other re-created turns are archived after it, and the redacted one is
    not archived again from its hot copy. c4005f6: 'b0'..'b3' lost."""
    memory, other, third = write_behind(every), write_behind(every), write_behind(every)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    r = await third.session(sid, user_id=uid)
    await every.hot.delete(sid)
    written: list[Turn] = []

    async def pile() -> None:
        for i in range(5):  # at 1..5 of the re-created session: b4 past the archive's end
            written.append(await b.add_turn("user", f"b{i}"))
        assert written[-1].index == 5
        await r.redact_turn(written[-1].index)  # the index b4's append returned

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]

    archived, shown = await archived_and_shown(memory, sid)
    texts = texts_of(archived)
    assert "b4" not in texts  # the redaction holds
    assert texts == [
        *(f"before {i}" for i in range(5)),
        REDACTED_TEXT,  # b4, archived by the redaction's flush at its hot index
        "a",
        *(f"b{i}" for i in range(4)),
    ]
    assert [t.index for t in archived] == list(range(11))
    assert archived[stored.index] == stored
    assert shown == archived


async def test_a_rebuild_that_keeps_losing_the_race_drops_no_turn(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other writers append to the re-created session before each of its writer's
    rebuild attempts, so every compare-and-set on the hot version fails and the writer
    falls back to a resync: the turns appended after its last archive write were dropped
    (c4005f6), and its own turn must not be archived twice. (A window that holds them
    all: the writer stops rebuilding once its turn leaves the re-created window.)"""
    memory, other = write_behind(every, window=64), write_behind(every, window=64)
    sid, uid = fresh_id("s"), fresh_id("u")
    a = await memory.session(sid, user_id=uid)
    for i in range(5):
        await a.add_turn("user", f"before {i}")
    b = await other.session(sid, user_id=uid)
    await every.hot.delete(sid)

    real_restore = every.hot.restore
    piled: list[str] = []

    async def restore(*args: Any, **kwargs: Any) -> Any:
        if rebuilding and len(piled) < CAS_ATTEMPTS + 8:
            piled.append(f"b{len(piled)}")
            await b.add_turn("user", piled[-1])  # moves the hot version first
        return await real_restore(*args, **kwargs)

    rebuilding: list[bool] = []

    async def no_pause(attempt: int) -> None:
        pass  # the race is forced every time: no need to wait between attempts

    async def pile() -> None:
        rebuilding.append(True)
        monkeypatch.setattr(every.hot, "restore", restore)
        monkeypatch.setattr(tiered, "pause", no_pause)

    ran = on_recreation(every, monkeypatch, pile)
    stored = await a.add_turn("user", "a")
    monkeypatch.undo()
    assert ran == [True]
    assert len(piled) == CAS_ATTEMPTS + 8  # every rebuild attempt and the resync's first 8 lost

    archived, shown = await archived_and_shown(memory, sid)
    texts = texts_of(archived)
    assert sorted(texts) == sorted([*(f"before {i}" for i in range(5)), "a", *piled])
    assert [t.index for t in archived] == list(range(len(texts)))
    assert archived[stored.index] == stored
    assert shown == archived
