"""Conformance tests for :class:`tiermem.store.contract.HotStore`.

Import them into a test module that defines a ``backend`` fixture (see
:mod:`tiermem.testing`). Time only moves through the fixture's fake clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.errors import ConflictError, ValidationError
from tiermem.models import (
    ActiveEntity,
    CachePointBlock,
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    NewTurn,
    ReasoningBlock,
    SessionMetadata,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tiermem.store.contract import MAX_TURN_BYTES, Capability, EntityChange
from tiermem.testing.backend import BackendUnderTest, fresh_id, text_turn

HOUR = 3600.0


def _metadata(session_id: str, backend: BackendUnderTest, **extra: object) -> SessionMetadata:
    now = backend.clock.now()
    return SessionMetadata.model_validate(
        {
            "session_id": session_id,
            "user_id": "u-1",
            "created_at": now,
            "last_activity": now,
            **extra,
        }
    )


async def test_hot_append_and_load_round_trip(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    result = await backend.hot.append_turns(
        sid,
        [text_turn("hello"), text_turn("hi there", role="assistant")],
        window=20,
        expires_at=backend.later(HOUR),
    )
    assert [t.index for t in result.turns] == [0, 1]
    assert result.version == 1
    assert result.next_index == 2
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["hello", "hi there"]
    assert [t.role for t in snap.turns] == ["user", "assistant"]
    assert snap.turns == result.turns
    assert snap.version == 1
    assert snap.next_index == 2
    assert snap.expires_at == backend.later(HOUR)


async def test_hot_load_unknown_session_is_none(backend: BackendUnderTest) -> None:
    assert await backend.hot.load(fresh_id("nobody")) is None


async def test_hot_indexes_continue_across_appends(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    for i in range(5):
        r = await backend.hot.append_turns(
            sid, [text_turn(f"t{i}")], window=20, expires_at=backend.later(HOUR)
        )
        assert r.turns[0].index == i
        assert r.version == i + 1
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == [f"t{i}" for i in range(5)]


async def test_hot_window_keeps_only_the_last_turns(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    for i in range(7):
        await backend.hot.append_turns(
            sid, [text_turn(f"t{i}")], window=3, expires_at=backend.later(HOUR)
        )
    big = await backend.hot.append_turns(
        sid,
        [text_turn("a"), text_turn("b"), text_turn("c"), text_turn("d")],
        window=3,
        expires_at=backend.later(HOUR),
    )
    assert [t.index for t in big.turns] == [7, 8, 9, 10]
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.index for t in snap.turns] == [8, 9, 10]
    assert snap.next_index == 11


async def test_hot_first_index_starts_numbering_of_absent_session(
    backend: BackendUnderTest,
) -> None:
    sid = fresh_id("s")
    r = await backend.hot.append_turns(
        sid, [text_turn("after reload")], window=5, expires_at=backend.later(HOUR), first_index=42
    )
    assert r.turns[0].index == 42
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.next_index == 43


async def test_hot_first_index_mismatch_on_live_session_conflicts(
    backend: BackendUnderTest,
) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(HOUR))
    with pytest.raises(ConflictError) as info:
        await backend.hot.append_turns(
            sid, [text_turn("b")], window=5, expires_at=backend.later(HOUR), first_index=5
        )
    assert info.value.expected == 5
    assert info.value.actual == 1
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["a"]
    assert snap.version == 1


async def test_hot_expected_version_guards_append(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(
        sid, [text_turn("a")], window=5, expires_at=backend.later(HOUR), expected_version=0
    )
    with pytest.raises(ConflictError) as info:
        await backend.hot.append_turns(
            sid, [text_turn("b")], window=5, expires_at=backend.later(HOUR), expected_version=0
        )
    assert (info.value.expected, info.value.actual) == (0, 1)
    r = await backend.hot.append_turns(
        sid, [text_turn("c")], window=5, expires_at=backend.later(HOUR), expected_version=1
    )
    assert r.version == 2
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["a", "c"]


async def test_hot_append_with_metadata_in_one_write(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    meta = _metadata(sid, backend, turn_count=1, active_intent="product_search")
    r = await backend.hot.append_turns(
        sid, [text_turn("a")], window=5, expires_at=backend.later(HOUR), metadata=meta
    )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.metadata == meta
    assert snap.version == r.version == 1


async def test_hot_put_metadata_compare_and_set(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    v1 = await backend.hot.put_metadata(
        sid, _metadata(sid, backend), expires_at=backend.later(HOUR), expected_version=0
    )
    assert v1 == 1
    updated = _metadata(sid, backend, locale="ja-JP", cart_item_count=2)
    v2 = await backend.hot.put_metadata(
        sid, updated, expires_at=backend.later(HOUR), expected_version=1
    )
    assert v2 == 2
    with pytest.raises(ConflictError):
        await backend.hot.put_metadata(
            sid,
            _metadata(sid, backend, locale="en-GB"),
            expires_at=backend.later(HOUR),
            expected_version=1,
        )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.metadata == updated


async def test_hot_session_expires_with_the_clock(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(60))
    backend.clock.advance(59)
    assert await backend.hot.load(sid) is not None
    backend.clock.advance(1)
    assert await backend.hot.load(sid) is None
    assert await backend.hot.get_state(sid, "dialogue") is None


async def test_hot_expired_session_readable_for_handoff(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(
        sid, [text_turn("unflushed")], window=5, expires_at=backend.later(60)
    )
    backend.clock.advance(61)
    assert await backend.hot.load(sid) is None
    snap = await backend.hot.load(sid, include_expired=True)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["unflushed"]
    assert snap.expires_at == backend.later(-1)


async def test_hot_write_after_expiry_starts_afresh(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("old")], window=5, expires_at=backend.later(60))
    await backend.hot.put_state(
        sid, "dialogue", {"phase": "greeting"}, expires_at=backend.later(60)
    )
    await backend.hot.update_entities(
        sid,
        {"series": ActiveEntity(kind="series", value="Berserk", updated_at=backend.clock.now())},
        expires_at=backend.later(60),
    )
    backend.clock.advance(61)
    r = await backend.hot.append_turns(
        sid,
        [text_turn("new")],
        window=5,
        expires_at=backend.later(60),
        first_index=1,
        expected_version=0,
    )
    assert r.version == 1
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["new"]
    assert snap.turns[0].index == 1
    assert snap.state == {}
    assert snap.entities == {}


def _keeps_expired(backend: BackendUnderTest) -> None:
    if Capability.KEEP_EXPIRED not in backend.hot.capabilities:
        pytest.skip(f"{backend.hot.name} hot store does not declare keep_expired")


async def test_hot_append_keeping_expired_refuses_a_held_session(
    backend: BackendUnderTest,
) -> None:
    _keeps_expired(backend)
    sid = fresh_id("s")
    await backend.hot.append_turns(
        sid, [text_turn("unflushed")], window=5, expires_at=backend.later(60)
    )
    backend.clock.advance(61)
    held = await backend.hot.load(sid, include_expired=True)
    assert held is not None
    for pinned in ({}, {"expected_version": 0}, {"first_index": 1}):
        with pytest.raises(ConflictError) as caught:
            await backend.hot.append_turns(
                sid,
                [text_turn("new")],
                window=5,
                expires_at=backend.later(60),
                keep_expired=True,
                **pinned,  # type: ignore[arg-type]
            )
        assert caught.value.actual == held.version
    # Nothing was written: the held copy is as it was, still expired.
    assert await backend.hot.load(sid) is None
    assert await backend.hot.load(sid, include_expired=True) == held
    # Without keep_expired the session starts afresh, as before.
    r = await backend.hot.append_turns(
        sid, [text_turn("new")], window=5, expires_at=backend.later(60)
    )
    assert (r.version, r.turns[0].index) == (1, 0)


async def test_hot_append_keeping_expired_appends_to_a_live_or_absent_session(
    backend: BackendUnderTest,
) -> None:
    _keeps_expired(backend)
    sid = fresh_id("s")
    first = await backend.hot.append_turns(
        sid, [text_turn("a")], window=5, expires_at=backend.later(60), keep_expired=True
    )
    second = await backend.hot.append_turns(
        sid, [text_turn("b")], window=5, expires_at=backend.later(60), keep_expired=True
    )
    assert [(r.version, r.turns[0].index) for r in (first, second)] == [(1, 0), (2, 1)]
    # Collected (past expiry + gc grace: load with include_expired no longer sees it):
    # nothing is held, so the append starts the session afresh.
    backend.clock.advance(timedelta(days=30))
    assert await backend.hot.load(sid, include_expired=True) is None
    again = await backend.hot.append_turns(
        sid, [text_turn("c")], window=5, expires_at=backend.later(60), keep_expired=True
    )
    assert (again.version, again.turns[0].index) == (1, 0)
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["c"]


async def test_hot_touch_extends_expiry_without_a_new_version(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(60))
    backend.clock.advance(50)
    assert await backend.hot.touch(sid, expires_at=backend.later(60)) is True
    backend.clock.advance(50)
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.version == 1
    assert snap.expires_at == backend.later(10)


async def test_hot_touch_of_absent_or_expired_session_is_false(backend: BackendUnderTest) -> None:
    assert await backend.hot.touch(fresh_id("s"), expires_at=backend.later(60)) is False
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(10))
    backend.clock.advance(10)
    assert await backend.hot.touch(sid, expires_at=backend.later(60)) is False
    assert await backend.hot.load(sid) is None


async def test_hot_entities_merge_and_remove(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    now = backend.clock.now()
    await backend.hot.put_metadata(sid, _metadata(sid, backend), expires_at=backend.later(HOUR))
    series = ActiveEntity(kind="series", value="Berserk", turn_index=0, updated_at=now)
    volume = ActiveEntity(kind="volume", value="42", turn_index=0, updated_at=now)
    await backend.hot.update_entities(
        sid, {"series": series, "volume": volume}, expires_at=backend.later(HOUR)
    )
    naruto = ActiveEntity(kind="series", value="Naruto", turn_index=3, updated_at=now)
    await backend.hot.update_entities(
        sid, {"series": naruto}, ["volume", "missing"], expires_at=backend.later(HOUR)
    )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.entities == {"series": naruto}


async def test_hot_concurrent_entity_updates_do_not_lose_kinds(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    now = backend.clock.now()
    await backend.hot.put_metadata(sid, _metadata(sid, backend), expires_at=backend.later(HOUR))

    async def put(kind: str) -> None:
        await backend.hot.update_entities(
            sid,
            {kind: ActiveEntity(kind=kind, value=kind.upper(), updated_at=now)},
            expires_at=backend.later(HOUR),
        )

    kinds = [f"kind{i}" for i in range(12)]
    await asyncio.gather(*(put(k) for k in kinds))
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert sorted(snap.entities) == sorted(kinds)
    assert snap.version == len(kinds) + 1


async def test_hot_state_compare_and_set(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    first = await backend.hot.put_state(
        sid,
        "dialogue",
        {"phase": "greeting", "slots": {"genre": None}},
        expires_at=backend.later(HOUR),
        expected_version=0,
    )
    assert first.version == 1
    with pytest.raises(ConflictError) as info:
        await backend.hot.put_state(
            sid, "dialogue", {"phase": "x"}, expires_at=backend.later(HOUR), expected_version=0
        )
    assert (info.value.expected, info.value.actual) == (0, 1)
    second = await backend.hot.put_state(
        sid,
        "dialogue",
        {"phase": "slot_filling"},
        expires_at=backend.later(HOUR),
        expected_version=1,
    )
    assert second.version == 2
    forced = await backend.hot.put_state(
        sid, "dialogue", {"phase": "farewell"}, expires_at=backend.later(HOUR)
    )
    assert forced.version == 3
    got = await backend.hot.get_state(sid, "dialogue")
    assert got is not None
    assert got.data == {"phase": "farewell"}
    assert got.version == 3
    assert await backend.hot.get_state(sid, "tools") is None
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.state["dialogue"] == got


async def test_hot_concurrent_state_cas_has_one_winner(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.put_state(sid, "task", {"n": 0}, expires_at=backend.later(HOUR))

    async def attempt(i: int) -> bool:
        try:
            await backend.hot.put_state(
                sid, "task", {"n": i}, expires_at=backend.later(HOUR), expected_version=1
            )
        except ConflictError:
            return False
        return True

    outcomes = await asyncio.gather(*(attempt(i) for i in range(1, 9)))
    assert outcomes.count(True) == 1
    got = await backend.hot.get_state(sid, "task")
    assert got is not None
    assert got.version == 2
    assert got.data == {"n": outcomes.index(True) + 1}


async def test_hot_concurrent_appends_are_gap_free(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    tasks, per_task = 8, 10

    async def writer(w: int) -> list[int]:
        indexes = []
        for i in range(per_task):
            r = await backend.hot.append_turns(
                sid, [text_turn(f"w{w}-{i}")], window=1000, expires_at=backend.later(HOUR)
            )
            indexes.append(r.turns[0].index)
        return indexes

    results = await asyncio.gather(*(writer(w) for w in range(tasks)))
    allocated = sorted(i for r in results for i in r)
    assert allocated == list(range(tasks * per_task))
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.index for t in snap.turns] == list(range(tasks * per_task))
    assert sorted(t.text for t in snap.turns) == sorted(
        f"w{w}-{i}" for w in range(tasks) for i in range(per_task)
    )
    assert snap.version == tasks * per_task


async def test_hot_delete_removes_everything(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(60))
    await backend.hot.put_state(sid, "dialogue", {"x": 1}, expires_at=backend.later(60))
    await backend.hot.delete(sid)
    assert await backend.hot.load(sid) is None
    assert await backend.hot.get_state(sid, "dialogue") is None
    backend.clock.advance(120)
    assert sid not in await backend.hot.claim_expired(owner="w1", lease=timedelta(minutes=5))
    await backend.hot.delete(fresh_id("never-existed"))


async def _expired_sessions(backend: BackendUnderTest, count: int) -> list[str]:
    sids = [fresh_id("exp") for _ in range(count)]
    for sid in sids:
        await backend.hot.append_turns(
            sid, [text_turn("x")], window=5, expires_at=backend.later(30)
        )
    backend.clock.advance(31)
    return sids


async def test_hot_claim_expired_leases_each_session_once(backend: BackendUnderTest) -> None:
    # Other tests share the server, so look only at this test's sessions.
    sids = set(await _expired_sessions(backend, 6))
    lease = timedelta(minutes=5)
    claimed_a = set(await backend.hot.claim_expired(owner="worker-a", lease=lease, limit=1000))
    claimed_b = set(await backend.hot.claim_expired(owner="worker-b", lease=lease, limit=1000))
    assert sids <= claimed_a
    assert not (sids & claimed_b)
    for sid in sids:
        assert await backend.hot.release_expired(sid, owner="worker-b") is False
        assert await backend.hot.release_expired(sid, owner="worker-a") is True
    backend.clock.advance(lease.total_seconds() + 1)
    again = set(await backend.hot.claim_expired(owner="worker-b", lease=lease, limit=1000))
    assert not (sids & again)


async def test_hot_claim_respects_limit(backend: BackendUnderTest) -> None:
    await _expired_sessions(backend, 5)
    got = await backend.hot.claim_expired(owner="w", lease=timedelta(minutes=5), limit=2)
    assert len(got) == 2


async def test_hot_crashed_worker_lease_runs_out(backend: BackendUnderTest) -> None:
    sids = set(await _expired_sessions(backend, 3))
    lease = timedelta(minutes=5)
    assert sids <= set(await backend.hot.claim_expired(owner="crashed", lease=lease, limit=1000))
    backend.clock.advance(lease.total_seconds() - 1)
    assert not (sids & set(await backend.hot.claim_expired(owner="b", lease=lease, limit=1000)))
    backend.clock.advance(2)
    assert sids <= set(await backend.hot.claim_expired(owner="b", lease=lease, limit=1000))


async def test_hot_session_not_claimed_before_expiry_and_write_clears_lease(
    backend: BackendUnderTest,
) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(60))
    assert sid not in await backend.hot.claim_expired(
        owner="w", lease=timedelta(minutes=5), limit=1000
    )
    backend.clock.advance(61)
    assert sid in await backend.hot.claim_expired(owner="w", lease=timedelta(minutes=5), limit=1000)
    # The user comes back: the session lives again and the old claim is void.
    await backend.hot.append_turns(
        sid, [text_turn("b")], window=5, expires_at=backend.later(60), first_index=1
    )
    assert await backend.hot.release_expired(sid, owner="w") is False
    backend.clock.advance(61)
    assert sid in await backend.hot.claim_expired(
        owner="w2", lease=timedelta(minutes=5), limit=1000
    )


async def test_hot_all_block_kinds_round_trip(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    turn = NewTurn(
        role="assistant",
        content=(
            TextBlock(text="Let me check."),
            ReasoningBlock(text="user wants vol 42", signature="sig", redacted=b"\x00\xffopaque"),
            ToolUseBlock(tool_use_id="tu-1", name="search", input={"q": "Berserk", "vol": 42}),
            ImageBlock(format="png", data=bytes(range(256))),
            DocumentBlock(format="pdf", name="catalog", uri="s3://bucket/catalog.pdf"),
            CachePointBlock(),
        ),
        timestamp=datetime(2030, 1, 1, 12, 30, 15, 123456, tzinfo=UTC),
        token_count=17,
        importance=0.85,
        pinned=True,
        agent_name="ProductSearchAgent",
        intent="product_search",
        latency_ms=123.5,
        metadata={"trace": {"id": "abc", "spans": [1, 2]}},
    )
    result = NewTurn(
        role="user",
        content=(
            ToolResultBlock(
                tool_use_id="tu-1",
                status="error",
                content=(TextBlock(text="timeout"), JsonBlock(json_={"code": 504})),
            ),
        ),
        timestamp=datetime(2030, 1, 1, 12, 30, 16, tzinfo=UTC),
    )
    r = await backend.hot.append_turns(
        sid, [turn, result], window=5, expires_at=backend.later(HOUR)
    )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.turns == r.turns
    assert snap.turns[0].content == turn.content
    assert snap.turns[0].timestamp == turn.timestamp
    assert snap.turns[1].content == result.content


async def test_hot_unicode_round_trip(backend: BackendUnderTest) -> None:
    sid = fresh_id("セッション")
    text = "好きなジャンルはセイネンです。ベルセルク42巻はありますか？ 🍣 \u0000 end"
    await backend.hot.append_turns(sid, [text_turn(text)], window=5, expires_at=backend.later(HOUR))
    await backend.hot.put_state(
        sid, "対話", {"ジャンル": "セイネン"}, expires_at=backend.later(HOUR)
    )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.turns[0].text == text
    assert snap.state["対話"].data == {"ジャンル": "セイネン"}


async def test_hot_large_turn_round_trips(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    # Not compressible, so a backend cannot pass by compression alone.
    rng = random.Random(7)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(700_000))
    await backend.hot.append_turns(sid, [text_turn(text)], window=5, expires_at=backend.later(HOUR))
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.turns[0].text == text


async def test_hot_oversized_turn_is_rejected_and_nothing_written(
    backend: BackendUnderTest,
) -> None:
    sid = fresh_id("s")
    await backend.hot.append_turns(
        sid, [text_turn("keep me")], window=5, expires_at=backend.later(HOUR)
    )
    with pytest.raises(ValidationError, match="limit"):
        await backend.hot.append_turns(
            sid,
            [text_turn("ok"), text_turn("x" * (MAX_TURN_BYTES + 1))],
            window=5,
            expires_at=backend.later(HOUR),
        )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["keep me"]
    assert snap.version == 1


async def test_hot_rejects_bad_arguments_before_writing(backend: BackendUnderTest) -> None:
    sid = fresh_id("s")
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(sid, [], window=5, expires_at=backend.later(HOUR))
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(
            sid, [text_turn("a")], window=0, expires_at=backend.later(HOUR)
        )
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(
            sid, [text_turn("a")] * 101, window=5, expires_at=backend.later(HOUR)
        )
    assert await backend.hot.load(sid) is None


@pytest.mark.parametrize(
    "bad_id",
    ["", "line\nbreak", "tab\there", "x" * 10_000, "nul\x00"],
    ids=["empty", "newline", "tab", "10kb", "nul"],
)
async def test_hot_invalid_ids_are_rejected(backend: BackendUnderTest, bad_id: str) -> None:
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(
            bad_id, [text_turn("a")], window=5, expires_at=backend.later(HOUR)
        )
    with pytest.raises(ValidationError):
        await backend.hot.load(bad_id)


async def test_hot_ids_with_key_syntax_never_collide(backend: BackendUnderTest) -> None:
    base = fresh_id("s")
    variants = [
        base,
        f"{base}:turns",
        f"{base}:meta",
        f"{{{base}}}",
        f"{base}#1",
        f"{base}*",
        f"{base}/x",
        f"{base} x",
        f"{base}%3A",
        f"{base}%",
        f"{base}}}:{{",
        f"{base}\\",
    ]
    for i, sid in enumerate(variants):
        await backend.hot.append_turns(
            sid, [text_turn(f"v{i}")], window=5, expires_at=backend.later(HOUR)
        )
        await backend.hot.put_state(sid, "s:1", {"i": i}, expires_at=backend.later(HOUR))
    for i, sid in enumerate(variants):
        snap = await backend.hot.load(sid)
        assert snap is not None, sid
        assert [t.text for t in snap.turns] == [f"v{i}"], sid
        assert snap.state["s:1"].data == {"i": i}


# -- entity changes in the append (Capability.ENTITIES_IN_APPEND) ---------------------------


def _entities_in_append(backend: BackendUnderTest) -> None:
    if Capability.ENTITIES_IN_APPEND not in backend.hot.capabilities:
        pytest.skip(f"{backend.hot.name} hot store does not declare entities_in_append")


async def test_hot_append_merges_entities_in_the_same_write(backend: BackendUnderTest) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    now = backend.clock.now()
    await backend.hot.put_metadata(sid, _metadata(sid, backend), expires_at=backend.later(HOUR))
    series = ActiveEntity(kind="series", value="Berserk", turn_index=0, updated_at=now)
    volume = ActiveEntity(kind="volume", value="42", turn_index=0, updated_at=now)
    await backend.hot.update_entities(
        sid, {"series": series, "volume": volume}, expires_at=backend.later(HOUR)
    )
    naruto = ActiveEntity(kind="series", value="Naruto", turn_index=0, updated_at=now)
    order = ActiveEntity(kind="order", value="ORD-1", turn_index=0, updated_at=now)
    change = EntityChange(upsert={"series": naruto, "order": order}, remove=("volume", "nope"))
    result = await backend.hot.append_turns(
        sid,
        [text_turn("Naruto, order ORD-1")],
        window=5,
        expires_at=backend.later(HOUR),
        entities=change,
    )
    assert result.version == 3  # metadata, entities, then one write for turns + entities
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.entities == {"series": naruto, "order": order}
    assert [t.text for t in snap.turns] == ["Naruto, order ORD-1"]
    assert snap.version == 3
    # An empty change leaves the entities as they are.
    await backend.hot.append_turns(
        sid, [text_turn("ok")], window=5, expires_at=backend.later(HOUR), entities=EntityChange()
    )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.entities == {"series": naruto, "order": order}


async def test_hot_failed_append_writes_no_entities(backend: BackendUnderTest) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    now = backend.clock.now()
    await backend.hot.append_turns(sid, [text_turn("a")], window=5, expires_at=backend.later(HOUR))
    change = EntityChange(
        upsert={"series": ActiveEntity(kind="series", value="Berserk", updated_at=now)}
    )
    with pytest.raises(ConflictError):
        await backend.hot.append_turns(
            sid,
            [text_turn("b")],
            window=5,
            expires_at=backend.later(HOUR),
            first_index=7,
            entities=change,
        )
    with pytest.raises(ConflictError):
        await backend.hot.append_turns(
            sid,
            [text_turn("b")],
            window=5,
            expires_at=backend.later(HOUR),
            expected_version=9,
            entities=change,
        )
    huge = text_turn("x" * (MAX_TURN_BYTES + 1))
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(
            sid, [huge], window=5, expires_at=backend.later(HOUR), entities=change
        )
    bad = EntityChange(remove=("line\nbreak",))
    with pytest.raises(ValidationError):
        await backend.hot.append_turns(
            sid, [text_turn("b")], window=5, expires_at=backend.later(HOUR), entities=bad
        )
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert snap.entities == {}
    assert [t.text for t in snap.turns] == ["a"]
    assert snap.version == 1


async def test_hot_concurrent_appends_with_entities_lose_no_kind(
    backend: BackendUnderTest,
) -> None:
    _entities_in_append(backend)
    sid = fresh_id("s")
    now = backend.clock.now()

    async def add(i: int) -> None:
        kind = f"kind{i}"
        await backend.hot.append_turns(
            sid,
            [text_turn(f"t{i}")],
            window=50,
            expires_at=backend.later(HOUR),
            entities=EntityChange(
                upsert={kind: ActiveEntity(kind=kind, value=str(i), updated_at=now)}
            ),
        )

    await asyncio.gather(*(add(i) for i in range(12)))
    snap = await backend.hot.load(sid)
    assert snap is not None
    assert sorted(snap.entities) == sorted(f"kind{i}" for i in range(12))
    assert sorted(t.index for t in snap.turns) == list(range(12))
    assert snap.version == 12


__all__ = [name for name in dir() if name.startswith("test_hot_")]
