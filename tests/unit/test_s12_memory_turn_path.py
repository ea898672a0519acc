"""The memory+memory turn path of session 12 (issue #8) gives what the old path gave.

* ``trusted_expiry``: the tiered store calls a built-in TTL policy by position, without
  its argument checks. Compared, on generated valid arguments, with a reference copy of
  the policies' old ``expires_at`` (checks, then the table's ``ttl_for``); a custom policy
  is still called through its own ``expires_at``, by keyword.
* ``MemoryHotStore.read_now`` / ``TieredSessionStore.view_now``: a hot read without the
  snapshot object. Random conversations (entities, state, metadata changes, the clock
  moving, sessions expiring) compare every view with the one the old path builds from
  ``load`` (:func:`_reference_view`, a copy of the old ``_from_snapshot``).
* ``append_built(now=...)``: the tiered layer's clock reading serves the store's write;
  the same turns, versions and stored state as a write that reads the clock itself.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.models import (
    ActiveEntity,
    NewTurn,
    SessionMetadata,
    SessionSnapshot,
    TextBlock,
    UserTier,
)
from tiermem.policies.ttl import (
    ActivityTtl,
    FixedTtl,
    HybridTtl,
    SlidingTtl,
    TierTtl,
    TierTtlTable,
    _check,
    trusted_expiry,
)
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import ENTITIES_RECORD, EntityChange
from tiermem.testing import FakeClock
from tiermem.tiers.config import SessionTierConfig
from tiermem.tiers.tiered import SessionView, TieredSessionStore, derive_metadata

START = datetime(2030, 1, 1, tzinfo=UTC)

# -- TTL: reference copies of the old expires_at --------------------------------------------


def _old_fixed(p: FixedTtl, **kw: Any) -> datetime | None:
    _check(**kw)
    deadline = kw["created_at"] + p.ttl
    return None if kw["current_expires_at"] == deadline else deadline


def _old_sliding(p: SlidingTtl, **kw: Any) -> datetime | None:
    _check(**kw)
    if kw["event"] == "read" and not p.refresh_on_read and kw["current_expires_at"] is not None:
        return None
    return kw["now"] + p.ttl  # type: ignore[no-any-return]


def _old_activity(p: ActivityTtl, **kw: Any) -> datetime | None:
    tier = _check(**kw)
    if kw["event"] == "read" and kw["current_expires_at"] is not None:
        return None
    return kw["now"] + p.table.ttl_for(tier, kw["turn_count"])  # type: ignore[no-any-return]


def _old_hybrid(p: HybridTtl, **kw: Any) -> datetime | None:
    tier = _check(**kw)
    return kw["now"] + p.table.ttl_for(tier, kw["turn_count"])  # type: ignore[no-any-return]


_OLD: dict[type, Any] = {
    FixedTtl: _old_fixed,
    SlidingTtl: _old_sliding,
    ActivityTtl: _old_activity,
    HybridTtl: _old_hybrid,
}

_seconds = st.integers(min_value=1, max_value=10**6).map(lambda s: timedelta(seconds=s))
_tier_rows = st.builds(
    lambda base, extra, after: TierTtl(base, base + extra, after),
    _seconds,
    st.integers(min_value=0, max_value=10**5).map(lambda s: timedelta(seconds=s)),
    st.integers(min_value=0, max_value=50),
)
_policies = st.one_of(
    st.builds(FixedTtl, _seconds),
    st.builds(SlidingTtl, _seconds, st.booleans()),
    st.builds(ActivityTtl, st.builds(TierTtlTable, _tier_rows, _tier_rows, _tier_rows)),
    st.builds(HybridTtl, st.builds(TierTtlTable, _tier_rows, _tier_rows, _tier_rows)),
    st.just(HybridTtl()),
    st.just(ActivityTtl()),
)
_times = st.integers(min_value=0, max_value=10**8).map(lambda s: START + timedelta(seconds=s))
_zones = st.sampled_from([UTC, timezone(timedelta(hours=9)), timezone(timedelta(hours=-5))])


@settings(max_examples=400, deadline=None)
@given(
    policy=_policies,
    now=_times,
    created_at=_times,
    turn_count=st.integers(min_value=0, max_value=100),
    tier=st.sampled_from([*UserTier, "standard", "premium", "vip"]),
    event=st.sampled_from(["read", "write"]),
    current=st.one_of(st.none(), _times),
    zone=_zones,
)
def test_trusted_expiry_gives_the_old_answer(
    policy: Any,
    now: datetime,
    created_at: datetime,
    turn_count: int,
    tier: Any,
    event: Any,
    current: datetime | None,
    zone: timezone,
) -> None:
    now = now.astimezone(zone)  # another timezone: the full checks on the old path
    kw = {
        "now": now,
        "created_at": created_at,
        "turn_count": turn_count,
        "user_tier": tier,
        "event": event,
        "current_expires_at": current,
    }
    expected = _OLD[type(policy)](policy, **kw)
    assert trusted_expiry(policy)(now, created_at, turn_count, tier, event, current) == expected
    assert policy.expires_at(**kw) == expected


def test_a_custom_policy_is_called_through_its_own_method() -> None:
    calls: list[dict[str, Any]] = []

    class Recording:
        def expires_at(self, **kw: Any) -> datetime | None:
            calls.append(kw)
            return None

    expiry = trusted_expiry(Recording())
    assert expiry(START, START, 3, UserTier.VIP, "read", None) is None
    assert calls == [
        {
            "now": START,
            "created_at": START,
            "turn_count": 3,
            "user_tier": UserTier.VIP,
            "event": "read",
            "current_expires_at": None,
        }
    ]


def test_a_subclass_of_a_built_in_policy_keeps_its_override() -> None:
    class Shorter(HybridTtl):
        def expires_at(self, **kw: Any) -> datetime | None:
            return kw["now"] + timedelta(seconds=1)

    assert trusted_expiry(Shorter())(START, START, 0, UserTier.STANDARD, "write", None) == (
        START + timedelta(seconds=1)
    )


# -- hot reads --------------------------------------------------------------------------


def _reference_view(snap: SessionSnapshot) -> dict[str, Any]:
    """What the old ``_from_snapshot(snap, "hot")`` built, as comparable values."""
    assert snap.metadata is not None
    view = SessionView(
        metadata=snap.metadata,
        turns=snap.turns,
        entities=dict(snap.entities),
        state=dict(snap.state),
        next_index=snap.next_index,
        expires_at=snap.expires_at,
        source="hot",
    )
    return _values(view, snap.metadata, snap.turns, snap.next_index)


def _values(
    view: SessionView, stored: SessionMetadata, turns: Any, next_index: int
) -> dict[str, Any]:
    return {
        "metadata": derive_metadata(stored, turns, next_index),
        "stored": view.stored_metadata,
        "turns": view.turns,
        "entities": view.entities,
        "state": view.state,
        "next_index": view.next_index,
        "expires_at": view.expires_at,
        "source": view.source,
        "extra": view.extra,
    }


def _service(clock: FakeClock) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_summarize=False,
    )


@pytest.mark.parametrize("seed", range(8))
async def test_hot_reads_give_the_view_load_gives(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(START)
    async with _service(clock) as memory:
        tiers = memory.tiers
        hot = tiers.hot
        assert isinstance(hot, MemoryHotStore)
        sessions = [await memory.session(user_id="u", session_id=f"s{i}") for i in range(2)]
        texts = ["I like seinen", "Berserk vol 42?", "ok", "order ORD-12345 please", "hi"]
        seen = {"missed": 0, "moved": 0, "fast": 0}
        for step in range(80):
            session = rng.choice(sessions)
            op = rng.random()
            if op < 0.5:
                await session.add_turn(rng.choice(["user", "assistant"]), rng.choice(texts))
            elif op < 0.6:
                await session.put_state("cart", {"n": step})
            elif op < 0.7:
                await session.update_metadata(attributes={"title": f"t{step}"})
            if rng.random() < 0.4:
                clock.advance(rng.choice([0.5, 5, 11, 60, 3000]))
            snap = await hot.load(session.id)
            hits = tiers.metrics.hot_hits
            fast = tiers.view_now(session.id)
            if snap is None or snap.metadata is None:
                assert fast is None
                seen["missed"] += 1
                await session.history()  # reloads it
                continue
            moves = tiers._read_expiry(snap.metadata, snap.next_index, snap.expires_at)
            if moves is not None:  # the read writes a new expiry: view() does it
                assert fast is None
                assert tiers.metrics.hot_hits == hits
                seen["moved"] += 1
            else:
                seen["fast"] += 1
                assert fast is not None
                assert tiers.metrics.hot_hits == hits + 1
                assert _values(fast, snap.metadata, snap.turns, snap.next_index) == (
                    _reference_view(snap)
                )
                assert fast.metadata == _reference_view(snap)["metadata"]
            view = await tiers.view(session.id)
            assert view is not None
            # As before: the view read before its touch (if the read moved the expiry).
            assert _values(view, snap.metadata, snap.turns, snap.next_index) == (
                _reference_view(snap)
            )
            after = await hot.load(session.id)
            assert after is not None
            assert after.expires_at == (moves if moves is not None else snap.expires_at)
            history = await session.history()
            assert history == after.turns
        assert seen["moved"], seen
        assert seen["fast"] > 20, seen


async def test_read_now_copies_the_mappings_and_refuses_what_load_shows_otherwise() -> None:
    clock = FakeClock(START)
    hot = MemoryHotStore(clock=clock)
    assert hot.read_now("nobody") is None
    entity = ActiveEntity(kind="genre", value="seinen", turn_index=0, updated_at=START)
    # A session without metadata (a write-behind append reaching an empty tier).
    await hot.append_turns(
        "s",
        [NewTurn(role="user", content=(TextBlock(text="hi"),), timestamp=START, token_count=1)],
        window=5,
        expires_at=START + timedelta(hours=1),
        entities=EntityChange(upsert={"genre": entity}, remove=()),
    )
    assert (await hot.load("s")) is not None
    assert hot.read_now("s") is None
    metadata = SessionMetadata(session_id="s", user_id="u", created_at=START, last_activity=START)
    await hot.put_metadata("s", metadata, expires_at=START + timedelta(hours=1))
    parts = hot.read_now("s")
    assert parts is not None
    parts[2].clear()
    parts[3]["x"] = None  # type: ignore[assignment]
    snap = await hot.load("s")
    assert snap is not None
    assert snap.entities == {"genre": entity}
    assert snap.state == {}
    assert parts[-1] == START
    clock.advance(timedelta(hours=2))
    assert hot.read_now("s") is None


async def test_a_hot_store_overriding_load_is_not_gone_around() -> None:
    loads: list[str] = []

    class Counting(MemoryHotStore):
        async def load(
            self, session_id: str, *, include_expired: bool = False
        ) -> SessionSnapshot | None:
            loads.append(session_id)
            return await super().load(session_id, include_expired=include_expired)

    clock = FakeClock(START)
    async with MemoryService(
        Counting(clock=clock), MemoryDurableStore(clock=clock), clock=clock
    ) as memory:
        session = await memory.session(user_id="u")
        await session.add_turn("user", "hello")
        loads.clear()
        assert memory.tiers.view_now(session.id) is None
        assert [t.text for t in await session.history()] == ["hello"]
        assert loads == [session.id]


# -- the write's clock reading ------------------------------------------------------------


class _OtherClock:
    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def now(self) -> datetime:
        return self._clock.now()


@pytest.mark.parametrize("seed", range(4))
async def test_a_shared_clock_reading_writes_what_a_second_reading_writes(seed: int) -> None:
    """Two services, one whose tiered store shares the hot store's clock (the write takes
    its reading) and one whose clock is another object reading the same time (the store
    reads its own): the same turns, expiries and records."""
    rng = random.Random(seed)
    clock_a, clock_b = FakeClock(START), FakeClock(START)
    shared = MemoryService(
        MemoryHotStore(clock=clock_a), MemoryDurableStore(clock=clock_a), clock=clock_a
    )
    apart = MemoryService(
        MemoryHotStore(clock=clock_b),
        MemoryDurableStore(clock=clock_b),
        clock=_OtherClock(clock_b),  # type: ignore[arg-type]
    )
    assert shared.tiers._same_clock
    assert not apart.tiers._same_clock
    async with shared, apart:
        a = await shared.session(user_id="u", session_id="s")
        b = await apart.session(user_id="u", session_id="s")
        for _ in range(40):
            text = rng.choice(["seinen please", "Berserk vol 42", "ok", "horror? no"])
            role = rng.choice(["user", "assistant"])
            ta, tb = await a.add_turn(role, text), await b.add_turn(role, text)
            assert ta == tb
            step = rng.choice([0, 1, 30, 2000])
            clock_a.advance(step)
            clock_b.advance(step)
            assert await shared.tiers.hot.load("s") == await apart.tiers.hot.load("s")
            assert await shared.tiers.durable.get_record("s", ENTITIES_RECORD) == (
                await apart.tiers.durable.get_record("s", ENTITIES_RECORD)
            )
            assert await a.history() == await b.history()


async def test_append_built_ignores_a_reading_that_is_not_utc() -> None:
    clock = FakeClock(START)
    hot, durable = MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock)
    store = TieredSessionStore(
        hot, durable, clock=clock, ttl_policy=HybridTtl(), config=SessionTierConfig()
    )
    turn = NewTurn(role="user", content=(TextBlock(text="hi"),), timestamp=START, token_count=1)
    naive = datetime(2030, 1, 1, 5)  # would be wrong as a store time: the clock is read
    stored, version = await hot.append_built(
        durable,
        "s",
        [turn],
        window=5,
        hot_expires_at=START + timedelta(minutes=1),
        durable_expires_at=None,
        entities=EntityChange(upsert={}, remove=()),
        now=naive,
    )
    assert [t.index for t in stored] == [0]
    assert version == 1
    assert store.view_now("s") is None  # no metadata yet
