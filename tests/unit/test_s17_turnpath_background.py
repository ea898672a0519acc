"""Session 17: a turn's background item is queued by ``BackgroundWork.queue_batched``,
without a future (one is made only if somebody waits for the item), and the scoped waits
find a user's jobs among the sessions' (no second index by user to keep per turn).

Pinned: random programs of queued items (some failing), yields, waits for a session or a
user and drains give the same trace (the batch calls and their items, in order; what
every wait and drain raised; the counters) with ``queue_batched`` on the library's queue
as with ``offer_batched`` on the reference copy of the old queue kept in
``tests/unit/test_s12_bg_queue.py`` (``OldBackgroundWork``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_s12_bg_queue import OldBackgroundWork
from tiermem.background import BackgroundWork, Batch

_OPS = st.one_of(
    st.tuples(st.just("queue"), st.integers(0, 3), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("yield"), st.just(0), st.just(0), st.just(False)),
    st.tuples(st.just("wait_session"), st.integers(0, 3), st.just(0), st.just(False)),
    st.tuples(st.just("wait_user"), st.integers(0, 1), st.just(0), st.just(False)),
    st.tuples(st.just("drain"), st.just(0), st.just(0), st.just(False)),
)


async def _play(
    make: Callable[[], Any], queue: bool, writers: list[list[tuple[str, int, int, bool]]]
) -> list[object]:
    work = make()
    trace: list[object] = []

    async def run_items(kind: str, items: list[tuple[int, int, bool]]) -> None:
        trace.append((kind, [(w, n) for w, n, _ in items]))
        await asyncio.sleep(0)
        if any(fail for _, _, fail in items):
            raise RuntimeError(f"{kind} {[(w, n) for w, n, _ in items]} failed")

    batches = [
        Batch(partial(run_items, "a"), max_items=3),
        Batch(partial(run_items, "b"), max_items=64),  # no linger: timing-free traces
    ]

    async def writer(w: int, ops: list[tuple[str, int, int, bool]]) -> None:
        for n, (op, k, b, fail) in enumerate(ops):
            session, user = f"s{k}", f"u{k % 2}"
            try:
                if op == "queue":
                    item = (w, n, fail)
                    if queue:
                        queued = work.queue_batched(user, session, batches[b], item)
                    else:
                        queued = work.offer_batched(user, session, batches[b], item) is not None
                    trace.append((w, n, "queued", queued, work.queued, work.pending))
                    if not queued:
                        await work.submit_batched(user, session, batches[b], item)
                elif op == "yield":
                    await asyncio.sleep(0)
                elif op == "wait_session":
                    await work.wait_for(session_id=session)
                elif op == "wait_user":
                    await work.wait_for(user_id=f"u{k}")
                else:
                    await work.drain()
                trace.append((w, n, op, "ok"))
            except ExceptionGroup as group:
                trace.append((w, n, op, sorted(str(e) for e in group.exceptions)))
            trace.append((w, n, work.queued, work.pending, work.failures))

    await asyncio.gather(*(writer(w, ops) for w, ops in enumerate(writers)))
    try:
        await work.drain()
    except ExceptionGroup as group:
        trace.append(("drained", sorted(str(e) for e in group.exceptions)))
    trace.append(("end", work.queued, work.pending, work.failures))
    await work.aclose()
    return trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.integers(1, 3),
    extra=st.integers(0, 6),
    writers=st.lists(st.lists(_OPS, max_size=30), min_size=1, max_size=3),
)
def test_queued_items_run_and_fail_as_offered_ones_did(
    workers: int, extra: int, writers: list[list[tuple[str, int, int, bool]]]
) -> None:
    bound = workers + extra
    logging.disable(logging.ERROR)  # every failed batch is logged
    try:
        new = asyncio.run(
            _play(lambda: BackgroundWork(workers=workers, max_pending=bound), True, writers)
        )
        old = asyncio.run(
            _play(lambda: OldBackgroundWork(workers=workers, max_pending=bound), False, writers)
        )
    finally:
        logging.disable(logging.NOTSET)
    assert new == old


async def test_a_queued_item_gets_a_future_only_when_waited_for() -> None:
    work = BackgroundWork(workers=1, max_pending=8)
    ran: list[list[str]] = []
    gate = asyncio.Event()

    async def run(items: list[str]) -> None:
        await gate.wait()
        ran.append(items)
        if "bad" in items:
            raise RuntimeError("bad item")

    batch: Batch[str] = Batch(run)
    assert work.queue_batched("u1", "s1", batch, "ok")
    (entry,) = work._by_session["s1"]
    assert entry.done is None  # nobody waits: no future
    waiting = asyncio.create_task(work.wait_for(user_id="u1"))
    await asyncio.sleep(0)
    assert entry.done is not None  # made for the wait
    gate.set()
    await waiting
    assert ran == [["ok"]]
    # A failure reaches whoever waits for the item, by session or by user.
    gate.clear()
    assert work.queue_batched("u1", "s1", batch, "bad")
    assert work.queue_batched("u2", "s2", batch, "other")
    by_user = asyncio.create_task(work.wait_for(user_id="u1"))
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(ExceptionGroup) as caught:
        await by_user
    assert [str(e) for e in caught.value.exceptions] == ["bad item"]
    await work.drain()
    assert work.pending == 0
    await work.aclose()
