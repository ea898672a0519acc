"""The plain turn's write path (one coroutine per tier call, one background offer) gives
what the general path gives.

``Session.add_turn(role, "text")`` takes ``Session._append_one`` and queues its background
item with :meth:`BackgroundWork.offer_batched`; ``add_turns([...])`` takes the batch loop
and :meth:`BackgroundWork.submit_batched`. On two services sharing nothing but the same
fake clock readings, random turns (entities, idempotency keys, retries, clock jumps past
the hot expiry) must give the same turns, histories, entities, recall and tier metrics.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiermem.background import BackgroundWork, Batch
from tiermem.errors import TierMemError
from tiermem.service import MemoryService
from tiermem.session import Session, TurnInput
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock

WORDS = [
    "I",
    "prefer",
    "seinen",
    "and",
    "Berserk",
    "vol",
    "42",
    "my",
    "name",
    "is",
    "Sam",
    "I",
    "live",
    "in",
    "Paris",
    "yesterday",
    "I",
    "bought",
    "a",
    "bike",
    "remember",
    "that",
    "how",
    "about",
    "horror",
    "ok",
    "thanks",
    "ORD-12345",
    "on",
    "2024-01-15",
]


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


async def _trace(seed: int, *, plain: bool) -> list[Any]:
    rnd = random.Random(seed)
    clock = FakeClock(datetime(2026, 3, 10, 12, tzinfo=UTC))
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    out: list[Any] = []
    async with MemoryService.from_settings(settings, clock=clock, auto_summarize=False) as memory:
        sessions = [await memory.session(user_id="u1", session_id=f"s{i}") for i in range(2)]
        for _ in range(80):
            session: Session = rnd.choice(sessions)
            op = rnd.random()
            try:
                if op < 0.6:
                    text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 12)))
                    role = rnd.choice(["user", "assistant"])
                    key = rnd.choice([None, None, f"k{rnd.randint(0, 4)}"])
                    if plain:
                        turn = await session.add_turn(role, text, idempotency_key=key)
                    else:
                        item = TurnInput(role=role, content=text)
                        turns = await session.add_turns([item], idempotency_key=key)
                        turn = turns[0]  # the plain path raises NotFoundError when empty
                    out.append(["add", _dump(turn)])
                elif op < 0.75:
                    out.append(["history", _dump(await session.history())])
                elif op < 0.85:
                    view = await session.view()
                    out.append(["view", _dump(view.entities), view.next_index, view.source])
                elif op < 0.93:
                    clock.advance(timedelta(minutes=rnd.choice([1, 20, 90, 600])))
                else:
                    await memory.drain()
                    hits = await memory.longterm.recall(
                        "u1", rnd.choice(WORDS), k=5, scope=("turn",)
                    )
                    out.append(["recall", [_dump(hit) for hit in hits]])
            except (TierMemError, IndexError) as exc:
                out.append(["error", type(exc).__name__])
        await memory.drain()
        out.append(["metrics", dict(memory.metrics.__dict__)])
        out.append(["turns", [_dump(await s.get_turns()) for s in sessions]])
    return out


@pytest.mark.parametrize("seed", range(6))
async def test_plain_turns_and_the_general_path_store_and_return_the_same(seed: int) -> None:
    plain = await _trace(seed, plain=True)
    general = await _trace(seed, plain=False)
    # NotFoundError (plain) and IndexError (general) are the same event: a keyed retry
    # whose turn has expired.
    assert [["error"] if e[0] == "error" else e for e in plain] == [
        ["error"] if e[0] == "error" else e for e in general
    ]
    assert any(e[0] == "add" and e[1]["entities"] for e in plain)  # entity changes ran


async def test_offer_batched_queues_when_there_is_room_and_never_jumps_the_line() -> None:
    work = BackgroundWork(workers=1, max_pending=2)
    gate = asyncio.Event()
    seen: list[list[int]] = []

    async def run(items: list[int]) -> None:
        seen.append(items)

    batch: Batch[int] = Batch(run)

    async def blocked() -> None:
        await gate.wait()

    await work.submit("u", "s", blocked)
    await asyncio.sleep(0)  # the worker takes the blocking job: the lane is empty
    first = work.offer_batched("u", "s", batch, 1)
    assert first is not None
    assert work.offer_batched("u", "s", batch, 2) is not None
    assert work.offer_batched("u", "s", batch, 3) is None  # full: nothing queued
    assert work.queued == 2
    waiting = asyncio.create_task(work.submit_batched("u", "s", batch, 4))
    await asyncio.sleep(0)
    assert work.offer_batched("u", "s", batch, 5) is None  # a writer waits for room
    gate.set()
    await waiting
    await work.wait_for(session_id="s")
    assert first.done()
    assert [i for items in seen for i in items] == [1, 2, 4]
    await work.aclose()
