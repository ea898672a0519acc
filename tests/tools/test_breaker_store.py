"""Shared breakers on every backend: round trips per check, CAS on transitions, exactly one
probe among concurrent callers, lease takeover, expiry."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from itertools import count

import pytest

from tests.tools.support import CountingStore
from tiermem.testing import BackendUnderTest
from tiermem.testing.backend import fresh_id
from tiermem.tools import Admission, BreakerPolicy, BreakerStatus, SharedBreakers
from tiermem.tools.breaker import BreakerEvent

POLICY = BreakerPolicy(
    failure_threshold=3,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=10),
)


class Ids:
    def __init__(self) -> None:
        self._n = count(1)

    def new_id(self) -> str:
        return f"probe-{next(self._n)}"


def breakers_on(
    backend: BackendUnderTest, *, interleave: bool = False
) -> tuple[SharedBreakers, CountingStore]:
    store = CountingStore(backend.hot, interleave=interleave)
    # A fresh namespace per test: tests share one Redis / DynamoDB server.
    return SharedBreakers(store, clock=backend.clock, ids=Ids(), namespace=fresh_id("b")), store


async def open_breaker(breakers: SharedBreakers, tool: str) -> None:
    for _ in range(POLICY.failure_threshold):
        permit = await breakers.check(tool, POLICY)
        await breakers.record_failure(permit, POLICY, error="search backend is down")


async def test_healthy_check_is_one_read_and_success_costs_nothing(
    backend: BackendUnderTest,
) -> None:
    breakers, store = breakers_on(backend)
    permit = await breakers.check("search", POLICY)
    assert permit.admission is Admission.CALL
    assert store.calls == {"get_shared": 1}
    transition = await breakers.record_success(permit, POLICY)
    assert not transition.changed
    assert store.calls == {"get_shared": 1}


async def test_a_failure_is_one_write_on_the_version_read_at_check(
    backend: BackendUnderTest,
) -> None:
    breakers, store = breakers_on(backend)
    permit = await breakers.check("search", POLICY)
    transition = await breakers.record_failure(permit, POLICY, error="timed out after 2 s")
    assert transition.event is BreakerEvent.FAILURE_RECORDED
    assert store.calls == {"get_shared": 1, "put_shared": 1}
    state = await breakers.state("search")
    assert state.failures == (backend.clock.now(),)
    assert state.last_error == "timed out after 2 s"


async def test_threshold_opens_for_every_reader(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    # Another worker: its own SharedBreakers over the same store and namespace.
    other = SharedBreakers(backend.hot, clock=backend.clock, namespace=breakers.namespace)
    permit = await other.check("search", POLICY)
    assert permit.admission is Admission.REJECT
    assert permit.state.status is BreakerStatus.OPEN
    assert permit.state.opened_at == backend.clock.now()
    blob = await backend.hot.get_shared(breakers.blob_name("search"))
    assert blob is not None
    assert blob.data["status"] == "open"


async def test_failures_spread_over_more_than_the_window_do_not_open(
    backend: BackendUnderTest,
) -> None:
    breakers, _ = breakers_on(backend)
    for _ in range(5):
        permit = await breakers.check("search", POLICY)
        assert permit.admission is Admission.CALL
        await breakers.record_failure(permit, POLICY, error="flaky")
        backend.clock.advance(31)  # two failures at most in any 60 s
    assert (await breakers.state("search")).status is BreakerStatus.CLOSED


async def test_stale_permits_still_count_every_failure(backend: BackendUnderTest) -> None:
    breakers, store = breakers_on(backend, interleave=True)
    permits = [await breakers.check("search", POLICY) for _ in range(2)]
    # Both were read at version 0: the second write conflicts, re-reads and retries.
    await asyncio.gather(*(breakers.record_failure(p, POLICY, error="down") for p in permits))
    assert len((await breakers.state("search")).failures) == 2
    assert store.calls["put_shared"] == 3


async def test_exactly_one_probe_among_concurrent_callers(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend, interleave=True)
    await open_breaker(breakers, "search")
    backend.clock.advance(POLICY.reset_timeout)
    permits = await asyncio.gather(*(breakers.check("search", POLICY) for _ in range(20)))
    admissions = [p.admission for p in permits]
    assert admissions.count(Admission.PROBE) == 1
    assert admissions.count(Admission.REJECT) == 19
    (probe,) = (p for p in permits if p.is_probe)
    assert probe.probe_id is not None
    state = await breakers.state("search")
    assert state.status is BreakerStatus.HALF_OPEN
    assert state.probe_id == probe.probe_id


async def test_probe_success_closes_and_failure_reopens(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    opened_at = backend.clock.now()
    backend.clock.advance(30)
    probe = await breakers.check("search", POLICY)
    await breakers.record_failure(probe, POLICY, error="still down")
    state = await breakers.state("search")
    assert state.status is BreakerStatus.OPEN
    assert state.opened_at == opened_at  # the outage started at the first opening
    assert state.retry_at == backend.clock.now() + POLICY.reset_timeout
    assert (await breakers.check("search", POLICY)).admission is Admission.REJECT

    backend.clock.advance(30)
    probe = await breakers.check("search", POLICY)
    assert probe.is_probe
    transition = await breakers.record_success(probe, POLICY)
    assert transition.event is BreakerEvent.CLOSED
    assert (await breakers.check("search", POLICY)).admission is Admission.CALL


async def test_a_crashed_probers_lease_runs_out(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    backend.clock.advance(30)
    crashed = await breakers.check("search", POLICY)
    assert crashed.is_probe
    backend.clock.advance(POLICY.probe_lease - timedelta(milliseconds=1))
    assert (await breakers.check("search", POLICY)).admission is Admission.REJECT
    backend.clock.advance(timedelta(milliseconds=1))
    taker = await breakers.check("search", POLICY)
    assert taker.is_probe
    assert taker.probe_id != crashed.probe_id
    # The first prober comes back after all: its result no longer counts.
    assert not (await breakers.record_success(crashed, POLICY)).changed
    assert (await breakers.state("search")).status is BreakerStatus.HALF_OPEN
    await breakers.record_success(taker, POLICY)
    assert (await breakers.state("search")).status is BreakerStatus.CLOSED


async def test_closed_blob_expires_with_its_last_failure(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    permit = await breakers.check("search", POLICY)
    await breakers.record_failure(permit, POLICY, error="once")
    name = breakers.blob_name("search")
    backend.clock.advance(POLICY.window - timedelta(milliseconds=1))
    assert await backend.hot.get_shared(name) is not None
    backend.clock.advance(timedelta(milliseconds=1))
    assert await backend.hot.get_shared(name) is None


async def test_open_breaker_is_forgotten_a_day_after_its_retry_time(
    backend: BackendUnderTest,
) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    backend.clock.advance(timedelta(days=1, seconds=29))
    assert (await breakers.state("search")).status is BreakerStatus.OPEN
    backend.clock.advance(timedelta(seconds=1))
    assert (await breakers.state("search")).status is BreakerStatus.CLOSED


async def test_corrupt_state_reads_closed_and_is_overwritten(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    name = breakers.blob_name("search")
    await backend.hot.put_shared(name, {"status": "melted"}, expires_at=None)
    permit = await breakers.check("search", POLICY)
    assert permit.admission is Admission.CALL
    assert breakers.corrupt_reads == 1
    await breakers.record_failure(permit, POLICY, error="down")
    assert len((await breakers.state("search")).failures) == 1
    assert breakers.corrupt_reads == 1


async def test_reset_deletes_the_breaker(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    assert await breakers.reset("search") is True
    assert (await breakers.check("search", POLICY)).admission is Admission.CALL
    assert await breakers.reset("search") is False


async def test_tools_have_separate_breakers(backend: BackendUnderTest) -> None:
    breakers, _ = breakers_on(backend)
    await open_breaker(breakers, "search")
    assert (await breakers.check("orders", POLICY)).admission is Admission.CALL


def test_blob_names_are_labelled_and_validated() -> None:
    from tiermem.errors import ValidationError
    from tiermem.store.backends.memory import MemoryHotStore

    breakers = SharedBreakers(MemoryHotStore())
    assert breakers.blob_name("search") == "breaker:search"
    with pytest.raises(ValidationError):
        breakers.blob_name("bad\nname")
