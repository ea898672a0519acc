"""The index write linger (``MemoryService(index_linger=...)``, setting ``index_linger_ms``).

A turn's background work (its index write and memory detection) is queued as an item of
the service's ``after_append`` batch; a short batch waits ``linger`` seconds for more turns
so that they share one index write. These tests count the service's index writes through
the public API. They never time anything: whether the write ran is observed after a
number of event loop iterations (asyncio runs ready callbacks in order, so that number
does not depend on the machine's speed), and the long lingers are 60 s, which the
``drain`` cuts short.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from tiermem.background import BackgroundWork, Batch
from tiermem.composition import open_service
from tiermem.service import MAX_INDEX_LINGER, MemoryService
from tiermem.session import AFTER_APPEND
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock

LOOP_ITERATIONS = 200  # far more than an in-memory index write needs to run


def _service(linger: float, workers: int = 2) -> MemoryService:
    clock = FakeClock()
    service = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_summarize=False,
        index_linger=min(linger, MAX_INDEX_LINGER),
        background=BackgroundWork(workers=workers),
    )
    if linger > MAX_INDEX_LINGER:
        # Longer than a service accepts, so that no loaded machine can see it run out
        # before the test's own steps are done.
        service.after_append = Batch(AFTER_APPEND.run, linger=linger)
    return service


def _count_index_writes(service: MemoryService) -> list[int]:
    """Wrap the service's index write; the list gets each write's number of documents."""
    writes: list[int] = []
    original = service.longterm.index_docs

    async def counted(docs: list) -> None:  # type: ignore[type-arg]
        writes.append(len(docs))
        await original(docs)

    service.longterm.index_docs = counted  # type: ignore[method-assign]
    return writes


def _batches_queued(service: MemoryService) -> list[object]:
    """Record the batch every turn's background item is queued with."""
    seen: list[object] = []
    background = service.background
    queue, submit = background.queue_batched, background.submit_batched

    def queued(user_id: str, session_id: str, batch: object, item: object) -> bool:
        seen.append(batch)
        return queue(user_id, session_id, batch, item)  # type: ignore[arg-type]

    async def submitted(user_id: str, session_id: str, batch: object, item: object) -> object:
        seen.append(batch)
        return await submit(user_id, session_id, batch, item)  # type: ignore[arg-type]

    background.queue_batched = queued  # type: ignore[method-assign,assignment]
    background.submit_batched = submitted  # type: ignore[method-assign,assignment]
    return seen


async def _iterate(times: int) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def test_without_linger_a_turns_index_write_runs_at_once() -> None:
    service = _service(0)
    writes = _count_index_writes(service)
    session = await service.session(user_id="u-1")
    await session.add_turn("user", "I prefer seinen manga")
    await _iterate(LOOP_ITERATIONS)
    assert writes == [1]  # written without anybody waiting for it
    await service.aclose()


async def test_a_lingering_batch_merges_later_turns_into_one_index_write() -> None:
    service = _service(60.0, workers=1)  # one lane: every session's items queue together
    writes = _count_index_writes(service)
    batches = _batches_queued(service)
    one = await service.session(user_id="u-1")
    other = await service.session(user_id="u-2")
    await one.add_turn("user", "I prefer seinen manga")
    await _iterate(LOOP_ITERATIONS)
    assert writes == []  # still waiting for more turns
    await other.add_turn("user", "Is Berserk volume 42 in stock?")
    await one.add_turn("assistant", "It is, shall I order it?")
    await _iterate(LOOP_ITERATIONS)
    assert writes == []
    await service.drain()  # cuts the linger short
    assert writes == [3]  # both users' turns, one write
    assert batches == [service.after_append] * 3  # the service's batch, not the default
    hits = await service.longterm.recall("u-2", "Berserk", scope=("turn",))
    assert hits, "the merged write indexed the other user's turn too"
    await service.aclose()


