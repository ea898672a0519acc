"""Two client-side cuts of the Redis turn path (issue #8), against reference copies of the
former code:

* ``RedisStoreBase._now_us`` reads the wall clock as ``time.time_ns() // 1000`` when the
  store's clock is a :class:`~tiermem.clock.SystemClock` (``datetime.now(UTC)`` floors the
  same system clock to microseconds), and any other clock as before. Two clocks cannot be
  read at the same instant, so the test brackets: a former reading before and after each
  new one, many times; a fake clock and a ``SystemClock`` subclass keep their own time.
* ``to_us`` counts a ``datetime`` in UTC from its timedelta's fields (no checks, no
  timedelta division); anything else goes the former way: equal results on generated
  datetimes in UTC and other zones, the same error for naive ones and non-datetimes.
* ``SnapshotCache.loaded`` hands out the cached snapshot's ``expires_at`` when the load
  script answers the expiry the cache holds (its entry remembers it in microseconds), and
  builds it with ``from_us`` otherwise: the snapshots handed out equal the former code's
  for generated expiries, equal or not to the cached one, and never share their dicts
  with the cache.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.clock import SystemClock
from tiermem.errors import ValidationError
from tiermem.models import ActiveEntity, SessionSnapshot, Turn
from tiermem.store.backends.redis_scripts import RedisKeys, RedisStoreBase, from_us, to_us
from tiermem.store.backends.redis_snapshots import CachedSession, SnapshotCache, _copy
from tiermem.store.codec import check_aware
from tiermem.store.contract import EntityChange
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _former_to_us(value: datetime, *, what: str = "timestamp") -> int:
    """``to_us`` before session 17."""
    check_aware(value, what=what)
    return (value - _EPOCH) // timedelta(microseconds=1)


def _former_now_us(store: RedisStoreBase) -> int:
    """``RedisStoreBase._now_us`` before session 17."""
    return to_us(store._clock.now())


def _former_loaded_current(cached: CachedSession, expires_us: bytes) -> SessionSnapshot:
    """``SnapshotCache.loaded`` before session 17, for a reply of 4 (the copy is current)."""
    return _copy(cached.snapshot, from_us(expires_us))


def _store(clock: object) -> RedisStoreBase:
    # No command is sent: the client is never connected.
    from redis.asyncio import Redis

    return RedisStoreBase(
        Redis(), clock=clock, keys=RedisKeys("s17clock"), gc_grace=timedelta(minutes=5)
    )  # type: ignore[arg-type]


def test_the_wall_clock_reads_as_the_former_reading() -> None:
    store = _store(SystemClock())
    for _ in range(20_000):
        before = _former_now_us(store)
        now = store._now_us()
        after = _former_now_us(store)
        assert before <= now <= after
        assert type(now) is int


def test_other_clocks_keep_their_own_time() -> None:
    fake = FakeClock(datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC))
    store = _store(fake)
    assert store._now_us() == _former_now_us(store) == to_us(fake.now())
    fake.advance(timedelta(microseconds=7))
    assert store._now_us() == _former_now_us(store)

    class Shifted(SystemClock):
        @staticmethod
        def now() -> datetime:  # type: ignore[override]
            return datetime(2001, 1, 1, tzinfo=UTC)

    shifted = _store(Shifted())
    assert shifted._now_us() == to_us(datetime(2001, 1, 1, tzinfo=UTC))


BASE_US = to_us(datetime(2030, 1, 1, tzinfo=UTC))


def _appended(cache: SnapshotCache, expires_us: int) -> CachedSession:
    turn = text_turn("hello")
    stored = Turn.model_validate({**turn.model_dump(), "index": 0})
    entity = ActiveEntity(
        kind="topic", value="tea", turn_index=0, updated_at=datetime(2030, 1, 1, tzinfo=UTC)
    )
    cache.appended(
        "s1",
        epoch=b"e1",
        version=1,
        fresh=True,
        turns=(stored,),
        window=10,
        expires_us=expires_us,
        metadata=None,
        change=EntityChange(upsert={"topic": entity}),
    )
    cached = cache.get("s1")
    assert cached is not None
    return cached


@settings(max_examples=300, deadline=None)
@given(
    cached_us=st.integers(BASE_US, BASE_US + 10**12),
    same=st.booleans(),
    offset=st.integers(-(10**11), 10**11).filter(lambda n: n != 0),
)
def test_a_current_copy_is_handed_out_as_before(cached_us: int, same: bool, offset: int) -> None:
    cache = SnapshotCache(4)
    cached = _appended(cache, cached_us)
    answered = cached_us if same else cached_us + offset
    reply = [b"1", b"1", b"%d" % answered, b"e1"]
    expected = _former_loaded_current(cached, reply[2])
    got = cache.loaded("s1", cached, reply)
    assert got == expected
    assert got.expires_at == from_us(answered)
    assert got.entities is not cached.snapshot.entities
    assert got.state is not cached.snapshot.state


def test_an_entry_remembers_the_expiry_it_was_given() -> None:
    cache = SnapshotCache(4)
    cached = _appended(cache, BASE_US + 5)
    assert cached.expires_us == BASE_US + 5
    assert to_us(cached.snapshot.expires_at) == cached.expires_us


class _Moment(datetime):
    """A datetime subclass (pandas' Timestamp is one): the former way."""


@settings(max_examples=500, deadline=None)
@given(
    moment=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    offset_min=st.integers(-23 * 60, 23 * 60),
    utc=st.booleans(),
)
def test_to_us_counts_as_before(moment: datetime, offset_min: int, utc: bool) -> None:
    zone = UTC if utc else timezone(timedelta(minutes=offset_min))
    value = moment.replace(tzinfo=zone)
    assert to_us(value) == _former_to_us(value)
    sub = _Moment(*value.timetuple()[:6], value.microsecond, tzinfo=zone)
    assert to_us(sub) == _former_to_us(sub)


@pytest.mark.parametrize("bad", [datetime(2030, 1, 1), "2030-01-01T00:00:00Z", 1_900_000_000])
def test_to_us_refuses_as_before(bad: object) -> None:
    with pytest.raises(ValidationError) as former:
        _former_to_us(bad, what="expires_at")  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as new:
        to_us(bad, what="expires_at")  # type: ignore[arg-type]
    assert str(new.value) == str(former.value)
