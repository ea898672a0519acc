"""The per-key lanes DynamoDB appends queue in (tiermem.store.backends._lanes)."""

from __future__ import annotations

import asyncio

import pytest

from tiermem.store.backends._lanes import Lanes


async def test_one_key_runs_one_holder_at_a_time_in_arrival_order() -> None:
    lanes = Lanes()
    order: list[str] = []
    inside = 0

    async def hold(name: str) -> None:
        nonlocal inside
        async with lanes.lane("s"):
            inside += 1
            assert inside == 1
            order.append(name)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            inside -= 1

    await asyncio.gather(*(hold(f"w{i}") for i in range(5)))
    assert order == [f"w{i}" for i in range(5)]
    assert len(lanes) == 0


async def test_other_keys_do_not_wait() -> None:
    lanes = Lanes()
    async with lanes.lane("a"):
        async with asyncio.timeout(1):  # would deadlock if "b" shared "a"'s lock
            async with lanes.lane("b"):
                assert len(lanes) == 2
    assert len(lanes) == 0


async def test_an_error_or_a_cancelled_waiter_leaves_nothing_behind() -> None:
    lanes = Lanes()
    with pytest.raises(RuntimeError):
        async with lanes.lane("s"):
            raise RuntimeError("write failed")
    assert len(lanes) == 0

    entered = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with lanes.lane("s"):
            entered.set()
            await release.wait()

    async def waiter() -> None:
        async with lanes.lane("s"):
            raise AssertionError("a cancelled waiter must not enter")

    first = asyncio.create_task(holder())
    await entered.wait()
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert len(lanes) == 1  # only the holder
    release.set()
    await first
    assert len(lanes) == 0
