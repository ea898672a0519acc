"""Access tracking: recall counts which memories it returned; the counts reach the durable
store later, in batches, off the request path.

Seed 000 updated ``access_count`` with one write per recalled record, inline, on every
recall: five extra round trips on the path the user waits for, and lost updates when two
recalls touch one record. Here :meth:`AccessTracker.record` only adds to counters in memory
(no I/O); :meth:`AccessTracker.flush` writes them, one compare-and-set per record
(``put_memory`` with ``expected_version``, re-read and retried on conflict), a few records
at a time. Flushes run in a background task, started when ``flush_every`` hits have
accumulated, and when the owner calls :meth:`flush` or :meth:`aclose` (the service does on
close).

Access statistics are best effort, and the loss window is explicit: counts still pending
when the process dies are lost; beyond ``max_pending`` distinct records, new hits are
dropped (and counted in :attr:`AccessTracker.stats`) until a flush catches up. A record
written by a flush gets a new ``version``, so a writer holding an older version of it sees
a :class:`~tiermem.errors.ConflictError` and re-reads, as for any concurrent write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from tiermem.clock import Clock
from tiermem.errors import BackendError, ConflictError, ValidationError
from tiermem.store.contract import DurableStore

__all__ = ["AccessStats", "AccessTracker", "FlushReport"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    count: int
    last: datetime


@dataclass(frozen=True, slots=True)
class FlushReport:
    """What one :meth:`AccessTracker.flush` did."""

    applied: int = 0
    """Records whose access stats were written."""
    missing: int = 0
    """Records gone (deleted or expired) before their counts could be written."""
    failed: int = 0
    """Records not written (backend failure, or conflicts past the retries); kept pending."""
    conflicts: int = 0
    """Compare-and-set retries."""


@dataclass(slots=True)
class AccessStats:
    """Totals since the tracker was made."""

    recorded: int = 0
    dropped: int = 0
    applied: int = 0
    missing: int = 0
    failed: int = 0
    conflicts: int = 0
    flushes: int = 0


class AccessTracker:
    """Counts recall hits in memory and writes them to the durable store in batches.

    ``flush_every``: hits after which a background flush starts (one at a time).
    ``max_pending``: distinct (user, memory) pairs held at most; further new pairs are
    dropped until a flush. ``concurrency``: records written at once by a flush.
    ``max_attempts``: compare-and-set attempts per record and flush.
    """

    def __init__(
        self,
        durable: DurableStore,
        *,
        clock: Clock,
        flush_every: int = 200,
        max_pending: int = 10_000,
        concurrency: int = 8,
        max_attempts: int = 5,
    ) -> None:
        for name, value in (
            ("flush_every", flush_every),
            ("max_pending", max_pending),
            ("concurrency", concurrency),
            ("max_attempts", max_attempts),
        ):
            if value < 1:
                raise ValidationError(f"AccessTracker {name} must be at least 1, got {value}")
        self._durable = durable
        self._clock = clock
        self._flush_every = flush_every
        self._max_pending = max_pending
        self._concurrency = concurrency
        self._max_attempts = max_attempts
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._since_flush = 0
        self._flush_lock = asyncio.Lock()
        self._background: asyncio.Task[FlushReport] | None = None
        self._warned_full = False
        self.stats = AccessStats()

    @property
    def pending(self) -> int:
        """Distinct (user, memory) pairs waiting for a flush."""
        return len(self._pending)

    def pending_count(self, user_id: str, memory_id: str) -> int:
        """Hits of one memory not yet written."""
        entry = self._pending.get((user_id, memory_id))
        return 0 if entry is None else entry.count

    def record(self, user_id: str, memory_ids: Iterable[str]) -> None:
        """Count one access of each memory, now. No I/O: this is what recall calls.

        May start a background flush (when called inside a running event loop).
        """
        now = self._clock.now()
        for memory_id in memory_ids:
            key = (user_id, memory_id)
            entry = self._pending.get(key)
            if entry is not None:
                entry.count += 1
                entry.last = max(entry.last, now)
            elif len(self._pending) < self._max_pending:
                self._pending[key] = _Pending(1, now)
            else:
                self.stats.dropped += 1
                if not self._warned_full:
                    self._warned_full = True
                    logger.warning(
                        "access tracker holds %d records, its max_pending; dropping new "
                        "access counts until a flush catches up",
                        self._max_pending,
                    )
                continue
            self.stats.recorded += 1
            self._since_flush += 1
        if self._since_flush >= self._flush_every:
            self._start_background_flush()

    def _start_background_flush(self) -> None:
        if self._background is not None and not self._background.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a sync caller): the next flush() or aclose() writes them
        self._since_flush = 0
        self._background = loop.create_task(self.flush(), name="tiermem-access-flush")
        self._background.add_done_callback(_log_failed_flush)

    async def flush(self) -> FlushReport:
        """Write every pending count; return what happened.

        Records that could not be written (backend failure, conflicts past
        ``max_attempts``) stay pending for the next flush; their failure is logged, not
        raised, since nothing the caller does now would help.
        """
        async with self._flush_lock:
            batch, self._pending = self._pending, {}
            self._since_flush = 0
            self._warned_full = False
            if not batch:
                return FlushReport()
            gate = asyncio.Semaphore(self._concurrency)

            async def apply(key: tuple[str, str], entry: _Pending) -> FlushReport:
                async with gate:
                    return await self._apply(key, entry)

            reports = await asyncio.gather(*(apply(k, e) for k, e in batch.items()))
        report = FlushReport(
            applied=sum(r.applied for r in reports),
            missing=sum(r.missing for r in reports),
            failed=sum(r.failed for r in reports),
            conflicts=sum(r.conflicts for r in reports),
        )
        self.stats.flushes += 1
        self.stats.applied += report.applied
        self.stats.missing += report.missing
        self.stats.failed += report.failed
        self.stats.conflicts += report.conflicts
        if report.failed:
            logger.warning(
                "access flush: %d of %d records not written, kept for the next flush",
                report.failed,
                len(batch),
            )
        return report

    async def _apply(self, key: tuple[str, str], entry: _Pending) -> FlushReport:
        user_id, memory_id = key
        conflicts = 0
        for _ in range(self._max_attempts):
            try:
                record = await self._durable.get_memory(user_id, memory_id)
                if record is None:
                    return FlushReport(missing=1, conflicts=conflicts)
                last = (
                    entry.last
                    if record.accessed_at is None
                    else max(record.accessed_at, entry.last)
                )
                updated = record.model_copy(
                    update={
                        "access_count": record.access_count + entry.count,
                        "accessed_at": last,
                        "version": record.version + 1,
                    }
                )
                await self._durable.put_memory(updated, expected_version=record.version)
                return FlushReport(applied=1, conflicts=conflicts)
            except ConflictError:
                conflicts += 1
            except BackendError as exc:
                logger.debug("access flush of a memory failed: %s", exc)
                break
        self._requeue(key, entry)
        return FlushReport(failed=1, conflicts=conflicts)

    def _requeue(self, key: tuple[str, str], entry: _Pending) -> None:
        current = self._pending.get(key)
        if current is None:
            self._pending[key] = entry
        else:
            current.count += entry.count
            current.last = max(current.last, entry.last)

    async def aclose(self) -> FlushReport:
        """Wait for a running background flush, then flush what is left."""
        if self._background is not None:
            await asyncio.gather(self._background, return_exceptions=True)
            self._background = None
        return await self.flush()


def _log_failed_flush(task: asyncio.Task[FlushReport]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("background access flush failed", exc_info=exc)
