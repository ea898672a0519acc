"""The expiry sweeper: finds sessions whose hot tier expired and hands each off exactly once
(again, whole, if it got turns after its handoff: a closed session reopens on a turn).

Sweepers on any number of workers call :meth:`ExpirySweeper.sweep_once` periodically. Each
claims expired sessions from the hot tier's activity index with a lease; a claimed session
goes to the handoff callback (by default :class:`tiermem.summaries.handoff.SessionHandoff`:
session summary, topics, sentiment and preferences into long-term memory, see
``docs/summaries.md``) and is released. A worker that crashes mid-handoff simply lets its
lease run out, and another worker claims the session again, so a handoff must be
idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiermem.errors import TierMemError
from tiermem.longterm.index import SearchIndex
from tiermem.tiers.config import WritePolicy
from tiermem.tiers.tiered import SessionView, TieredSessionStore

__all__ = ["ExpirySweeper", "Handoff", "SweepResult"]

logger = logging.getLogger(__name__)

Handoff = Callable[[SessionView], Awaitable[None]]
"""Called once per expired session with its final view (from the durable tier)."""


@dataclass(frozen=True)
class SweepResult:
    handed_off: tuple[str, ...]
    failed: tuple[str, ...]


class ExpirySweeper:
    def __init__(
        self,
        tiers: TieredSessionStore,
        handoff: Handoff,
        *,
        owner: str,
        index: SearchIndex | None = None,
        collect_limit: int = 1000,
    ) -> None:
        self._tiers = tiers
        self._handoff = handoff
        self._owner = owner
        self._index = index
        self._collect_limit = collect_limit

    async def sweep_once(self, *, limit: int = 100) -> SweepResult:
        """Claim up to ``limit`` expired sessions and hand each off.

        A handoff that raises a :class:`TierMemError` is logged and left leased, so another
        sweep retries it once the lease runs out; other exceptions propagate.
        """
        claimed = await self._tiers.hot.claim_expired(
            owner=self._owner, lease=self._tiers.config.sweep_lease, limit=limit
        )
        done: list[str] = []
        failed: list[str] = []
        for session_id in claimed:
            try:
                if self._tiers.config.write_policy is WritePolicy.WRITE_BEHIND:
                    # Unflushed turns still sit in the expired hot session: save them first.
                    await self._tiers.flush(session_id, include_expired=True)
                # Read the durable tier only: a hot reload would bring the session back to
                # life and void the lease.
                view = await self._tiers.durable_view(session_id)
                if view is not None:
                    await self._handoff(view)
            except TierMemError:
                logger.exception("handoff of session %s failed; it will be retried", session_id)
                failed.append(session_id)
                continue
            if await self._tiers.hot.release_expired(session_id, owner=self._owner):
                done.append(session_id)
        await self._collect_index()
        return SweepResult(tuple(done), tuple(failed))

    async def _collect_index(self) -> None:
        """Collect expired search documents of idle users too (writes collect only as they
        go): at most ``collect_limit`` per sweep, so a sweep's work stays bounded."""
        if self._index is None:
            return
        try:
            await self._index.collect_expired(self._collect_limit)
        except TierMemError:
            logger.exception("collecting expired search documents failed; the next sweep retries")
