"""The background queue: bounded, ordered per session, scoped waits, every failure reported."""

from __future__ import annotations

import asyncio

import pytest

from tiermem.background import BackgroundWork


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
