"""Background work off the response path (turn indexing, memory auto-detection), bounded.

:class:`BackgroundWork` runs coroutines on a fixed number of worker tasks fed by bounded
queues:

* **Back-pressure**: :meth:`~BackgroundWork.submit` waits while the queue is full, so a
  burst of turns slows the writers down instead of piling up tasks without bound
  (``max_pending`` is the bound).
* **Order per session**: the jobs of one session go to one worker, so they run in
  submission order (detection of "I prefer seinen" then "I prefer shonen" ends at shonen).
* **Scoped waits**: :meth:`~BackgroundWork.wait_for` waits only for the jobs of one user or
  one session (a purge or a clear), never for everybody's; :meth:`~BackgroundWork.drain`
  waits for all.
* **Coalescing**: jobs submitted with :meth:`~BackgroundWork.submit_batched` carry an
  item and a :class:`Batch`; a worker that takes one from its queue also takes the items
  of the same batch kind queued right behind it (at most ``Batch.max_items``) and runs
  them in one call. Only a contiguous run is merged, so every session's jobs still run
  in submission order; each item keeps its own future, so ``wait_for`` is unchanged. At
  50 sessions this turns 50 index writes (one transaction each) into one.
* **The turns' work first**: long CPU-bound jobs (summary passes) are submitted with
  :meth:`~BackgroundWork.submit_beside` and run in tasks of their own, beside the lanes,
  so they never hold a lane -- where the turns' index writes queue -- for as long as they
  run, and so never back-pressure ``add_turn`` through a full lane. Such a job bounds its
  own concurrency and yields to the event loop between its stages (each yield puts it
  behind every callback already ready, a waiting ``add_turn`` included); the scoped waits
  and failure reports cover it as any other job.
* **Failures are reported, every one**: a job that raises is recorded; ``wait_for`` and
  ``drain`` raise an :class:`ExceptionGroup` of all failures among the jobs they waited for.
  Jobs that handle their own expected errors (log and count a :class:`TierMemError`) simply
  do not raise.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["BackgroundWork", "Batch"]

logger = logging.getLogger(__name__)

Job = Callable[[], Coroutine[Any, Any, None]]
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Batch(Generic[T]):
    """A kind of job whose queued items run together: ``run`` gets the items of a
    contiguous run of the queue, in submission order, at most ``max_items`` of them.
    Compared by identity: make one per kind (a module constant), not one per call."""

    run: Callable[[list[T]], Coroutine[Any, Any, None]]
    max_items: int = 64
    linger: float = 0.0
    """Seconds a short batch waits for more items once the queue is empty (0: none). A
    lone session adds a turn every millisecond or so, each waiting for its own write: a
    few milliseconds' wait lets its index writes share one transaction. ``wait_for``
    and ``drain`` cut the wait short."""

    def __post_init__(self) -> None:
        if self.max_items < 1 or self.linger < 0:
            raise ValueError("Batch needs max_items >= 1 and linger >= 0")


class _Entry:
    """One queued job, or one item of a batch (``job`` None: the batch runs it). ``done``
    is None for an item queued by :meth:`BackgroundWork.queue_batched` until somebody
    waits for it (:meth:`BackgroundWork._future_of`)."""

    __slots__ = ("batch", "done", "item", "job", "session_id", "user_id")

    def __init__(
        self,
        user_id: str,
        session_id: str,
        job: Job | None,
        done: asyncio.Future[None] | None,
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
        # The worker's lingering batch (see ``BackgroundWork._linger``): its wake-up, and
        # how many queued entries fill it. A lane that fills the batch, or a writer left
        # waiting for room, ends the linger: it never holds back a full batch or a turn.
        self._linger: asyncio.Future[None] | None = None
        self._linger_full = 0

    def qsize(self) -> int:
        return len(self._entries)

    def _room(self) -> int:
        return self._bound - len(self._entries) - self._admitted

    async def put(self, entry: _Entry) -> None:
        if self._line or self._room() <= 0:
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._line.append(ticket)
            if self._linger is not None:
                _wake(self._linger)  # a writer waits for room: run the batch now
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
        entries = self._entries
        # ``_room`` and ``put_nowait``, inline: this runs once per turn.
        if self._line or self._bound - len(entries) - self._admitted <= 0:
            return False
        entries.append(entry)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)
        elif self._linger is not None and len(entries) >= self._linger_full:
            _wake(self._linger)  # the lingering batch is full
        return True

    def put_nowait(self, entry: _Entry | None) -> None:
        """Append an entry (no bound: :meth:`put` checked it; None stops the worker)."""
        self._entries.append(entry)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)
        elif self._linger is not None and len(self._entries) >= self._linger_full:
            _wake(self._linger)

    def waiter(self) -> asyncio.Future[None] | None:
        """None if an entry is queued; else a future the next :meth:`put_nowait` completes
        (await it, then ask again). A future, not a coroutine to wait in: the worker waits
        for each batch's first entry, and a coroutine per wait costs more than the wait."""
        if self._entries:
            return None
        getter = self._getter
        if getter is None or getter.done():  # done: the worker was cancelled waiting
            getter = self._getter = asyncio.get_running_loop().create_future()
        return getter

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


