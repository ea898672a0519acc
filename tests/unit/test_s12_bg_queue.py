"""Background queue (issue #8, session 12): a turn's item costs fewer calls (the loop's
``create_future`` taken once, the lane's room tested inline, the worker waiting on a
future rather than in a coroutine, a batch run and settled without a coroutine of its
own), and a batch's linger cancels its timer only when cut short. Pinned here: the
queue behaves as before (a hypothesis test runs random programs of offers, submits,
waits and drains on the library's queue and on a reference copy of the old one, kept
below, and compares what ran, in which calls, and what every call returned), futures
belong to the loop the workers run on even after a restart on another loop, and no
linger leaves a timer behind.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiermem.background import BackgroundWork, Batch

logger = logging.getLogger(__name__)
T = TypeVar("T")

# -- reference copy of tiermem.background at bfa8d1a (its Batch is the library's) ------------

Job = Callable[[], Coroutine[Any, Any, None]]


class _Entry:
    """One queued job, or one item of a batch (``job`` None: the batch runs it)."""

    __slots__ = ("batch", "done", "item", "job", "session_id", "user_id")

    def __init__(
        self,
        user_id: str,
        session_id: str,
        job: Job | None,
        done: asyncio.Future[None],
        batch: Batch[Any] | None = None,
        item: Any = None,
    ) -> None:
        self.user_id = user_id
        self.session_id = session_id
        self.job = job
        self.done = done
        self.batch = batch
        self.item = item


class _Lane:
    """One worker's queue: bounded, and writers waiting for room are let in first come,
    first served. (``asyncio.Queue`` is not fair when a batch frees many slots at once:
    a writer already running may take them all while those just woken wait again at the
    back of the line.) One worker reads it, so a deque and one waiting getter do what
    ``asyncio.Queue`` does, without its task accounting on every turn's entry."""

    def __init__(self, bound: int) -> None:
        self._entries: deque[_Entry | None] = deque()
        self._getter: asyncio.Future[None] | None = None  # the worker, waiting for an entry
        self._bound = bound
        self._line: deque[asyncio.Future[None]] = deque()
        self._admitted = 0  # writers let in that have not put their entry yet

    def qsize(self) -> int:
        return len(self._entries)

    def empty(self) -> bool:
        return not self._entries

    def _room(self) -> int:
        return self._bound - len(self._entries) - self._admitted

    async def put(self, entry: _Entry) -> None:
        if self._line or self._room() <= 0:
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._line.append(ticket)
            try:
                await ticket
            except asyncio.CancelledError:
                if ticket.cancelled():  # still in line
                    self._line.remove(ticket)
                else:  # let in, then cancelled: pass the room on
                    self._admitted -= 1
                    self.admit()
                raise
            self._admitted -= 1
        self.put_nowait(entry)

    def try_put(self, entry: _Entry) -> bool:
        """Append the entry if there is room and no writer waits for room; else False
        (then :meth:`put` waits its turn)."""
        if self._line or self._room() <= 0:
            return False
        self.put_nowait(entry)
        return True

    def put_nowait(self, entry: _Entry | None) -> None:
        """Append an entry (no bound: :meth:`put` checked it; None stops the worker)."""
        self._entries.append(entry)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    async def get(self) -> _Entry | None:
        """The next entry, waiting for one if the lane is empty."""
        while not self._entries:
            getter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getter = getter
            try:
                await getter
            finally:
                if self._getter is getter:
                    self._getter = None
        return self._entries.popleft()

    def get_nowait(self) -> _Entry | None:
        return self._entries.popleft()

    def admit(self) -> int:
        """Let in as many waiting writers as there is room for; returns how many."""
        admitted = 0
        while self._line and self._room() > 0:
            self._line.popleft().set_result(None)
            self._admitted += 1
            admitted += 1
        return admitted


