"""Conformance tests for :class:`tiermem.store.contract.DurableStore`.

Import them into a test module that defines a ``backend`` fixture (see
:mod:`tiermem.testing`). Time only moves through the fixture's fake clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.models import (
    REDACTED_TEXT,
    ActiveEntity,
    MemoryRecord,
    Provenance,
    SessionRef,
)
from tiermem.store.contract import (
    ENTITIES_RECORD,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_IDS_PER_GET,
    MAX_RECORD_BYTES,
    MAX_TURN_BYTES,
    Capability,
    EntityChange,
)
from tiermem.testing.backend import BackendUnderTest, fresh_id, text_turn

DAY = 86400.0


def _memory(
    backend: BackendUnderTest,
    user_id: str,
    *,
    memory_type: str = "preference",
    content: str = "prefers seinen",
    age_s: float = 0.0,
    expires_in: float | None = None,
    version: int = 1,
    memory_id: str | None = None,
) -> MemoryRecord:
    created = backend.clock.now() - timedelta(seconds=age_s)
    return MemoryRecord(
        memory_id=memory_id or fresh_id("m"),
        user_id=user_id,
        memory_type=memory_type,
        content=content,
        tags=("genre", "manga"),
        metadata={"preference_key": "favorite_genre"},
        importance=0.9,
        created_at=created,
        expires_at=None if expires_in is None else backend.later(expires_in),
        provenance=Provenance(source="auto", session_id="s-1", turn_indexes=(3, 4)),
        valid_from=created,
        version=version,
    )


# -- turn archive -------------------------------------------------------------------------


async def test_durable_append_get_and_ranges(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    assert await backend.durable.next_index(sid) == 0
    first = await backend.durable.append_turns(sid, [text_turn(f"t{i}") for i in range(3)])
    assert [t.index for t in first] == [0, 1, 2]
    more = await backend.durable.append_turns(sid, [text_turn(f"t{i}") for i in range(3, 12)])
    assert [t.index for t in more] == list(range(3, 12))
    assert await backend.durable.next_index(sid) == 12
    assert (await backend.durable.get_turn(sid, 7)).text == "t7"
    assert [t.index for t in await backend.durable.get_turns(sid, 2, 5)] == [2, 3, 4]
    assert [t.index for t in await backend.durable.get_turns(sid, 10)] == [10, 11]
    assert [t.text for t in await backend.durable.get_turns(sid)] == [f"t{i}" for i in range(12)]
    assert [t.index for t in await backend.durable.tail_turns(sid, 4)] == [8, 9, 10, 11]
    assert [t.index for t in await backend.durable.tail_turns(sid, 50)] == list(range(12))
    assert await backend.durable.tail_turns(sid, 0) == []
    short = fresh_id("s")
    await backend.durable.append_turns(short, [text_turn(f"s{i}") for i in range(3)])
    assert [t.index for t in await backend.durable.tail_turns(short, 4)] == [0, 1, 2]
    assert [t.index for t in await backend.durable.tail_turns(short, 2)] == [1, 2]
    assert await backend.durable.get_turns(sid, 12, 20) == []


async def test_durable_archive_keeps_many_turns_in_order(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    for start in range(0, 250, 50):
        await backend.durable.append_turns(
            sid, [text_turn(f"t{i}") for i in range(start, start + 50)]
        )
    turns = await backend.durable.get_turns(sid)
    assert [t.index for t in turns] == list(range(250))
    assert [t.text for t in turns] == [f"t{i}" for i in range(250)]


async def test_durable_missing_turn_is_not_found(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    with pytest.raises(NotFoundError):
        await backend.durable.get_turn(sid, 0)
    await backend.durable.append_turns(sid, [text_turn("a")])
    with pytest.raises(NotFoundError, match="1"):
        await backend.durable.get_turn(sid, 1)


async def test_durable_first_index_must_be_next(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.durable.append_turns(sid, [text_turn("a")], first_index=0)
    with pytest.raises(ConflictError) as info:
        await backend.durable.append_turns(sid, [text_turn("b")], first_index=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    with pytest.raises(ConflictError):
        await backend.durable.append_turns(sid, [text_turn("c")], first_index=3)
    ok = await backend.durable.append_turns(sid, [text_turn("d")], first_index=1)
    assert ok[0].index == 1
    assert [t.text for t in await backend.durable.get_turns(sid)] == ["a", "d"]


async def test_durable_concurrent_appends_are_gap_free(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    tasks, per_task = 8, 10

    async def writer(w: int) -> None:
        for i in range(per_task):
            await backend.durable.append_turns(sid, [text_turn(f"w{w}-{i}")])

    await asyncio.gather(*(writer(w) for w in range(tasks)))
    turns = await backend.durable.get_turns(sid)
    assert [t.index for t in turns] == list(range(tasks * per_task))
    assert sorted(t.text for t in turns) == sorted(
        f"w{w}-{i}" for w in range(tasks) for i in range(per_task)
    )
    # Each writer's own turns stay in the order it wrote them.
    for w in range(tasks):
        mine = [t.text for t in turns if t.text.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{i}" for i in range(per_task)]


async def test_durable_redaction_keeps_the_slot(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.durable.append_turns(
        sid, [text_turn("my card is 4111 1111 1111 1111"), text_turn("thanks")]
    )
    redacted = await backend.durable.redact_turn(sid, 0)
    assert redacted.redacted is True
    assert redacted.index == 0
    stored = await backend.durable.get_turn(sid, 0)
    assert stored == redacted
    assert stored.text == REDACTED_TEXT
    assert "4111" not in stored.model_dump_json()
    assert [t.index for t in await backend.durable.get_turns(sid)] == [0, 1]
    with pytest.raises(NotFoundError):
        await backend.durable.redact_turn(sid, 9)


async def test_durable_turns_expire_with_the_clock(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.durable.append_turns(sid, [text_turn("short")], expires_at=backend.later(DAY))
    await backend.durable.append_turns(sid, [text_turn("forever")])
    backend.clock.advance(DAY)
    assert [t.text for t in await backend.durable.get_turns(sid)] == ["forever"]
    with pytest.raises(NotFoundError):
        await backend.durable.get_turn(sid, 0)
    # Numbering never reuses an expired slot.
    assert (await backend.durable.append_turns(sid, [text_turn("next")]))[0].index == 2


async def test_durable_large_and_unicode_turns(backend: BackendUnderTest) -> None:
    sid = fresh_id("セッション")
    rng = random.Random(11)
    big = "".join(rng.choice("あいうえおかきくけこabc123 ") for _ in range(250_000))
    ja = "好きなジャンルはセイネンです。ベルセルク42巻はありますか？"
    await backend.durable.append_turns(sid, [text_turn(big), text_turn(ja)])
    turns = await backend.durable.get_turns(sid)
    assert turns[0].text == big
    assert turns[1].text == ja
    assert (await backend.durable.tail_turns(sid, 1))[0].text == ja


async def test_durable_rejects_bad_arguments(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    with pytest.raises(ValidationError):
        await backend.durable.append_turns(sid, [])
    with pytest.raises(ValidationError):
        await backend.durable.append_turns("bad\nid", [text_turn("a")])
    with pytest.raises(ValidationError):
        await backend.durable.get_turns(sid, 5, 2)
    with pytest.raises(ValidationError):
        await backend.durable.get_turn(sid, -1)
    with pytest.raises(ValidationError):
        await backend.durable.get_turn("x" * 10_000, 0)
    assert await backend.durable.next_index(sid) == 0


async def test_durable_ids_with_key_syntax_never_collide(backend: BackendUnderTest) -> None:
    base = fresh_id("s")
    variants = [
        base,
        f"{base}#TURN",
        f"{base}#1",
        f"{{{base}}}",
        f"{base}:x",
        f"{base} x",
        f"{base}%23",
        f"{base}/",
        f"{base}*",
    ]
    for i, sid in enumerate(variants):
        await backend.durable.append_turns(sid, [text_turn(f"v{i}")])
        await backend.durable.put_record(sid, "summary#1", {"i": i})
    for i, sid in enumerate(variants):
        assert [t.text for t in await backend.durable.get_turns(sid)] == [f"v{i}"], sid
        record = await backend.durable.get_record(sid, "summary#1")
        assert record is not None
        assert record.data == {"i": i}


# -- session records and user sessions ---------------------------------------------------


async def test_durable_record_compare_and_set(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    assert await backend.durable.get_record(sid, "summary") is None
    r1 = await backend.durable.put_record(
        sid, "summary", {"recent": "asked about Berserk", "through": 9}, expected_version=0
    )
    assert r1.version == 1
    assert r1.updated_at == backend.clock.now()
    with pytest.raises(ConflictError) as info:
        await backend.durable.put_record(sid, "summary", {"recent": "lost"}, expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    r2 = await backend.durable.put_record(sid, "summary", {"recent": "v2"}, expected_version=1)
    assert r2.version == 2
    r3 = await backend.durable.put_record(sid, "summary", {"recent": "v3"})
    assert r3.version == 3
    got = await backend.durable.get_record(sid, "summary")
    assert got == r3
    assert got.data == {"recent": "v3"}


async def test_durable_concurrent_record_cas_has_one_winner(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.durable.put_record(sid, "structured", {"facts": []})

    async def attempt(i: int) -> bool:
        try:
            await backend.durable.put_record(sid, "structured", {"facts": [i]}, expected_version=1)
        except ConflictError:
            return False
        return True

    outcomes = await asyncio.gather(*(attempt(i) for i in range(6)))
    assert outcomes.count(True) == 1
    got = await backend.durable.get_record(sid, "structured")
    assert got is not None
    assert got.version == 2
    assert got.data == {"facts": [outcomes.index(True)]}


async def test_durable_record_expiry(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.durable.put_record(
        sid, "watermarks", {"summarized_through": 10}, expires_at=backend.later(DAY)
    )
    backend.clock.advance(DAY - 1)
    assert await backend.durable.get_record(sid, "watermarks") is not None
    backend.clock.advance(1)
    assert await backend.durable.get_record(sid, "watermarks") is None
    # An expired record counts as absent for compare-and-set.
    again = await backend.durable.put_record(
        sid, "watermarks", {"summarized_through": 0}, expected_version=0
    )
    assert again.version == 1


async def test_durable_large_record_and_limit(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    rng = random.Random(3)
    facts = ["".join(rng.choice("abcdefghij ") for _ in range(100)) for _ in range(6000)]
    await backend.durable.put_record(sid, "structured", {"facts": facts})
    got = await backend.durable.get_record(sid, "structured")
    assert got is not None
    assert got.data == {"facts": facts}
    with pytest.raises(ValidationError, match="limit"):
        await backend.durable.put_record(sid, "structured", {"blob": "x" * (MAX_RECORD_BYTES + 1)})
    still = await backend.durable.get_record(sid, "structured")
    assert still == got
    with pytest.raises(ValidationError):
        await backend.durable.put_record(sid, "structured", {"bad": {1, 2}})


async def test_durable_sessions_of_a_user(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    other = fresh_id("u")
    t0 = backend.clock.now()
    refs = [
        SessionRef(session_id=fresh_id("s"), user_id=user, created_at=t0 + timedelta(minutes=i))
        for i in range(4)
    ]
    for ref in refs:
        await backend.durable.register_session(ref)
    await backend.durable.register_session(refs[0])
    await backend.durable.register_session(
        SessionRef(session_id=fresh_id("s"), user_id=other, created_at=t0)
    )
    listed = await backend.durable.list_sessions(user)
    assert listed == list(reversed(refs))
    assert await backend.durable.list_sessions(user, limit=2) == [refs[3], refs[2]]
    assert await backend.durable.list_sessions(fresh_id("u")) == []


async def test_durable_delete_session(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    sid, keep = fresh_id("s"), fresh_id("s")
    for s in (sid, keep):
        await backend.durable.register_session(
            SessionRef(session_id=s, user_id=user, created_at=backend.clock.now())
        )
        await backend.durable.append_turns(s, [text_turn("a"), text_turn("b")])
        await backend.durable.put_record(s, "summary", {"x": 1})
    await backend.durable.delete_session(sid)
    assert await backend.durable.get_turns(sid) == []
    assert await backend.durable.get_record(sid, "summary") is None
    assert [r.session_id for r in await backend.durable.list_sessions(user)] == [keep]
    assert len(await backend.durable.get_turns(keep)) == 2


# -- long-term memory ---------------------------------------------------------------------


async def test_durable_memory_round_trip(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    record = _memory(backend, user, content="好きなジャンルはセイネン")
    stored = await backend.durable.put_memory(record)
    assert stored == record
    assert await backend.durable.get_memory(user, record.memory_id) == record
    assert await backend.durable.get_memory(user, fresh_id("m")) is None
    assert await backend.durable.get_memory(fresh_id("u"), record.memory_id) is None


async def test_durable_get_memories_returns_live_records_of_that_user(
    backend: BackendUnderTest,
) -> None:
    user, other = fresh_id("u"), fresh_id("u")
    kept = _memory(backend, user, content="kept")
    big = _memory(backend, user, content="x" * 100_000)  # compressed on DynamoDB
    odd = _memory(backend, user, memory_id=f"{fresh_id('m')}#MEM:{{x}} %")
    expiring = _memory(backend, user, expires_in=DAY)
    theirs = _memory(backend, other, content="not mine")
    same_id_theirs = _memory(backend, other, memory_id=kept.memory_id, content="theirs")
    for record in (kept, big, odd, expiring, theirs, same_id_theirs):
        await backend.durable.put_memory(record)
    missing = fresh_id("m")
    asked = [
        kept.memory_id,
        missing,
        big.memory_id,
        kept.memory_id,
        odd.memory_id,
        expiring.memory_id,
        theirs.memory_id,
        odd.memory_id,
    ]

    got = await backend.durable.get_memories(user, asked)
    assert got == {r.memory_id: r for r in (kept, big, odd, expiring)}
    backend.clock.advance(DAY)
    got = await backend.durable.get_memories(user, tuple(asked))
    assert got == {r.memory_id: r for r in (kept, big, odd)}
    # The same answers as get_memory, one id at a time.
    for memory_id in asked:
        assert got.get(memory_id) == await backend.durable.get_memory(user, memory_id)
    assert await backend.durable.get_memories(other, {kept.memory_id, missing}) == {
        kept.memory_id: same_id_theirs
    }
    assert await backend.durable.get_memories(user, []) == {}
    assert await backend.durable.get_memories(fresh_id("u"), [kept.memory_id]) == {}


async def test_durable_get_memories_large_batch(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    records = [_memory(backend, user, content=f"m{i}") for i in range(150)]
    gate = asyncio.Semaphore(16)

    async def put(record: MemoryRecord) -> None:
        async with gate:
            await backend.durable.put_memory(record)

    await asyncio.gather(*(put(r) for r in records))
    stored = [r.memory_id for r in records]
    absent = [fresh_id("m") for _ in range(MAX_MEMORY_IDS_PER_GET - len(stored) - 50)]
    asked = [*stored[:75], *absent, *stored[75:], *stored[:50]]  # 50 duplicates
    assert len(asked) == MAX_MEMORY_IDS_PER_GET
    got = await backend.durable.get_memories(user, asked)
    assert got == {r.memory_id: r for r in records}
    assert await backend.durable.get_memories(user, stored[100:]) == {
        r.memory_id: r for r in records[100:]
    }


async def test_durable_get_memories_rejects_bad_arguments(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    record = _memory(backend, user)
    await backend.durable.put_memory(record)
    too_many = [record.memory_id] * (MAX_MEMORY_IDS_PER_GET + 1)
    with pytest.raises(ValidationError, match=str(MAX_MEMORY_IDS_PER_GET)):
        await backend.durable.get_memories(user, too_many)
    with pytest.raises(ValidationError):
        await backend.durable.get_memories(user, [record.memory_id, "bad\nid"])
    with pytest.raises(ValidationError):
        await backend.durable.get_memories(user, [record.memory_id, ""])
    with pytest.raises(ValidationError):
        await backend.durable.get_memories(user, record.memory_id)
    with pytest.raises(ValidationError):
        await backend.durable.get_memories("bad\nuser", [record.memory_id])


async def test_durable_memory_query_by_type_and_time(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    prefs = [_memory(backend, user, content=f"p{i}", age_s=DAY * i) for i in range(3)]
    summaries = [
        _memory(
            backend, user, memory_type="interaction_summary", content=f"s{i}", age_s=DAY * i + 10
        )
        for i in range(4)
    ]
    for r in [*prefs, *summaries]:
        await backend.durable.put_memory(r)
    await backend.durable.put_memory(_memory(backend, fresh_id("u"), content="not mine"))

    everything = await backend.durable.query_memories(user)
    assert [r.content for r in everything] == ["p0", "s0", "p1", "s1", "p2", "s2", "s3"]
    only_prefs = await backend.durable.query_memories(user, memory_types=["preference"])
    assert [r.content for r in only_prefs] == ["p0", "p1", "p2"]
    two_types = await backend.durable.query_memories(
        user, memory_types=["preference", "interaction_summary"], limit=3
    )
    assert [r.content for r in two_types] == ["p0", "s0", "p1"]
    now = backend.clock.now()
    window = await backend.durable.query_memories(
        user, since=now - timedelta(days=2), until=now - timedelta(seconds=5)
    )
    assert [r.content for r in window] == ["s0", "p1", "s1", "p2"]  # since is inclusive
    assert await backend.durable.query_memories(user, memory_types=["feedback"]) == []


async def test_durable_memory_retention_expiry(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    behavioral = _memory(backend, user, memory_type="behavioral_pattern", expires_in=30 * DAY)
    preference = _memory(backend, user)
    await backend.durable.put_memory(behavioral)
    await backend.durable.put_memory(preference)
    backend.clock.advance(30 * DAY)
    assert await backend.durable.get_memory(user, behavioral.memory_id) is None
    assert [r.memory_id for r in await backend.durable.query_memories(user)] == [
        preference.memory_id
    ]
    with_expired = await backend.durable.query_memories(user, include_expired=True)
    assert {r.memory_id for r in with_expired} == {behavioral.memory_id, preference.memory_id}


async def test_durable_memory_compare_and_set(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    v1 = _memory(backend, user, content="likes shojo")
    await backend.durable.put_memory(v1, expected_version=0)
    with pytest.raises(ConflictError):
        await backend.durable.put_memory(v1, expected_version=0)
    v2 = v1.model_copy(update={"content": "likes seinen", "version": 2})
    await backend.durable.put_memory(v2, expected_version=1)
    with pytest.raises(ConflictError) as info:
        await backend.durable.put_memory(
            v1.model_copy(update={"content": "stale", "version": 2}), expected_version=1
        )
    assert (info.value.expected, info.value.actual) == (1, 2)
    with pytest.raises(ValidationError):
        await backend.durable.put_memory(v2.model_copy(update={"version": 9}), expected_version=2)
    got = await backend.durable.get_memory(user, v1.memory_id)
    assert got == v2


async def test_durable_memory_size_limit(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    ok = _memory(backend, user, content="x" * 100_000)
    await backend.durable.put_memory(ok)
    with pytest.raises(ValidationError, match="limit"):
        await backend.durable.put_memory(
            _memory(backend, user, content="x" * MAX_MEMORY_BYTES, memory_id=ok.memory_id)
        )
    assert await backend.durable.get_memory(user, ok.memory_id) == ok


async def test_durable_delete_memory(backend: BackendUnderTest) -> None:
    user = fresh_id("u")
    record = _memory(backend, user)
    await backend.durable.put_memory(record)
    assert await backend.durable.delete_memory(user, record.memory_id) is True
    assert await backend.durable.delete_memory(user, record.memory_id) is False
    assert await backend.durable.get_memory(user, record.memory_id) is None
    assert await backend.durable.query_memories(user) == []


async def test_durable_purge_user_removes_everything_of_that_user_only(
    backend: BackendUnderTest,
) -> None:
    user, other = fresh_id("u"), fresh_id("u")
    sessions = {user: [fresh_id("s"), fresh_id("s")], other: [fresh_id("s")]}
    for owner, sids in sessions.items():
        for sid in sids:
            await backend.durable.register_session(
                SessionRef(session_id=sid, user_id=owner, created_at=backend.clock.now())
            )
            await backend.durable.append_turns(sid, [text_turn("hello"), text_turn("bye")])
            await backend.durable.put_record(sid, "summary", {"s": sid})
        for i in range(3):
            await backend.durable.put_memory(_memory(backend, owner, content=f"m{i}"))
    await backend.durable.put_memory(_memory(backend, user, expires_in=1))
    backend.clock.advance(2)

    deleted = await backend.durable.purge_user(user)
    assert deleted >= 2 + 3
    assert await backend.durable.list_sessions(user) == []
    assert await backend.durable.query_memories(user, include_expired=True) == []
    for sid in sessions[user]:
        assert await backend.durable.get_turns(sid) == []
        assert await backend.durable.get_record(sid, "summary") is None
        assert await backend.durable.next_index(sid) == 0
    # The other user is untouched.
    assert len(await backend.durable.list_sessions(other)) == 1
    assert len(await backend.durable.query_memories(other)) == 3
    assert len(await backend.durable.get_turns(sessions[other][0])) == 2


async def test_durable_timestamps_keep_microseconds(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    at = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    await backend.durable.append_turns(sid, [text_turn("a", at=at)])
    assert (await backend.durable.get_turn(sid, 0)).timestamp == at


# -- entity changes in the append (Capability.ENTITIES_IN_APPEND) ---------------------------


def _entities_in_append(backend: BackendUnderTest) -> None:
    if Capability.ENTITIES_IN_APPEND not in backend.durable.capabilities:
        pytest.skip(f"{backend.durable.name} durable store does not declare entities_in_append")


def _entity(backend: BackendUnderTest, kind: str, value: str, index: int) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=index, updated_at=backend.clock.now())


def _json(entity: ActiveEntity) -> dict[str, object]:
    return entity.model_dump(mode="json")


async def test_durable_append_merges_entities_record(backend: BackendUnderTest) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    series = _entity(backend, "series", "Berserk", 0)
    # The first change creates the record at version 1.
    await backend.durable.append_turns(
        sid, [text_turn("Berserk")], entities=EntityChange(upsert={"series": series})
    )
    got = await backend.durable.get_record(sid, ENTITIES_RECORD)
    assert got is not None
    assert (got.version, got.data) == (1, {"series": _json(series)})
    volume = _entity(backend, "volume", "42", 1)
    await backend.durable.put_record(
        sid, ENTITIES_RECORD, {**got.data, "volume": _json(volume)}, expected_version=1
    )
    naruto = _entity(backend, "series", "Naruto", 2)
    order = _entity(backend, "order", "ORD-1", 2)
    stored = await backend.durable.append_turns(
        sid,
        [text_turn("Naruto, and ORD-1")],
        first_index=1,  # pinned, as the session pins it
        entities=EntityChange(upsert={"series": naruto, "order": order}, remove=("volume", "x")),
    )
    assert [t.index for t in stored] == [1]
    got = await backend.durable.get_record(sid, ENTITIES_RECORD)
    assert got is not None
    assert got.version == 3  # one version for the append's merge
    assert got.data == {"series": _json(naruto), "order": _json(order)}
    assert [t.text for t in await backend.durable.get_turns(sid)] == [
        "Berserk",
        "Naruto, and ORD-1",
    ]
    # No change, or an empty one, leaves the record alone.
    await backend.durable.append_turns(sid, [text_turn("ok")])
    await backend.durable.append_turns(sid, [text_turn("ok")], entities=EntityChange())
    again = await backend.durable.get_record(sid, ENTITIES_RECORD)
    assert again is not None
    assert (again.version, again.data) == (3, got.data)


async def test_durable_retried_append_applies_no_entities(backend: BackendUnderTest) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    first = _entity(backend, "series", "Berserk", 0)
    stored = await backend.durable.append_turns(
        sid,
        [text_turn("Berserk")],
        idempotency_key="k-1",
        entities=EntityChange(upsert={"series": first}),
    )
    other = _entity(backend, "series", "Naruto", 0)
    # A retry (even with a stale first_index and another change) returns what the first
    # attempt stored and writes nothing.
    retried = await backend.durable.append_turns(
        sid,
        [text_turn("Berserk")],
        idempotency_key="k-1",
        first_index=0,
        entities=EntityChange(upsert={"series": other}, remove=("series",)),
    )
    assert retried == stored
    got = await backend.durable.get_record(sid, ENTITIES_RECORD)
    assert got is not None
    assert (got.version, got.data) == (1, {"series": _json(first)})
    assert await backend.durable.next_index(sid) == 1


async def test_durable_failed_append_writes_no_entities(backend: BackendUnderTest) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    await backend.durable.append_turns(sid, [text_turn("a")])
    change = EntityChange(upsert={"series": _entity(backend, "series", "Berserk", 1)})
    with pytest.raises(ConflictError):
        await backend.durable.append_turns(sid, [text_turn("b")], first_index=0, entities=change)
    huge = text_turn("x" * (MAX_TURN_BYTES + 1))
    with pytest.raises(ValidationError):
        await backend.durable.append_turns(sid, [huge], entities=change)
    with pytest.raises(ValidationError):
        await backend.durable.append_turns(
            sid, [text_turn("b")], entities=EntityChange(remove=("line\nbreak",))
        )
    assert await backend.durable.get_record(sid, ENTITIES_RECORD) is None
    assert [t.text for t in await backend.durable.get_turns(sid)] == ["a"]
    assert await backend.durable.next_index(sid) == 1


async def test_durable_concurrent_appends_with_entities_lose_no_kind(
    backend: BackendUnderTest,
) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")

    async def add(i: int) -> None:
        kind = f"kind{i}"
        await backend.durable.append_turns(
            sid,
            [text_turn(f"t{i}")],
            entities=EntityChange(upsert={kind: _entity(backend, kind, str(i), 0)}),
        )

    await asyncio.gather(*(add(i) for i in range(12)))
    got = await backend.durable.get_record(sid, ENTITIES_RECORD)
    assert got is not None
    assert sorted(got.data) == sorted(f"kind{i}" for i in range(12))
    assert got.version == 12
    assert [t.index for t in await backend.durable.get_turns(sid)] == list(range(12))


__all__ = [name for name in dir() if name.startswith("test_durable_")]
