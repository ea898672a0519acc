"""Access tracking: counted in memory on recall, written in batches off the request path."""

from __future__ import annotations

from typing import Any

import pytest

from tests.recall.conftest import memory
from tests.recall.test_recall import SpyStore
from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError, ValidationError
from tiermem.longterm.access import AccessTracker
from tiermem.models import MemoryRecord
from tiermem.store.backends.memory import MemoryDurableStore


@pytest.fixture
def store(clock: FakeClock) -> MemoryDurableStore:
    return MemoryDurableStore(clock=clock)


async def put(store: MemoryDurableStore, *ids: str) -> None:
    for memory_id in ids:
        await store.put_memory(memory(memory_id, "x"))


async def stored(store: MemoryDurableStore, memory_id: str) -> MemoryRecord:
    record = await store.get_memory("u1", memory_id)
    assert record is not None
    return record


async def test_record_does_no_io_and_flush_applies_counts(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    await put(store, "a", "b")
    spy = SpyStore(store)
    tracker = AccessTracker(spy, clock=clock, flush_every=100)  # type: ignore[arg-type]
    tracker.record("u1", ["a", "b"])
    clock.advance(60)
    tracker.record("u1", ["a"])
    assert spy.calls == {}
    assert tracker.pending == 2
    assert tracker.pending_count("u1", "a") == 2
    report = await tracker.flush()
    assert (report.applied, report.missing, report.failed) == (2, 0, 0)
    a = await stored(store, "a")
    assert a.access_count == 2
    assert a.accessed_at == clock.now()
    assert a.version == 2
    assert (await stored(store, "b")).access_count == 1
    assert tracker.pending == 0
    assert (await tracker.flush()).applied == 0  # nothing left


async def test_a_background_flush_starts_after_flush_every_hits(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    await put(store, "a", "b", "c")
    tracker = AccessTracker(store, clock=clock, flush_every=3)
    tracker.record("u1", ["a", "b"])
    tracker.record("u1", ["c"])  # the third hit starts a flush task; record() returns at once
    assert tracker.pending == 3
    final = await tracker.aclose()  # waits for the background flush, then flushes the rest
    assert final.applied == 0  # the background flush had written everything
    assert tracker.stats.flushes == 1
    assert tracker.stats.applied == 3
    assert [(await stored(store, m)).access_count for m in "abc"] == [1, 1, 1]


async def test_conflicting_writers_lose_no_update(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    await put(store, "a")

    class RacingStore(SpyStore):
        raced = False

        def __getattr__(self, name: str) -> Any:
            if name != "put_memory" or self.raced:
                return super().__getattr__(name)

            async def put_memory(record: MemoryRecord, **kwargs: Any) -> MemoryRecord:
                self.raced = True  # another writer changes the record first
                current = await self.inner.get_memory("u1", "a")
                assert current is not None
                await self.inner.put_memory(
                    current.model_copy(update={"importance": 0.9, "version": current.version + 1}),
                    expected_version=current.version,
                )
                return await self.inner.put_memory(record, **kwargs)

            return put_memory

    tracker = AccessTracker(RacingStore(store), clock=clock)  # type: ignore[arg-type]
    tracker.record("u1", ["a"])
    report = await tracker.flush()
    assert (report.applied, report.conflicts) == (1, 1)
    record = await stored(store, "a")
    assert record.importance == 0.9
    assert record.access_count == 1
    assert record.version == 3


async def test_failed_writes_stay_pending_for_the_next_flush(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    await put(store, "a")

    class DownStore(SpyStore):
        down = True

        def __getattr__(self, name: str) -> Any:
            if name == "put_memory" and self.down:

                async def fail(*args: Any, **kwargs: Any) -> Any:
                    raise BackendUnavailableError("down", backend="test")

                return fail
            return super().__getattr__(name)

    flaky = DownStore(store)
    tracker = AccessTracker(flaky, clock=clock)  # type: ignore[arg-type]
    tracker.record("u1", ["a", "a"])
    report = await tracker.flush()
    assert report.failed == 1
    assert tracker.pending_count("u1", "a") == 2
    tracker.record("u1", ["a"])
    flaky.down = False
    assert (await tracker.flush()).applied == 1
    assert (await stored(store, "a")).access_count == 3


async def test_gone_records_are_counted_missing(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    tracker = AccessTracker(store, clock=clock)
    tracker.record("u1", ["nope"])
    assert (await tracker.flush()).missing == 1
    assert tracker.pending == 0


async def test_beyond_max_pending_new_records_are_dropped_and_counted(
    store: MemoryDurableStore, clock: FakeClock
) -> None:
    tracker = AccessTracker(store, clock=clock, max_pending=2, flush_every=1000)
    tracker.record("u1", ["a", "b", "c", "a"])
    assert tracker.pending == 2
    assert tracker.stats.dropped == 1
    assert tracker.pending_count("u1", "a") == 2


def test_bad_settings_are_rejected(store: MemoryDurableStore, clock: FakeClock) -> None:
    with pytest.raises(ValidationError):
        AccessTracker(store, clock=clock, flush_every=0)