class OldBackgroundWork:
    """Bounded background jobs, ordered per session. One per service and event loop."""

    def __init__(self, *, workers: int = 2, max_pending: int = 1000) -> None:
        if workers < 1 or max_pending < workers:
            raise ValueError("need workers >= 1 and max_pending >= workers")
        self._workers = workers
        self._per_queue = max_pending // workers
        self._lanes: list[_Lane] = []
        self._tasks: list[asyncio.Task[None]] = []
        # The unfinished jobs' futures by user and by session (for the scoped waits).
        self._by_user: dict[str, set[asyncio.Future[None]]] = {}
        self._by_session: dict[str, set[asyncio.Future[None]]] = {}
        self._failures = 0
        self._lingering: set[asyncio.Future[None]] = set()
        self._waiting = 0  # callers in wait_for/drain: no batch lingers meanwhile
        self._beside: set[asyncio.Task[None]] = set()  # jobs run by submit_beside
        self._lane_of: dict[str, _Lane] = {}  # a session's lane (a hash of its id), kept

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished yet."""
        return sum(len(fs) for fs in self._by_session.values())

    @property
    def queued(self) -> int:
        """Jobs waiting in the queues (at most ``max_pending``)."""
        return sum(lane.qsize() for lane in self._lanes)

    @property
    def failures(self) -> int:
        """Jobs that raised since the start."""
        return self._failures

    def _start(self) -> None:
        if self._tasks:
            return
        for n in range(self._workers):
            lane = _Lane(self._per_queue)
            self._lanes.append(lane)
            self._tasks.append(asyncio.create_task(self._run(lane), name=f"tiermem-bg-{n}"))

    async def submit(self, user_id: str, session_id: str, job: Job) -> asyncio.Future[None]:
        """Queue ``job`` (waits while the queue is full); returns a future of its result."""
        done = asyncio.get_running_loop().create_future()
        return await self._put(_Entry(user_id, session_id, job, done))

    async def submit_batched(
        self, user_id: str, session_id: str, batch: Batch[T], item: T
    ) -> asyncio.Future[None]:
        """Queue ``item`` for ``batch.run`` (waits while the queue is full); it runs with
        the items of the same batch queued next to it. Returns a future of its result:
        the batch's, shared by every item of the run (a failure fails them all)."""
        entry = _Entry(user_id, session_id, None, _new_future(), batch, item)
        if self._offer(entry):
            return entry.done
        return await self._put(entry)

    def offer_batched(
        self, user_id: str, session_id: str, batch: Batch[T], item: T
    ) -> asyncio.Future[None] | None:
        """:meth:`submit_batched` when its lane has room now (most calls: a turn's
        background item is queued without a coroutine); None, and nothing queued, when
        the caller would have to wait: then await :meth:`submit_batched`, which waits
        its turn for room."""
        entry = _Entry(user_id, session_id, None, _new_future(), batch, item)
        return entry.done if self._offer(entry) else None

    def _offer(self, entry: _Entry) -> bool:
        """Queue ``entry`` if its lane has room and no writer waits for room (tracked for
        the scoped waits); False, and nothing queued or tracked, otherwise."""
        if not self._tasks:
            self._start()
        lane = self._lane(entry.session_id)
        if not lane.try_put(entry):
            return False
        self._track(entry)
        return True

    def _lane(self, session_id: str) -> _Lane:
        """The session's lane (a hash of its id: one session's jobs run in order)."""
        lane = self._lane_of.get(session_id)
        if lane is None:
            if len(self._lane_of) >= _LANES_KEPT:
                self._lane_of.clear()
            lane = self._lane_of[session_id] = self._lanes[
                zlib.crc32(session_id.encode()) % self._workers
            ]
        return lane

    def submit_beside(self, user_id: str, session_id: str, job: Job) -> asyncio.Future[None]:
        """Run ``job`` in a task of its own, beside the lanes; returns a future of its result
        (covered by :meth:`wait_for` and :meth:`drain` like any job). For long CPU-bound jobs
        that bound their own number and yield between their stages (summary passes): on a
        lane, the turns' jobs queued behind one would wait for all of it. No back-pressure
        and no order with the session's other jobs: the caller bounds how many it submits."""
        entry = _Entry(user_id, session_id, job, asyncio.get_running_loop().create_future())
        self._track(entry)
        task = asyncio.create_task(self._settle_run([entry], job), name=f"tiermem-bg-{session_id}")
        self._beside.add(task)
        task.add_done_callback(self._beside.discard)
        return entry.done

    def _track(self, entry: _Entry) -> None:
        """List an entry's future for the scoped waits (unrolled: once per turn)."""
        done = entry.done
        futures = self._by_user.get(entry.user_id)
        if futures is None:
            self._by_user[entry.user_id] = {done}
        else:
            futures.add(done)
        futures = self._by_session.get(entry.session_id)
        if futures is None:
            self._by_session[entry.session_id] = {done}
        else:
            futures.add(done)

    async def _put(self, entry: _Entry) -> asyncio.Future[None]:
        if not self._tasks:
            self._start()
        self._track(entry)
        done = entry.done
        lane = self._lane(entry.session_id)
        try:
            if not lane.try_put(entry):  # most puts find room: no coroutine to run
                await lane.put(entry)
        except BaseException:
            done.cancel()  # never queued (the submitter was cancelled): nothing to wait for
            self._forget(entry)
            raise
        return done

    def _forget(self, entry: _Entry) -> None:
        """Drop a settled entry from the scoped waits (called where it is settled: a done
        callback per entry would cost a loop callback on every turn)."""
        done = entry.done
        futures = self._by_user.get(entry.user_id)
        if futures is not None:
            futures.discard(done)
            if not futures:
                del self._by_user[entry.user_id]
        futures = self._by_session.get(entry.session_id)
        if futures is not None:
            futures.discard(done)
            if not futures:
                del self._by_session[entry.session_id]

    async def _run(self, lane: _Lane) -> None:
        carried: list[_Entry | None] = []  # taken while collecting a batch, runs next
        while True:
            entry: _Entry | None
            if carried:
                entry = carried.pop()
            else:
                entry = await lane.get()
                if lane.admit():
                    # A writer waited for the slot just freed: let it run now, not after
                    # the whole queue (jobs that never suspend would drain it in one go,
                    # and every waiting writer's turn with it).
                    await asyncio.sleep(0)
            if entry is None:
                return
            if entry.batch is None:
                assert entry.job is not None  # a plain job's entry always has one
                await self._settle_run([entry], entry.job)
                continue
            batch = entry.batch
            entries = [entry]
            lingered = batch.linger <= 0
            while len(entries) < batch.max_items:
                if lane.empty():
                    if lingered:
                        break
                    lingered = True
                    await self._linger(batch.linger)
                    continue
                following = lane.get_nowait()
                lane.admit()
                if following is None or following.batch is not batch:
                    carried.append(following)
                    break
                entries.append(following)
            await self._settle_run(entries, partial(batch.run, [e.item for e in entries]))
            if len(entries) > 1:
                # Taking many items may have freed room for many waiting writers: let them
                # run before the next batch, or a worker whose jobs never suspend would
                # drain the whole queue while every writer waits.
                await asyncio.sleep(0)

    async def _linger(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if somebody waits for the jobs (see ``_hurry``)."""
        if self._waiting:
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, woken)
        self._lingering.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._lingering.discard(woken)

    def _hurry(self) -> None:
        """End every batch's linger now: somebody waits for the jobs."""
        for woken in self._lingering:
            _wake(woken)

    async def _settle_run(self, entries: list[_Entry], run: Job) -> None:
        """Run one job (or one batch) and settle the futures of its entries."""
        try:
            await run()
        except Exception as exc:  # noqa: BLE001 -- recorded and re-raised to waiters
            self._failures += len(entries)
            logger.error(
                "background job of session(s) %s failed: %r",
                sorted({e.session_id for e in entries}),
                exc,
            )
            for e in entries:
                if not e.done.done():  # a caller may have cancelled the future it got
                    e.done.set_exception(exc)
                    e.done.exception()  # logged above; waiters still get it
                self._forget(e)
        else:
            for e in entries:
                if not e.done.done():
                    e.done.set_result(None)
                self._forget(e)

    async def wait_for(self, *, user_id: str | None = None, session_id: str | None = None) -> None:
        """Wait for the jobs submitted so far for a user or a session (both: either).

        Raises:
            ExceptionGroup: the jobs waited for that failed, all of them.
        """
        futures: set[asyncio.Future[None]] = set()
        if user_id is not None:
            futures.update(self._by_user.get(user_id, ()))
        if session_id is not None:
            futures.update(self._by_session.get(session_id, ()))
        await self._settle_hurried(futures)

    async def drain(self) -> None:
        """Wait for every job submitted so far.

        Raises:
            ExceptionGroup: the jobs that failed, all of them.
        """
        while True:
            # A future its caller cancelled stays listed until the worker reaches its job:
            # nothing to wait for.
            futures = {f for fs in self._by_session.values() for f in fs if not f.done()}
            if not futures:
                return
            await self._settle_hurried(futures)

    async def _settle_hurried(self, futures: set[asyncio.Future[None]]) -> None:
        """:func:`_settle`, with no batch lingering while it waits."""
        if not futures:
            return
        self._waiting += 1
        self._hurry()
        try:
            await _settle(futures)
        finally:
            self._waiting -= 1

    async def aclose(self) -> None:
        """Finish the queued jobs, then stop the workers."""
        try:
            await self.drain()
        finally:
            for lane in self._lanes:
                lane.put_nowait(None)
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
            self._lanes.clear()
            self._lane_of.clear()


_LANES_KEPT = 4_096
"""Sessions whose lane :class:`BackgroundWork` keeps (a full table is emptied)."""


async def _settle(futures: set[asyncio.Future[None]]) -> None:
    if not futures:
        return
    await asyncio.wait(futures)
    errors: list[Exception] = []
    for f in futures:
        exc = None if f.cancelled() else f.exception()
        # A failed batch fails each of its items' futures with the same exception.
        if isinstance(exc, Exception) and not any(exc is e for e in errors):
            errors.append(exc)
    if errors:
        raise ExceptionGroup(f"{len(errors)} background job(s) failed", errors)


def _new_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


# -- the library's queue against the reference ----------------------------------------------

_OPS = st.one_of(
    st.tuples(st.just("offer"), st.integers(0, 3), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("submit"), st.integers(0, 3), st.just(0), st.booleans()),
    st.tuples(st.just("yield"), st.just(0), st.just(0), st.just(False)),
    st.tuples(st.just("wait_session"), st.integers(0, 3), st.just(0), st.just(False)),
    st.tuples(st.just("wait_user"), st.integers(0, 1), st.just(0), st.just(False)),
    st.tuples(st.just("drain"), st.just(0), st.just(0), st.just(False)),
)


async def _play(
    make: Callable[[], Any], writers: list[list[tuple[str, int, int, bool]]]
) -> list[object]:
    """Run the writers' programs concurrently on a fresh queue; the trace of everything
    observable: the calls the workers made (with their items, in order), what every
    operation returned or raised, and the counters."""
    work = make()
    trace: list[object] = []

    async def run_items(kind: str, items: list[tuple[int, int, bool]]) -> None:
        trace.append((kind, [(w, n) for w, n, _ in items]))
        await asyncio.sleep(0)
        if any(fail for _, _, fail in items):
            raise RuntimeError(f"{kind} {[(w, n) for w, n, _ in items]} failed")

    batches = [
        Batch(partial(run_items, "a"), max_items=3),
        Batch(partial(run_items, "b"), max_items=64),
    ]

    def outcome(f: asyncio.Future[None]) -> object:
        if not f.done():
            return "pending"
        exc = f.exception()
        return None if exc is None else str(exc)

    async def writer(w: int, ops: list[tuple[str, int, int, bool]]) -> None:
        futures: list[asyncio.Future[None]] = []
        for n, (op, k, b, fail) in enumerate(ops):
            session, user = f"s{k}", f"u{k % 2}"
            try:
                if op == "offer":
                    item = (w, n, fail)
                    f = work.offer_batched(user, session, batches[b], item)
                    trace.append((w, n, "offered", f is not None, work.queued, work.pending))
                    if f is None:
                        f = await work.submit_batched(user, session, batches[b], item)
                    futures.append(f)
                elif op == "submit":

                    async def job(w: int = w, n: int = n, fail: bool = fail) -> None:
                        trace.append(("job", w, n))
                        if fail:
                            raise RuntimeError(f"job {w} {n} failed")

                    futures.append(await work.submit(user, session, job))
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
        await asyncio.sleep(0)
        trace.append((w, "futures", [outcome(f) for f in futures]))

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
def test_the_queue_does_what_the_reference_did(
    workers: int, extra: int, writers: list[list[tuple[str, int, int, bool]]]
) -> None:
    bound = workers + extra
    logging.disable(logging.ERROR)  # every failed job is logged: thousands of lines
    try:
        new = asyncio.run(
            _play(lambda: BackgroundWork(workers=workers, max_pending=bound), writers)
        )
        old = asyncio.run(
            _play(lambda: OldBackgroundWork(workers=workers, max_pending=bound), writers)
        )
    finally:
        logging.disable(logging.NOTSET)
    assert new == old


# -- futures and timers ---------------------------------------------------------------------


async def _nothing(items: list[int]) -> None:
    return None


def test_futures_belong_to_the_running_loop_after_a_restart_on_another() -> None:
    work = BackgroundWork(workers=1, max_pending=4)
    batch: Batch[int] = Batch(_nothing)

    async def once() -> None:
        loop = asyncio.get_running_loop()
        offered = work.offer_batched("u", "s", batch, 1)
        assert offered is not None
        assert offered.get_loop() is loop
        submitted = await work.submit_batched("u", "s", batch, 2)
        assert submitted.get_loop() is loop
        await work.drain()
        assert offered.done()
        assert submitted.done()
        await work.aclose()

    asyncio.run(once())
    asyncio.run(once())  # the same queue on a new loop: its futures are the new loop's


def _live_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    return [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]


@pytest.mark.asyncio_internals  # reads loop._scheduled
async def test_a_linger_cut_short_leaves_no_timer() -> None:
    work = BackgroundWork(workers=1, max_pending=4)
    ran: list[list[int]] = []

    async def run(items: list[int]) -> None:
        ran.append(items)

    batch = Batch(run, linger=30.0)
    assert work.offer_batched("u", "s", batch, 1) is not None
    for _ in range(3):
        await asyncio.sleep(0)  # the worker takes the item and lingers for more
    assert ran == []
    assert work._lingering
    await asyncio.wait_for(work.drain(), timeout=5)  # hurries the linger
    assert ran == [[1]]
    assert not work._lingering
    assert _live_timers(asyncio.get_running_loop()) == []
    await work.aclose()


@pytest.mark.asyncio_internals  # reads loop._scheduled
async def test_a_linger_that_runs_out_or_is_cancelled_leaves_nothing_behind() -> None:
    work = BackgroundWork(workers=1, max_pending=4)
    ran: list[list[int]] = []

    async def run(items: list[int]) -> None:
        ran.append(items)

    short = Batch(run, linger=0.001)
    assert work.offer_batched("u", "s", short, 1) is not None
    await asyncio.sleep(0.05)  # the linger runs out by itself
    assert ran == [[1]]
    assert not work._lingering
    assert _live_timers(asyncio.get_running_loop()) == []

    long = Batch(run, linger=30.0)
    assert work.offer_batched("u", "s", long, 2) is not None
    for _ in range(3):
        await asyncio.sleep(0)
    assert work._lingering
    for task in work._tasks:  # a worker cancelled while it lingers
        task.cancel()
    await asyncio.gather(*work._tasks, return_exceptions=True)
    assert not work._lingering
    assert _live_timers(asyncio.get_running_loop()) == []
