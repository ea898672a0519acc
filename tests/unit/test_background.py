"""The background queue: bounded, ordered per session, scoped waits, every failure reported."""

from __future__ import annotations

import asyncio

import pytest

from tiermem.background import BackgroundWork, Batch


async def test_jobs_of_one_session_run_in_submission_order() -> None:
    work = BackgroundWork(workers=3, max_pending=30)
    seen: list[int] = []

    async def job(n: int) -> None:
        await asyncio.sleep(0.001 * (5 - n % 5))  # later jobs are quicker
        seen.append(n)

    for n in range(20):
        await work.submit("u", "s-1", lambda n=n: job(n))
    await work.drain()
    assert seen == list(range(20))
    await work.aclose()


async def test_a_full_queue_makes_submitters_wait() -> None:
    work = BackgroundWork(workers=1, max_pending=4)
    gate = asyncio.Event()
    high_water = 0

    async def blocked() -> None:
        await gate.wait()

    async def submit_all() -> None:
        nonlocal high_water
        for _ in range(12):
            await work.submit("u", "s", blocked)
            high_water = max(high_water, work.queued)

    submitter = asyncio.create_task(submit_all())
    await asyncio.sleep(0.05)
    assert not submitter.done()  # back-pressure: it waits for room
    assert work.queued == 4  # full; the submitter waits for room
    gate.set()
    await submitter
    await work.drain()
    assert high_water == 4
    assert work.pending == 0
    await work.aclose()


async def test_waiting_for_one_user_does_not_wait_for_another() -> None:
    work = BackgroundWork(workers=2, max_pending=400)
    gate = asyncio.Event()
    done: list[str] = []

    async def busy() -> None:
        await gate.wait()

    async def quick() -> None:
        done.append("idle-user")

    for _ in range(200):
        await work.submit("busy-user", "busy-session", busy)
    await work.submit("idle-user", "idle-session", quick)
    await asyncio.wait_for(work.wait_for(user_id="idle-user"), timeout=5)
    assert done == ["idle-user"]
    await work.wait_for(user_id="nobody")  # nothing queued: returns at once
    gate.set()
    await work.drain()
    await work.aclose()


async def test_every_failure_is_reported() -> None:
    work = BackgroundWork(workers=2, max_pending=10)

    async def fail(n: int) -> None:
        raise RuntimeError(f"job {n} broke")

    async def fine() -> None:
        return None

    await work.submit("u", "a", lambda: fail(1))
    await work.submit("u", "b", fine)
    await work.submit("u", "c", lambda: fail(2))
    with pytest.raises(ExceptionGroup) as caught:
        await work.drain()
    assert sorted(str(e) for e in caught.value.exceptions) == ["job 1 broke", "job 2 broke"]
    assert work.failures == 2
    await work.drain()  # reported once, then forgotten
    await work.aclose()


def test_bounds_must_make_sense() -> None:
    with pytest.raises(ValueError, match="workers"):
        BackgroundWork(workers=0)
    with pytest.raises(ValueError, match="max_pending"):
        BackgroundWork(workers=4, max_pending=2)


# -- coalescing (submit_batched) ---------------------------------------------------------


async def test_queued_items_of_a_batch_run_in_one_call_in_submission_order() -> None:
    work = BackgroundWork(workers=1, max_pending=100)
    gate = asyncio.Event()
    calls: list[list[tuple[str, int]]] = []

    async def run(items: list[tuple[str, int]]) -> None:
        calls.append(items)

    batch: Batch[tuple[str, int]] = Batch(run, max_items=64)

    async def blocked() -> None:
        await gate.wait()

    await work.submit("u", "s-a", blocked)  # holds the worker while the others queue up
    for n in range(6):
        session = "s-a" if n % 2 == 0 else "s-b"
        await work.submit_batched("u", session, batch, (session, n))
    gate.set()
    await work.drain()
    assert calls == [[("s-a", 0), ("s-b", 1), ("s-a", 2), ("s-b", 3), ("s-a", 4), ("s-b", 5)]]
    await work.aclose()


