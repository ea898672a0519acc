"""Conformance tests for the hot tier's shared keyspace: named compare-and-set blobs that
belong to no session (:meth:`~tiermem.store.contract.HotStore.get_shared`,
:meth:`~tiermem.store.contract.HotStore.put_shared`,
:meth:`~tiermem.store.contract.HotStore.delete_shared`). Circuit breakers keep their state
there, so every worker of a deployment sees the same breaker.

Import them into a test module that defines a ``backend`` fixture (see
:mod:`tiermem.testing`). Time only moves through the fixture's fake clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta

import pytest

from tiermem.errors import ConflictError, ValidationError
from tiermem.models import JsonValue, StateBlob
from tiermem.store.contract import MAX_SHARED_BYTES
from tiermem.testing.backend import BackendUnderTest, fresh_id, text_turn

HOUR = 3600.0
YEAR = 365 * 24 * HOUR


async def test_shared_absent_is_none(backend: BackendUnderTest) -> None:
    assert await backend.hot.get_shared(fresh_id("breaker")) is None


async def test_shared_put_and_get_round_trip(backend: BackendUnderTest) -> None:
    name = fresh_id("breaker")
    data: dict[str, JsonValue] = {
        "state": "open",
        "failures": [1.5, 2.25],
        "probe": None,
        "nested": {"ok": True, "テキスト": "日本語 🍣"},
    }
    put = await backend.hot.put_shared(name, data, expires_at=backend.later(HOUR))
    assert put == StateBlob(name=name, data=data, version=1, updated_at=backend.clock.now())
    backend.clock.advance(1)
    got = await backend.hot.get_shared(name)
    assert got == put


async def test_shared_compare_and_set(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    first = await hot.put_shared(name, {"n": 1}, expires_at=backend.later(HOUR), expected_version=0)
    assert first.version == 1
    with pytest.raises(ConflictError) as info:
        await hot.put_shared(name, {"n": -1}, expires_at=backend.later(HOUR), expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    backend.clock.advance(5)
    second = await hot.put_shared(
        name, {"n": 2}, expires_at=backend.later(HOUR), expected_version=1
    )
    assert second.version == 2
    assert second.updated_at == backend.clock.now()
    with pytest.raises(ConflictError) as info:
        await hot.put_shared(
            name, {"n": -2}, expires_at=backend.later(2 * HOUR), expected_version=1
        )
    assert (info.value.expected, info.value.actual) == (1, 2)
    with pytest.raises(ConflictError) as info:
        await hot.put_shared(
            name, {"n": -3}, expires_at=backend.later(2 * HOUR), expected_version=7
        )
    assert (info.value.expected, info.value.actual) == (7, 2)
    # The failed writes changed nothing, not even the expiry.
    assert await hot.get_shared(name) == second
    backend.clock.advance(HOUR)
    assert await hot.get_shared(name) is None


async def test_shared_unconditional_put_bumps_the_version(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    for expected in (1, 2, 3):
        blob = await hot.put_shared(name, {"n": expected}, expires_at=backend.later(HOUR))
        assert blob.version == expected
    got = await hot.get_shared(name)
    assert got is not None
    assert (got.version, got.data) == (3, {"n": 3})


async def test_shared_blob_expires_with_the_clock(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    await hot.put_shared(name, {"state": "open"}, expires_at=backend.later(60))
    backend.clock.advance(59)
    assert await hot.get_shared(name) is not None
    backend.clock.advance(1)  # exactly at expires_at
    assert await hot.get_shared(name) is None
    with pytest.raises(ConflictError) as info:
        await hot.put_shared(name, {"x": 1}, expires_at=backend.later(60), expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 0)
    fresh = await hot.put_shared(
        name, {"state": "closed"}, expires_at=backend.later(60), expected_version=0
    )
    assert fresh.version == 1
    assert fresh.data == {"state": "closed"}
    assert await hot.get_shared(name) == fresh


async def test_shared_unconditional_put_after_expiry_restarts_at_one(
    backend: BackendUnderTest,
) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    await hot.put_shared(name, {"n": 1}, expires_at=backend.later(60))
    await hot.put_shared(name, {"n": 2}, expires_at=backend.later(60))
    backend.clock.advance(61)
    again = await hot.put_shared(name, {"n": 3}, expires_at=backend.later(60))
    assert again.version == 1


async def test_shared_blob_without_expiry_lives_forever(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    put = await hot.put_shared(name, {"state": "closed"}, expires_at=None)
    backend.clock.advance(YEAR)
    assert await hot.get_shared(name) == put
    # An expiry can be given later, and taken away again.
    await hot.put_shared(name, {"state": "open"}, expires_at=backend.later(60))
    forever = await hot.put_shared(name, {"state": "closed"}, expires_at=None)
    assert forever.version == 3
    backend.clock.advance(YEAR)
    assert await hot.get_shared(name) == forever


async def test_shared_delete(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    assert await hot.delete_shared(name) is False
    await hot.put_shared(name, {"n": 1}, expires_at=backend.later(HOUR))
    await hot.put_shared(name, {"n": 2}, expires_at=backend.later(HOUR))
    assert await hot.delete_shared(name) is True
    assert await hot.get_shared(name) is None
    assert await hot.delete_shared(name) is False
    again = await hot.put_shared(name, {"n": 3}, expires_at=backend.later(HOUR), expected_version=0)
    assert again.version == 1


async def test_shared_delete_of_an_expired_blob_is_false(backend: BackendUnderTest) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    await hot.put_shared(name, {"n": 1}, expires_at=backend.later(60))
    backend.clock.advance(60)
    assert await hot.delete_shared(name) is False
    assert await hot.get_shared(name) is None


async def test_shared_concurrent_increments_lose_nothing(backend: BackendUnderTest) -> None:
    """16 workers each add 1 to a counter: read, write with the version read, and on a
    conflict read again. Every increment lands exactly once."""
    hot, name = backend.hot, fresh_id("counter")
    conflicts = 0

    async def increment() -> None:
        nonlocal conflicts
        while True:
            current = await hot.get_shared(name)
            count = current.data["count"] if current is not None else 0
            assert isinstance(count, int)
            await asyncio.sleep(0)  # let the other workers read the same version
            try:
                await hot.put_shared(
                    name,
                    {"count": count + 1},
                    expires_at=backend.later(HOUR),
                    expected_version=current.version if current is not None else 0,
                )
            except ConflictError:
                conflicts += 1
                continue
            return

    await asyncio.gather(*(increment() for _ in range(16)))
    got = await hot.get_shared(name)
    assert got is not None
    assert got.data == {"count": 16}
    assert got.version == 16
    assert conflicts > 0  # the workers did race


async def test_shared_names_with_key_syntax_never_collide(backend: BackendUnderTest) -> None:
    base = fresh_id("b")
    variants = [
        base,
        f"{base}:x",
        f"x:{base}",
        f"{{{base}}}",
        f"{base}#1",
        f"SHARED#{base}",
        f"{base}*",
        f"{base}?",
        f"{base}/x",
        f"{base} x",
        f"{base}%3A",
        f"{base}%",
        f"{base}}}:{{",
        f"{base}\\",
        f"{base}|x",
        f"{base}=x",
        f"{base}'\"",
        f"{base}[0]",
    ]
    for i, name in enumerate(variants):
        await backend.hot.put_shared(name, {"i": i}, expires_at=backend.later(HOUR))
    for i, name in enumerate(variants):
        got = await backend.hot.get_shared(name)
        assert got is not None, name
        assert (got.name, got.data, got.version) == (name, {"i": i}, 1), name


async def test_shared_names_never_collide_with_sessions(backend: BackendUnderTest) -> None:
    hot, sid = backend.hot, fresh_id("s")
    await hot.append_turns(sid, [text_turn("hello")], window=5, expires_at=backend.later(HOUR))
    state = await hot.put_state(sid, "breaker", {"mine": True}, expires_at=backend.later(HOUR))
    before = await hot.load(sid)
    assert before is not None
    # Names that spell out where a backend might keep the session's data.
    names = [
        sid,
        "breaker",
        f"{sid}:breaker",
        f"{sid}:state",
        f"{sid}:state:breaker",
        f"s={sid}",
        f"{{s={sid}}}",
        f"{{s={sid}}}:state",
        f"SESSION#{sid}",
        f"HOT#{sid}",
        "STATE#breaker",
    ]
    for i, name in enumerate(names):
        await hot.put_shared(name, {"i": i}, expires_at=backend.later(HOUR))
    assert await hot.load(sid) == before
    assert await hot.get_state(sid, "breaker") == state
    for i, name in enumerate(names):
        got = await hot.get_shared(name)
        assert got is not None, name
        assert got.data == {"i": i}, name
    # And the other way round: session writes leave the shared blobs alone.
    await hot.put_state(sid, "breaker", {"mine": False}, expires_at=backend.later(HOUR))
    await hot.delete(sid)
    for i, name in enumerate(names):
        got = await hot.get_shared(name)
        assert got is not None, name
        assert (got.data, got.version) == ({"i": i}, 1), name


async def test_shared_blob_and_session_state_of_one_name_are_independent(
    backend: BackendUnderTest,
) -> None:
    hot, sid, name = backend.hot, fresh_id("s"), fresh_id("breaker")
    shared = await hot.put_shared(name, {"scope": "shared"}, expires_at=backend.later(HOUR))
    await hot.put_state(sid, name, {"scope": "session"}, expires_at=backend.later(HOUR))
    state = await hot.put_state(
        sid, name, {"scope": "session", "n": 2}, expires_at=backend.later(HOUR)
    )
    assert state.version == 2
    assert await hot.get_shared(name) == shared
    assert await hot.get_state(sid, name) == state
    # A shared name is not a session, and a shared write starts none.
    assert await hot.load(name) is None
    assert await hot.delete_shared(name) is True
    assert await hot.get_state(sid, name) == state


async def test_shared_blobs_are_not_sessions_to_hand_off(backend: BackendUnderTest) -> None:
    name = fresh_id("breaker")
    await backend.hot.put_shared(name, {"state": "open"}, expires_at=backend.later(10))
    backend.clock.advance(11)
    claimed = await backend.hot.claim_expired(owner="w", lease=timedelta(minutes=5), limit=1000)
    assert name not in claimed


@pytest.mark.parametrize(
    "bad_name",
    ["", "line\nbreak", "tab\there", "x" * 10_000, "nul\x00", 42],
    ids=["empty", "newline", "tab", "10kb", "nul", "not-a-string"],
)
async def test_shared_bad_names_are_rejected(backend: BackendUnderTest, bad_name: str) -> None:
    with pytest.raises(ValidationError):
        await backend.hot.get_shared(bad_name)
    with pytest.raises(ValidationError):
        await backend.hot.put_shared(bad_name, {"n": 1}, expires_at=backend.later(HOUR))
    with pytest.raises(ValidationError):
        await backend.hot.delete_shared(bad_name)


@pytest.mark.parametrize(
    "bad_data",
    [
        [1, 2, 3],
        "text",
        {"x": {1, 2}},
        {"x": math.nan},
        {"x": b"bytes"},
        {"x": "y" * (MAX_SHARED_BYTES + 1)},
    ],
    ids=["list", "string", "set", "nan", "bytes", "oversized"],
)
async def test_shared_bad_data_is_rejected_and_nothing_written(
    backend: BackendUnderTest, bad_data: object
) -> None:
    hot, name = backend.hot, fresh_id("breaker")
    kept = await hot.put_shared(name, {"keep": "me"}, expires_at=backend.later(HOUR))
    with pytest.raises(ValidationError):
        await hot.put_shared(name, bad_data, expires_at=backend.later(HOUR))  # type: ignore[arg-type]
    assert await hot.get_shared(name) == kept


async def test_shared_naive_expiry_is_rejected(backend: BackendUnderTest) -> None:
    name = fresh_id("breaker")
    with pytest.raises(ValidationError):
        await backend.hot.put_shared(name, {"n": 1}, expires_at=datetime(2030, 1, 2))
    assert await backend.hot.get_shared(name) is None


async def test_shared_large_blob_round_trips(backend: BackendUnderTest) -> None:
    name = fresh_id("breaker")
    # Under the limit once serialized (the JSON adds the key and quotes).
    data: dict[str, JsonValue] = {"x": "z" * (MAX_SHARED_BYTES - 100)}
    await backend.hot.put_shared(name, data, expires_at=backend.later(HOUR))
    got = await backend.hot.get_shared(name)
    assert got is not None
    assert got.data == data


__all__ = [name for name in dir() if name.startswith("test_shared_")]
