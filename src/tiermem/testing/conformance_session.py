"""Conformance tests for what holds a session together over time: its durable lifetime and
ownership, idempotent appends, and the hot tier's atomic restore and state copies.

Import them into a test module that defines a ``backend`` fixture (see
:mod:`tiermem.testing`). Time only moves through the fixture's fake clock.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from tiermem.errors import ConflictError, CorruptDataError, ValidationError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionRef,
    StateBlob,
    TextBlock,
    ToolUseBlock,
    Turn,
)
from tiermem.testing.backend import BackendUnderTest, fresh_id, text_turn

HOUR = 3600.0
DAY = 24 * HOUR
MINUTES_20 = 20 * 60.0


def _ref(backend: BackendUnderTest, session_id: str, user_id: str) -> SessionRef:
    return SessionRef(session_id=session_id, user_id=user_id, created_at=backend.clock.now())


def _metadata(backend: BackendUnderTest, session_id: str, user_id: str = "u-1") -> SessionMetadata:
    now = backend.clock.now()
    return SessionMetadata(
        session_id=session_id, user_id=user_id, created_at=now, last_activity=now
    )


# -- durable lifetime and ownership -----------------------------------------------------


async def test_session_record_and_owner_outlive_the_retention_while_turns_arrive(
    backend: BackendUnderTest,
) -> None:
    """A turn every 20 minutes for 26 hours: each write keeps the session alive for a day,
    so its metadata record and its owner are still there at the end."""
    durable, sid, user = backend.durable, fresh_id("s"), fresh_id("u")
    await durable.register_session(_ref(backend, sid, user), expires_at=backend.later(DAY))
    await durable.put_record(sid, "metadata", {"user": user}, expires_at=backend.later(DAY))
    for i in range(78):
        backend.clock.advance(MINUTES_20)
        await durable.append_turns(sid, [text_turn(f"t{i}")], expires_at=backend.later(DAY))
    record = await durable.get_record(sid, "metadata")
    assert record is not None
    assert record.data == {"user": user}
    assert record.version == 1
    owner = await durable.get_session(sid)
    assert owner is not None
    assert owner.user_id == user
    # Turns still expire one by one: the first ones were written more than a day ago.
    turns = await durable.get_turns(sid)
    assert turns[0].index > 0
    assert turns[-1].index == 77


async def test_a_record_write_keeps_the_session_alive(backend: BackendUnderTest) -> None:
    durable, sid, user = backend.durable, fresh_id("s"), fresh_id("u")
    await durable.register_session(_ref(backend, sid, user), expires_at=backend.later(HOUR))
    await durable.put_record(sid, "summary", {"text": "x"}, expires_at=backend.later(10 * HOUR))
    backend.clock.advance(5 * HOUR)
    owner = await durable.get_session(sid)
    assert owner is not None
    assert owner.user_id == user


async def test_records_report_the_session_lifetime(backend: BackendUnderTest) -> None:
    durable, sid = backend.durable, fresh_id("s")
    await durable.append_turns(sid, [text_turn("a")], expires_at=backend.later(DAY))
    record = await durable.put_record(sid, "summary", {"n": 1}, expires_at=backend.later(HOUR))
    assert record.expires_at == backend.later(DAY)
    backend.clock.advance(2 * HOUR)
    assert await durable.get_record(sid, "summary") is not None
    forever = await durable.put_record(sid, "summary", {"n": 2}, expires_at=None)
    assert forever.expires_at is None
    backend.clock.advance(400 * DAY)
    assert await durable.get_record(sid, "summary") == forever


async def test_a_dead_session_reads_as_absent_and_its_id_is_free(
    backend: BackendUnderTest,
) -> None:
    durable, sid = backend.durable, fresh_id("s")
    first, second = fresh_id("u"), fresh_id("u")
    await durable.register_session(_ref(backend, sid, first), expires_at=backend.later(DAY))
    await durable.append_turns(sid, [text_turn("mine")], expires_at=backend.later(DAY))
    await durable.put_record(sid, "metadata", {"user": first}, expires_at=backend.later(DAY))
    backend.clock.advance(DAY)
    assert await durable.get_session(sid) is None
    assert await durable.get_record(sid, "metadata") is None
    assert await durable.get_turns(sid) == []
    assert await durable.next_index(sid) in (0, 1)
    new = _ref(backend, sid, second)
    assert await durable.register_session(new, expires_at=backend.later(DAY)) == new
    assert await durable.get_session(sid) == new
    assert sid in [r.session_id for r in await durable.list_sessions(second)]


async def test_register_refuses_another_user_while_the_session_lives(
    backend: BackendUnderTest,
) -> None:
    durable, sid = backend.durable, fresh_id("s")
    owner, intruder = fresh_id("u"), fresh_id("u")
    mine = _ref(backend, sid, owner)
    assert await durable.register_session(mine, expires_at=backend.later(HOUR)) == mine
    backend.clock.advance(HOUR / 2)
    held = await durable.register_session(
        _ref(backend, sid, intruder), expires_at=backend.later(DAY)
    )
    assert held == mine
    assert await durable.list_sessions(intruder) == []
    # The intruder's attempt did not extend the session either.
    backend.clock.advance(HOUR / 2)
    assert await durable.get_session(sid) is None


async def test_register_again_by_the_owner_extends_the_lifetime(
    backend: BackendUnderTest,
) -> None:
    durable, sid, user = backend.durable, fresh_id("s"), fresh_id("u")
    ref = _ref(backend, sid, user)
    await durable.register_session(ref, expires_at=backend.later(HOUR))
    backend.clock.advance(HOUR / 2)
    again = _ref(backend, sid, user)
    assert await durable.register_session(again, expires_at=backend.later(HOUR)) == ref
    backend.clock.advance(HOUR / 2 + 1)
    assert await durable.get_session(sid) == ref
    assert await durable.list_sessions(user) == [ref]


async def test_concurrent_registrations_by_two_users_have_one_owner(
    backend: BackendUnderTest,
) -> None:
    durable, sid = backend.durable, fresh_id("s")
    users = [fresh_id("u") for _ in range(6)]
    results = await asyncio.gather(
        *(
            durable.register_session(_ref(backend, sid, u), expires_at=backend.later(DAY))
            for u in users
        )
    )
    owners = {r.user_id for r in results}
    assert len(owners) == 1
    (owner,) = owners
    assert await durable.get_session(sid) == results[0]
    listed = [u for u in users if await durable.list_sessions(u)]
    assert listed == [owner]


async def test_get_session_of_an_unknown_id_is_none(backend: BackendUnderTest) -> None:
    assert await backend.durable.get_session(fresh_id("s")) is None


# -- idempotent appends -----------------------------------------------------------------


async def test_append_with_a_used_key_returns_the_stored_turns(backend: BackendUnderTest) -> None:
    durable, sid = backend.durable, fresh_id("s")
    await durable.append_turns(sid, [text_turn("before")], expires_at=backend.later(DAY))
    first = await durable.append_turns(
        sid,
        [text_turn("q"), text_turn("a", role="assistant")],
        expires_at=backend.later(DAY),
        idempotency_key="req-1",
    )
    assert [t.index for t in first] == [1, 2]
    retry = await durable.append_turns(
        sid, [text_turn("q")], expires_at=backend.later(DAY), idempotency_key="req-1"
    )
    assert retry == first
    # A retry that pins an index that is no longer next is still answered, not refused.
    pinned = await durable.append_turns(
        sid, [text_turn("q")], first_index=1, idempotency_key="req-1"
    )
    assert pinned == first
    assert await durable.next_index(sid) == 3
    assert [t.text for t in await durable.get_turns(sid)] == ["before", "q", "a"]
    other = await durable.append_turns(sid, [text_turn("next")], idempotency_key="req-2")
    assert other[0].index == 3


async def test_keys_belong_to_their_session(backend: BackendUnderTest) -> None:
    durable = backend.durable
    a, b = fresh_id("s"), fresh_id("s")
    await durable.append_turns(a, [text_turn("in a")], idempotency_key="k")
    in_b = await durable.append_turns(b, [text_turn("in b")], idempotency_key="k")
    assert in_b[0].text == "in b"
    assert len(await durable.get_turns(b)) == 1


async def test_concurrent_retries_with_one_key_append_once(backend: BackendUnderTest) -> None:
    durable, sid = backend.durable, fresh_id("s")
    results = await asyncio.gather(
        *(
            durable.append_turns(sid, [text_turn(f"try {i}")], idempotency_key="same")
            for i in range(8)
        )
    )
    assert len({tuple(t.index for t in r) for r in results}) == 1
    assert len({r[0].text for r in results}) == 1
    assert len(await durable.get_turns(sid)) == 1
    assert await durable.next_index(sid) == 1


async def test_keys_are_remembered_as_long_as_the_session_lives(
    backend: BackendUnderTest,
) -> None:
    durable, sid = backend.durable, fresh_id("s")
    first = await durable.append_turns(
        sid, [text_turn("once")], expires_at=backend.later(DAY), idempotency_key="k-early"
    )
    for i in range(40):
        backend.clock.advance(HOUR)
        await durable.append_turns(sid, [text_turn(f"t{i}")], expires_at=backend.later(DAY))
    # The keyed turn has expired by now, but its key still stops a duplicate.
    retry = await durable.append_turns(
        sid, [text_turn("once")], expires_at=backend.later(DAY), idempotency_key="k-early"
    )
    assert [t.index for t in retry] in ([], [first[0].index])
    assert await durable.next_index(sid) == 41


async def test_bad_idempotency_keys_are_refused(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    for bad in ("", "x" * 300, "a\nb"):
        with pytest.raises(ValidationError, match="idempotency_key"):
            await backend.durable.append_turns(sid, [text_turn("t")], idempotency_key=bad)
    assert await backend.durable.next_index(sid) == 0


# -- hot: entities never start a session, restore, copy_state -------------------------


async def test_entities_never_start_a_hot_session(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    now = backend.clock.now()
    result = await backend.hot.update_entities(
        sid,
        {"series": ActiveEntity(kind="series", value="Berserk", updated_at=now)},
        expires_at=backend.later(HOUR),
    )
    assert result is None
    assert await backend.hot.load(sid) is None


def _indexed(backend: BackendUnderTest, texts: list[str], first: int) -> list[Turn]:
    return [text_turn(t).with_index(first + i) for i, t in enumerate(texts)]


async def test_restore_replaces_the_session_and_keeps_state_versions(
    backend: BackendUnderTest,
) -> None:
    hot, sid = backend.hot, fresh_id("s")
    await hot.append_turns(sid, [text_turn("stale")], window=5, expires_at=backend.later(HOUR))
    await hot.put_state(sid, "dialogue", {"phase": "old"}, expires_at=backend.later(HOUR))
    now = backend.clock.now()
    turns = _indexed(backend, [f"t{i}" for i in range(7)], first=3)
    dialogue = StateBlob(name="dialogue", data={"phase": "checkout"}, version=5, updated_at=now)
    tools = StateBlob(name="tools", data={"search": "open"}, version=2, updated_at=now)
    series = ActiveEntity(kind="series", value="Berserk", turn_index=4, updated_at=now)
    version = await hot.restore(
        sid,
        turns=turns,
        next_index=10,
        metadata=_metadata(backend, sid),
        entities={"series": series},
        state={"dialogue": dialogue, "tools": tools},
        window=5,
        expires_at=backend.later(2 * HOUR),
    )
    assert version == 3
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.version == 3
    assert [t.index for t in snap.turns] == [5, 6, 7, 8, 9]
    assert snap.next_index == 10
    assert snap.metadata == _metadata(backend, sid)
    assert snap.entities == {"series": series}
    assert snap.state == {"dialogue": dialogue, "tools": tools}
    assert snap.expires_at == backend.later(2 * HOUR)
    # The compare-and-set sequence continues from the restored version.
    with pytest.raises(ConflictError):
        await hot.put_state(
            sid, "dialogue", {"phase": "x"}, expires_at=backend.later(HOUR), expected_version=1
        )
    after = await hot.put_state(
        sid, "dialogue", {"phase": "paid"}, expires_at=backend.later(HOUR), expected_version=5
    )
    assert after.version == 6
    appended = await hot.append_turns(
        sid, [text_turn("next")], window=5, expires_at=backend.later(HOUR), first_index=10
    )
    assert appended.turns[0].index == 10


async def test_restore_is_conditional_on_the_version(backend: BackendUnderTest) -> None:
    hot, sid = backend.hot, fresh_id("s")
    args = {
        "turns": _indexed(backend, ["a"], first=0),
        "next_index": 1,
        "metadata": _metadata(backend, sid),
        "entities": {},
        "state": {},
        "window": 5,
        "expires_at": backend.later(HOUR),
    }
    assert await hot.restore(sid, expected_version=0, **args) == 1  # type: ignore[arg-type]
    with pytest.raises(ConflictError):
        await hot.restore(sid, expected_version=0, **args)  # type: ignore[arg-type]
    await hot.append_turns(sid, [text_turn("b")], window=5, expires_at=backend.later(HOUR))
    with pytest.raises(ConflictError):
        await hot.restore(sid, expected_version=1, **args)  # type: ignore[arg-type]
    snap = await hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["a", "b"]
    assert await hot.restore(sid, expected_version=2, **args) == 3  # type: ignore[arg-type]
    backend.clock.advance(HOUR)
    # Expired counts as absent.
    assert await hot.restore(sid, expected_version=0, **args) == 1  # type: ignore[arg-type]


async def test_restore_of_a_session_without_turns(backend: BackendUnderTest) -> None:
    hot, sid = backend.hot, fresh_id("s")
    version = await hot.restore(
        sid,
        turns=[],
        next_index=12,
        metadata=_metadata(backend, sid),
        entities={},
        state={},
        window=5,
        expires_at=backend.later(HOUR),
    )
    assert version == 1
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.turns == ()
    assert snap.next_index == 12
    r = await hot.append_turns(
        sid, [text_turn("x")], window=5, expires_at=backend.later(HOUR), first_index=12
    )
    assert r.turns[0].index == 12


async def test_restore_rejects_bad_turns(backend: BackendUnderTest) -> None:
    hot, sid = backend.hot, fresh_id("s")
    base = {
        "metadata": _metadata(backend, sid),
        "entities": {},
        "state": {},
        "window": 5,
        "expires_at": backend.later(HOUR),
    }
    gap = [*_indexed(backend, ["a"], 0), *_indexed(backend, ["c"], 2)]
    with pytest.raises(ValidationError, match="consecutive"):
        await hot.restore(sid, turns=gap, next_index=3, **base)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="next_index"):
        await hot.restore(
            sid,
            turns=_indexed(backend, ["a"], 0),
            next_index=0,
            **base,  # type: ignore[arg-type]
        )
    assert await hot.load(sid) is None


async def test_copy_state_keeps_the_given_version_and_never_goes_back(
    backend: BackendUnderTest,
) -> None:
    hot, sid = backend.hot, fresh_id("s")
    now = backend.clock.now()
    v7 = StateBlob(name="dialogue", data={"phase": "seven"}, version=7, updated_at=now)
    assert await hot.copy_state(sid, v7, expires_at=backend.later(HOUR)) is False
    assert await hot.load(sid) is None
    await hot.put_metadata(sid, _metadata(backend, sid), expires_at=backend.later(HOUR))
    assert await hot.copy_state(sid, v7, expires_at=backend.later(HOUR)) is True
    assert await hot.get_state(sid, "dialogue") == v7
    older = StateBlob(name="dialogue", data={"phase": "six"}, version=6, updated_at=now)
    assert await hot.copy_state(sid, older, expires_at=backend.later(HOUR)) is False
    assert await hot.copy_state(sid, v7, expires_at=backend.later(HOUR)) is False
    assert await hot.get_state(sid, "dialogue") == v7
    later = now + timedelta(seconds=5)
    v9 = StateBlob(name="dialogue", data={"phase": "nine"}, version=9, updated_at=later)
    assert await hot.copy_state(sid, v9, expires_at=backend.later(2 * HOUR)) is True
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.state["dialogue"] == v9
    assert snap.version == 3
    assert snap.expires_at == backend.later(2 * HOUR)


# -- unreadable data never makes a session unreadable -----------------------------------


def _undecodable(text: str) -> NewTurn:
    """A turn every backend can encode but no JSON decoder of ours reads back: 200 levels of
    nesting (what an old client, or one that skipped the edge checks, could have stored)."""
    deep: JsonValue = "leaf"
    for _ in range(200):
        deep = [deep]
    turn = text_turn(text)
    block = ToolUseBlock(tool_use_id="t", name="search", input=deep)
    return turn.model_copy(update={"content": (*turn.content, block)})


def _head(turn: Turn) -> str:
    block = turn.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def test_an_undecodable_archived_turn_is_skipped_not_fatal(
    backend: BackendUnderTest,
) -> None:
    durable, sid = backend.durable, fresh_id("s")
    await durable.append_turns(sid, [text_turn("before"), _undecodable("bad"), text_turn("after")])
    serializes = backend.durable.name != "memory"  # the reference keeps objects, not JSON
    readable = ["before", "after"] if serializes else ["before", "bad", "after"]
    assert [_head(t) for t in await durable.get_turns(sid)] == readable
    assert [_head(t) for t in await durable.tail_turns(sid, 3)] == readable
    assert (await durable.get_turn(sid, 2)).text == "after"
    if serializes:
        with pytest.raises(CorruptDataError):
            await durable.get_turn(sid, 1)
    assert await durable.next_index(sid) == 3


async def test_an_undecodable_hot_turn_is_skipped_not_fatal(backend: BackendUnderTest) -> None:
    hot, sid = backend.hot, fresh_id("s")
    await hot.append_turns(
        sid,
        [text_turn("before"), _undecodable("bad"), text_turn("after")],
        window=5,
        expires_at=backend.later(HOUR),
    )
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.next_index == 3
    assert snap.turns[0].text == "before"
    assert snap.turns[-1].text == "after"


async def test_unencodable_text_is_refused_before_anything_is_written(
    backend: BackendUnderTest,
) -> None:
    durable, hot, sid = backend.durable, backend.hot, fresh_id("s")
    with pytest.raises(ValidationError):
        await durable.append_turns(sid, [text_turn("bad \ud800")])
    with pytest.raises(ValidationError):
        await hot.append_turns(
            sid, [text_turn("bad \ud800")], window=5, expires_at=backend.later(HOUR)
        )
    with pytest.raises(ValidationError):
        await durable.put_record(sid, "summary", {"text": "bad \udfff"})
    assert await durable.next_index(sid) == 0
    assert await hot.load(sid) is None