async def test_a_batch_is_bounded_and_never_jumps_over_another_job() -> None:
    work = BackgroundWork(workers=1, max_pending=100)
    gate = asyncio.Event()
    seen: list[str] = []

    async def run(items: list[int]) -> None:
        seen.append(f"batch{items}")

    batch: Batch[int] = Batch(run, max_items=3)

    async def blocked() -> None:
        await gate.wait()

    async def plain(name: str) -> None:
        seen.append(name)

    await work.submit("u", "s", blocked)
    for n in range(5):
        await work.submit_batched("u", "s", batch, n)
    await work.submit("u", "s", lambda: plain("plain"))
    await work.submit_batched("u", "s", batch, 5)
    gate.set()
    await work.drain()
    assert seen == ["batch[0, 1, 2]", "batch[3, 4]", "plain", "batch[5]"]
    await work.aclose()


async def test_wait_for_a_session_waits_for_its_items_in_a_batch() -> None:
    work = BackgroundWork(workers=1, max_pending=100)
    gate = asyncio.Event()
    ran: list[str] = []

    async def run(items: list[str]) -> None:
        await gate.wait()
        ran.extend(items)

    batch: Batch[str] = Batch(run)
    await work.submit_batched("u-1", "s-1", batch, "one")
    await work.submit_batched("u-2", "s-2", batch, "two")
    waiter = asyncio.create_task(work.wait_for(session_id="s-2"))
    await asyncio.sleep(0.01)
    assert not waiter.done()  # its item is in the batch still running
    gate.set()
    await waiter
    assert ran == ["one", "two"]
    await work.aclose()


async def test_a_failed_batch_fails_each_item_and_is_reported_once() -> None:
    work = BackgroundWork(workers=1, max_pending=100)
    gate = asyncio.Event()

    async def run(items: list[int]) -> None:
        raise RuntimeError(f"batch {items} broke")

    async def blocked() -> None:
        await gate.wait()

    batch: Batch[int] = Batch(run)
    await work.submit("u", "s", blocked)
    futures = [await work.submit_batched("u", "s", batch, n) for n in range(3)]
    gate.set()
    with pytest.raises(ExceptionGroup) as caught:
        await work.drain()
    assert [str(e) for e in caught.value.exceptions] == ["batch [0, 1, 2] broke"]
    assert all(isinstance(f.exception(), RuntimeError) for f in futures)
    assert work.failures == 3
    await work.aclose()


async def test_a_lingering_batch_gathers_items_that_come_soon_after() -> None:
    # A lone writer whose every submission comes after a short wait (as a turn's does,
    # waiting for its durable write): linger lets its items share one call.
    work = BackgroundWork(workers=1, max_pending=100)
    calls: list[list[int]] = []

    async def run(items: list[int]) -> None:
        calls.append(items)

    batch: Batch[int] = Batch(run, linger=30.0)  # only a waiter can end this linger
    for n in range(3):
        await work.submit_batched("u", "s", batch, n)
        await asyncio.sleep(0.001)
    assert calls == []  # still lingering
    await asyncio.wait_for(work.wait_for(user_id="u"), timeout=5)  # a waiter ends it
    assert calls == [[0, 1, 2]]
    await work.submit_batched("u", "s", batch, 3)
    await asyncio.wait_for(work.drain(), timeout=5)  # so does drain
    assert calls == [[0, 1, 2], [3]]
    await work.aclose()


def test_batch_bounds_must_make_sense() -> None:
    async def run(items: list[int]) -> None:
        return None

    with pytest.raises(ValueError, match="max_items"):
        Batch(run, max_items=0)
    with pytest.raises(ValueError, match="linger"):
        Batch(run, linger=-1)


async def test_a_writer_cancelled_in_line_leaves_its_place_to_the_next() -> None:
    # And drain does not wait for the job it never queued.
    work = BackgroundWork(workers=1, max_pending=1)
    gate = asyncio.Event()
    seen: list[str] = []

    async def run(items: list[str]) -> None:
        seen.extend(items)

    batch: Batch[str] = Batch(run)

    async def blocked() -> None:
        await gate.wait()

    await work.submit("u", "s", blocked)
    await asyncio.sleep(0)
    await work.submit_batched("u", "s", batch, "first")  # full
    cancelled = asyncio.create_task(work.submit_batched("u", "s", batch, "cancelled"))
    waiting = asyncio.create_task(work.submit_batched("u", "s", batch, "next"))
    await asyncio.sleep(0)
    cancelled.cancel()
    gate.set()
    await asyncio.wait_for(waiting, timeout=5)
    await asyncio.wait_for(work.drain(), timeout=5)
    assert seen == ["first", "next"]
    await work.aclose()