class BackgroundWork:
    """Bounded background jobs, ordered per session. One per service and event loop."""

    def __init__(self, *, workers: int = 2, max_pending: int = 1000) -> None:
        if workers < 1 or max_pending < workers:
            raise ValueError("need workers >= 1 and max_pending >= workers")
        self._workers = workers
        self._per_queue = max_pending // workers
        self._lanes: list[_Lane] = []
        self._tasks: list[asyncio.Task[None]] = []
        # The unfinished jobs by session (for the scoped waits; a user's are found among
        # them: waits for a user are rare, a turn's bookkeeping is not).
        self._by_session: dict[str, set[_Entry]] = {}
        self._failures = 0
        # The lingering batches' wake-ups and their timers (see ``_linger``).
        self._lingering: dict[asyncio.Future[None], asyncio.TimerHandle] = {}
        self._waiting = 0  # callers in wait_for/drain: no batch lingers meanwhile
        self._beside: set[asyncio.Task[None]] = set()  # jobs run by submit_beside
        self._lane_of: dict[str, _Lane] = {}  # a session's lane (a hash of its id), kept
        # The running loop's ``create_future``, taken when the workers start (they and every
        # future of theirs live on that loop): no loop lookup per queued item.
        self._create_future: Callable[[], asyncio.Future[None]] = _new_future

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
        self._create_future = asyncio.get_running_loop().create_future
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
        if not self._tasks:
            self._start()
        done = self._create_future()
        entry = _Entry(user_id, session_id, None, done, batch, item)
        if self._offer(entry):
            return done
        return await self._put(entry)

    def offer_batched(
        self, user_id: str, session_id: str, batch: Batch[T], item: T
    ) -> asyncio.Future[None] | None:
        """:meth:`submit_batched` when its lane has room now (most calls: a turn's
        background item is queued without a coroutine); None, and nothing queued, when
        the caller would have to wait: then await :meth:`submit_batched`, which waits
        its turn for room."""
        # ``_offer``, inline (once per turn): the session's lane is most often known.
        lane = self._lane_of.get(session_id)
        if lane is None:
            if not self._tasks:
                self._start()
            lane = self._lane(session_id)
        done = self._create_future()
        entry = _Entry(user_id, session_id, None, done, batch, item)
        if not lane.try_put(entry):
            return None
        self._track(entry)
        return done

    def queue_batched(self, user_id: str, session_id: str, batch: Batch[T], item: T) -> bool:
        """:meth:`offer_batched` for a caller that keeps no future (a turn's background
        item): True when queued. The item's future is made only if somebody waits for it
        (:meth:`wait_for`, :meth:`drain`); its failure is reported to them as any job's.
        False, and nothing queued, when the caller would have to wait: then await
        :meth:`submit_batched`."""
        lane = self._lane_of.get(session_id)
        if lane is None:
            if not self._tasks:
                self._start()
            lane = self._lane(session_id)
        entry = _Entry(user_id, session_id, None, None, batch, item)
        if not lane.try_put(entry):
            return False
        self._track(entry)
        return True

    def _offer(self, entry: _Entry) -> bool:
        """Queue ``entry`` if its lane has room and no writer waits for room (tracked for
        the scoped waits); False, and nothing queued or tracked, otherwise. The workers
        run (:meth:`_start`)."""
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
        done = asyncio.get_running_loop().create_future()
        entry = _Entry(user_id, session_id, job, done)
        self._track(entry)
        task = asyncio.create_task(self._settle_run([entry], job), name=f"tiermem-bg-{session_id}")
        self._beside.add(task)
        task.add_done_callback(self._beside.discard)
        return done

    def _track(self, entry: _Entry) -> None:
        """List an entry for the scoped waits."""
        entries = self._by_session.get(entry.session_id)
        if entries is None:
            self._by_session[entry.session_id] = {entry}
        else:
            entries.add(entry)

    def _future_of(self, entry: _Entry) -> asyncio.Future[None]:
        """The entry's future, made now if it has none yet (:meth:`queue_batched`)."""
        done = entry.done
        if done is None:
            done = entry.done = self._create_future()
        return done

    async def _put(self, entry: _Entry) -> asyncio.Future[None]:
        if not self._tasks:
            self._start()
        self._track(entry)
        done = self._future_of(entry)
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
        entries = self._by_session.get(entry.session_id)
        if entries is not None:
            entries.discard(entry)
            if not entries:
                del self._by_session[entry.session_id]

    async def _run(self, lane: _Lane) -> None:
        carried: list[_Entry | None] = []  # taken while collecting a batch, runs next
        while True:
            entry: _Entry | None
            if carried:
                entry = carried.pop()
            else:
                waiter = lane.waiter()
                while waiter is not None:
                    await waiter
                    waiter = lane.waiter()
                entry = lane.get_nowait()
                if lane._line and lane.admit():
                    # A writer waited for the slot just freed: let it run now, not after
                    # the whole queue (jobs that never suspend would drain it in one go,
                    # and every waiting writer's turn with it).
                    await asyncio.sleep(0)
            if entry is None:
                return
            if entry.batch is None:
                assert entry.job is not None  # a plain job's entry always has one
                await self._settle_run([entry], entry.job)
                entry = None  # not held while waiting for the next (it may hold a turn)
                continue
            batch = entry.batch
            entries = [entry]
            lingered = batch.linger <= 0
            while len(entries) < batch.max_items:
                if not lane._entries:
                    if lingered:
                        break
                    lingered = True
                    await self._linger(batch.linger, lane, batch.max_items - len(entries))
                    continue
                following = lane.get_nowait()
                if lane._line:
                    lane.admit()
                if following is None or following.batch is not batch:
                    carried.append(following)
                    break
                entries.append(following)
            # ``_settle_run``, inline: one coroutine less per batch.
            try:
                await batch.run([e.item for e in entries])
            except Exception as exc:  # noqa: BLE001 -- recorded and re-raised to waiters
                self._failed(entries, exc)
            else:
                self._succeeded(entries)
            many = len(entries) > 1
            # Nothing of the batch is held while waiting for the next: its items hold turns
            # (a purged user's text must not stay in memory until the next batch comes).
            entries.clear()
            entry = following = None
            if many:
                # Taking many items may have freed room for many waiting writers: let them
                # run before the next batch, or a worker whose jobs never suspend would
                # drain the whole queue while every writer waits.
                await asyncio.sleep(0)

    async def _linger(self, seconds: float, lane: _Lane, full: int) -> None:
        """Sleep ``seconds``, or less: until ``lane`` queues ``full`` entries or a writer
        waits for room in it, or somebody waits for the jobs (see ``_hurry``)."""
        if self._waiting or lane._line:
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = self._lingering[woken] = loop.call_at(loop.time() + seconds, _wake, woken)
        lane._linger, lane._linger_full = woken, full
        try:
            await woken
        finally:
            # Woken by its timer (most lingers), cancelling it is a no-op; woken by the lane
            # or ``_hurry``, or cancelled, the timer must not outlive the wait.
            timer.cancel()
            lane._linger = None
            del self._lingering[woken]

    def _hurry(self) -> None:
        """End every batch's linger now (and cancel its timer): somebody waits for the jobs."""
        for woken, timer in self._lingering.items():
            timer.cancel()
            _wake(woken)

    async def _settle_run(self, entries: list[_Entry], run: Job) -> None:
        """Run one job (or one batch) and settle the futures of its entries."""
        try:
            await run()
        except Exception as exc:  # noqa: BLE001 -- recorded and re-raised to waiters
            self._failed(entries, exc)
        else:
            self._succeeded(entries)

    def _failed(self, entries: list[_Entry], exc: Exception) -> None:
        """Settle the entries of a job (or batch) that raised ``exc``: recorded, logged."""
        self._failures += len(entries)
        logger.error(
            "background job of session(s) %s failed: %r",
            sorted({e.session_id for e in entries}),
            exc,
        )
        for e in entries:
            done = e.done  # None: nobody waits for it (queue_batched), nobody to tell
            if done is not None and not done.done():  # a caller may have cancelled it
                done.set_exception(exc)
                done.exception()  # logged above; waiters still get it
            self._forget(e)

    def _succeeded(self, entries: list[_Entry]) -> None:
        """Settle the entries of a job (or batch) that ran: ``_forget`` each, inline (once
        per turn's item)."""
        by_session = self._by_session
        for e in entries:
            done = e.done  # None: nobody waits for it (queue_batched)
            if done is not None and not done.done():  # a caller may have cancelled it
                done.set_result(None)
            listed = by_session.get(e.session_id)
            if listed is not None:
                listed.discard(e)
                if not listed:
                    del by_session[e.session_id]

    async def wait_for(self, *, user_id: str | None = None, session_id: str | None = None) -> None:
        """Wait for the jobs submitted so far for a user or a session (both: either).

        Raises:
            ExceptionGroup: the jobs waited for that failed, all of them.
        """
        futures: set[asyncio.Future[None]] = set()
        future_of = self._future_of
        if user_id is not None:  # a scan of the unfinished jobs (at most max_pending)
            for entries in self._by_session.values():
                futures.update(future_of(e) for e in entries if e.user_id == user_id)
        if session_id is not None:
            futures.update(map(future_of, self._by_session.get(session_id, ())))
        await self._settle_hurried(futures)

    async def drain(self) -> None:
        """Wait for every job submitted so far.

        Raises:
            ExceptionGroup: the jobs that failed, all of them.
        """
        while True:
            # A future its caller cancelled stays listed until the worker reaches its job:
            # nothing to wait for.
            futures = {
                f
                for entries in self._by_session.values()
                for f in map(self._future_of, entries)
                if not f.done()
            }
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
