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
* **Failures are reported, every one**: a job that raises is recorded; ``wait_for`` and
  ``drain`` raise an :class:`ExceptionGroup` of all failures among the jobs they waited for.
  Jobs that handle their own expected errors (log and count a :class:`TierMemError`) simply
  do not raise.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackgroundWork"]

logger = logging.getLogger(__name__)

Job = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class _Entry:
    user_id: str
    session_id: str
    job: Job
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class BackgroundWork:
    """Bounded background jobs, ordered per session. One per service and event loop."""

    def __init__(self, *, workers: int = 2, max_pending: int = 1000) -> None:
        if workers < 1 or max_pending < workers:
            raise ValueError("need workers >= 1 and max_pending >= workers")
        self._workers = workers
        self._per_queue = max_pending // workers
        self._queues: list[asyncio.Queue[_Entry | None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, set[asyncio.Future[None]]] = {}
        self._failures = 0

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished yet."""
        return len({f for fs in self._pending.values() for f in fs})

    @property
    def queued(self) -> int:
        """Jobs waiting in the queues (at most ``max_pending``)."""
        return sum(q.qsize() for q in self._queues)

    @property
    def failures(self) -> int:
        """Jobs that raised since the start."""
        return self._failures

    def _start(self) -> None:
        if self._tasks:
            return
        for n in range(self._workers):
            queue: asyncio.Queue[_Entry | None] = asyncio.Queue(self._per_queue)
            self._queues.append(queue)
            self._tasks.append(asyncio.create_task(self._run(queue), name=f"tiermem-bg-{n}"))

    async def submit(self, user_id: str, session_id: str, job: Job) -> asyncio.Future[None]:
        """Queue ``job`` (waits while the queue is full); returns a future of its result."""
        self._start()
        entry = _Entry(user_id, session_id, job)
        for key in (_user_key(user_id), _session_key(session_id)):
            self._pending.setdefault(key, set()).add(entry.done)
        entry.done.add_done_callback(lambda f: self._forget(entry, f))
        queue = self._queues[zlib.crc32(session_id.encode()) % self._workers]
        await queue.put(entry)
        return entry.done

    def _forget(self, entry: _Entry, done: asyncio.Future[None]) -> None:
        if not done.cancelled():
            done.exception()  # logged by the worker already; waiters still get it
        for key in (_user_key(entry.user_id), _session_key(entry.session_id)):
            futures = self._pending.get(key)
            if futures is not None:
                futures.discard(done)
                if not futures:
                    del self._pending[key]

    async def _run(self, queue: asyncio.Queue[_Entry | None]) -> None:
        while True:
            entry = await queue.get()
            if queue.qsize() == self._per_queue - 1:
                # The queue was full, so a writer may wait for the slot just freed: let it
                # run now, not after the whole queue (jobs that never suspend would drain
                # it in one go, and every waiting writer's turn with it).
                await asyncio.sleep(0)
            try:
                if entry is None:
                    return
                try:
                    await entry.job()
                except Exception as exc:  # noqa: BLE001 -- recorded and re-raised to waiters
                    self._failures += 1
                    logger.error("background job of session %s failed: %r", entry.session_id, exc)
                    entry.done.set_exception(exc)
                else:
                    entry.done.set_result(None)
            finally:
                queue.task_done()

    async def wait_for(self, *, user_id: str | None = None, session_id: str | None = None) -> None:
        """Wait for the jobs submitted so far for a user or a session (both: either).

        Raises:
            ExceptionGroup: the jobs waited for that failed, all of them.
        """
        keys = []
        if user_id is not None:
            keys.append(_user_key(user_id))
        if session_id is not None:
            keys.append(_session_key(session_id))
        futures = {f for key in keys for f in self._pending.get(key, ())}
        await _settle(futures)

    async def drain(self) -> None:
        """Wait for every job submitted so far.

        Raises:
            ExceptionGroup: the jobs that failed, all of them.
        """
        while True:
            futures = {f for fs in self._pending.values() for f in fs}
            if not futures:
                return
            await _settle(futures)

    async def aclose(self) -> None:
        """Finish the queued jobs, then stop the workers."""
        try:
            await self.drain()
        finally:
            for queue in self._queues:
                await queue.put(None)
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
            self._queues.clear()


async def _settle(futures: set[asyncio.Future[None]]) -> None:
    if not futures:
        return
    await asyncio.wait(futures)
    errors = [
        exc
        for f in futures
        if not f.cancelled() and (exc := f.exception()) is not None and isinstance(exc, Exception)
    ]
    if errors:
        raise ExceptionGroup(f"{len(errors)} background job(s) failed", errors)


def _user_key(user_id: str) -> str:
    return f"u:{user_id}"


def _session_key(session_id: str) -> str:
    return f"s:{session_id}"