async def test_a_session_close_and_a_purge_do_not_wait_for_the_linger() -> None:
    service = _service(60.0)
    writes = _count_index_writes(service)
    session = await service.session(user_id="u-1")
    await session.add_turn("user", "I prefer seinen manga")
    await asyncio.wait_for(session.close(), timeout=30)  # waits for the session's jobs
    assert writes == [1]
    await session.add_turn("user", "and some shonen")
    await asyncio.wait_for(service.purge_user("u-1"), timeout=30)
    assert writes == [1, 1]
    await service.aclose()


def test_the_default_linger_is_the_shared_batch() -> None:
    service = _service(AFTER_APPEND.linger)
    assert service.after_append is AFTER_APPEND
    assert _service(0.05).after_append.linger == 0.05
    # One batch per linger: services sharing a BackgroundWork merge their items.
    assert _service(0.05).after_append is _service(0.05).after_append
    assert _service(0.05).after_append is not _service(0.06).after_append


async def test_a_configured_linger_reaches_the_queue() -> None:
    service = _service(0.25)
    batches = _batches_queued(service)
    session = await service.session(user_id="u-1")
    await session.add_turn("user", "I prefer seinen manga")
    assert len(batches) == 1
    assert batches[0] is service.after_append
    assert service.after_append.linger == 0.25
    await service.aclose()


async def test_a_full_batch_ends_the_linger() -> None:
    runs: list[list[int]] = []

    async def run(items: list[int]) -> None:
        runs.append(items)

    work = BackgroundWork(workers=1, max_pending=100)
    batch = Batch(run, max_items=3, linger=60.0)
    assert work.queue_batched("u", "s", batch, 0)
    await _iterate(LOOP_ITERATIONS)
    assert runs == []  # lingering for two more
    assert work.queue_batched("u", "s", batch, 1)
    await _iterate(LOOP_ITERATIONS)
    assert runs == []
    assert work.queue_batched("u", "s", batch, 2)  # fills the batch
    await _iterate(LOOP_ITERATIONS)
    assert runs == [[0, 1, 2]]  # ran without anybody waiting, long before 60 s
    await work.aclose()


async def test_a_writer_waiting_for_room_ends_the_linger() -> None:
    runs: list[list[int]] = []

    async def run(items: list[int]) -> None:
        runs.append(items)

    work = BackgroundWork(workers=1, max_pending=2)  # a lane of 2 entries
    batch = Batch(run, max_items=64, linger=60.0)
    assert work.queue_batched("u", "s", batch, 0)
    await _iterate(LOOP_ITERATIONS)
    assert work.queue_batched("u", "s", batch, 1)
    assert work.queue_batched("u", "s", batch, 2)
    assert not work.queue_batched("u", "s", batch, 3)  # full: the caller must wait
    waiting = asyncio.ensure_future(work.submit_batched("u", "s", batch, 3))
    await _iterate(LOOP_ITERATIONS)
    assert waiting.done()  # let in: the linger ended when it had to wait
    assert runs[:1] == [[0, 1, 2]]
    await work.drain()
    assert [i for r in runs for i in r] == [0, 1, 2, 3]
    await work.aclose()


@pytest.mark.parametrize("bad", [-0.001, 1.5, float("nan"), True])
def test_a_bad_linger_is_refused_with_its_range(bad: float) -> None:
    with pytest.raises(ValueError, match=r"index_linger must be 0\.\.1\.0 seconds"):
        MemoryService(MemoryHotStore(), MemoryDurableStore(), index_linger=bad)


async def test_the_setting_reaches_the_service(tmp_path: Path) -> None:
    service = open_service(TierMemSettings(sqlite_path=tmp_path / "t.db", index_linger_ms=50))
    try:
        assert service.after_append.linger == pytest.approx(0.05)
    finally:
        await service.aclose()
    default = open_service(TierMemSettings(sqlite_path=tmp_path / "u.db"))
    try:
        assert default.after_append is AFTER_APPEND
    finally:
        await default.aclose()
    with pytest.raises(ValidationError, match="index_linger_ms"):
        TierMemSettings(index_linger_ms=2000)
