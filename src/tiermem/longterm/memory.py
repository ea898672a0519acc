"""LongTermMemory: the API over a user's long-term memories.

It owns every write to them, so the rules hold whoever calls (SDK, service hook, REST,
MCP). Ids, limits, models and the pure decisions are in :mod:`tiermem.longterm.records`.
The class is composed of one module per concept, each stating the rules it keeps:

* :mod:`tiermem.longterm.memory_core`: state and shared internals; the change log, and
  the search index following the durable store.
* :mod:`tiermem.longterm.writes`: ``remember`` (dedup), ``supersede``,
  ``remember_detected``.
* :mod:`tiermem.longterm.preferences`: preference slots and their history.
* :mod:`tiermem.longterm.forgetting`: ``forget``, ``forget_session``, ``unindex_turns``,
  ``purge_user``.
* here: reads (``get``, ``list``, ``changes``, ``recall``, ``build_user_context``,
  ``stats``), ``index_turns`` and ``aclose``.

Errors: every method validates ids and sizes before any I/O and raises
:class:`~tiermem.errors.ValidationError` with advice; backend failures surface as
:class:`~tiermem.errors.BackendError`; compare-and-set loops that keep losing raise
:class:`~tiermem.errors.ConflictError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tiermem.errors import UnsupportedCapabilityError, ValidationError
from tiermem.longterm.forgetting import MemoryForgetting
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.memory_core import _MEMORY_SCOPE, MemoryRecaller, Records, _entry
from tiermem.longterm.preferences import MemoryPreferences
from tiermem.longterm.recall import Recaller, turn_docs
from tiermem.longterm.records import (
    CHANGE_LOG_TYPE,
    PREFERENCE_HISTORY_TYPE,
    ChangeEntry,
    UserMemoryStats,
    check_limit,
    check_time,
    is_bookkeeping,
    is_hidden,
    is_live,
    public_record,
)
from tiermem.longterm.writes import MemoryWrites
from tiermem.models import MemoryRecord, Turn
from tiermem.store.keys import validate_id

if TYPE_CHECKING:
    from tiermem.longterm.context import UserContext

__all__ = ["LongTermMemory", "MemoryRecaller", "Records"]


# ---------------------------------------------------------------- the API


class LongTermMemory(MemoryWrites, MemoryPreferences, MemoryForgetting):
    """A user's long-term memories over a durable store and a search index.

    One instance serves every user and is safe for concurrent tasks: all coordination goes
    through the durable store's compare-and-set.
    """

    # -- read ---------------------------------------------------------------------------------

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        """One memory (current, superseded or history), or None if absent or expired."""
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        record = await self.durable.get_memory(user_id, memory_id)
        return None if record is None else public_record(record)

    async def list(
        self,
        user_id: str,
        *,
        types: Collection[str] | None = None,
        include_superseded: bool = False,
        limit: int = 100,
    ) -> Records:
        """The user's memories of ``types`` (default: every registered type), newest first:
        current ones, and with ``include_superseded`` also superseded ones and preference
        history. Internal records are never listed.

        Raises:
            ValidationError: a bad id or limit, an unknown or internal type.
        """
        validate_id(user_id, what="user_id")
        check_limit(limit)
        if isinstance(types, str):
            raise ValidationError(f"types must be a collection of type names, got {types!r}")
        # Ask for the registered types, so that the change log is never read here.
        names = self.types.names() if types is None else types
        wanted = [self._user_type(t).name for t in names]
        if include_superseded and "preference" in wanted:
            wanted.append(PREFERENCE_HISTORY_TYPE)  # one scan keeps newest-first order
        now = self.clock.now()
        out: Records = []
        async for page in self._scan(user_id, memory_types=wanted):
            for record in page:
                if is_bookkeeping(record):
                    continue
                if include_superseded or not is_hidden(record, now):
                    out.append(public_record(record))
                    if len(out) == limit:
                        return out
        return out

    async def changes(
        self, user_id: str, *, since: datetime | None = None, limit: int = 100
    ) -> builtins.list[ChangeEntry]:
        """The user's change log, newest first; ``since`` is inclusive."""
        validate_id(user_id, what="user_id")
        check_limit(limit)
        check_time(since, what="since")
        records = await self.durable.query_memories(
            user_id, memory_types=[CHANGE_LOG_TYPE], since=since, limit=limit
        )
        entries = [_entry(r) for r in records]
        return [e for e in entries if e is not None]

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        types: Collection[str] | None = None,
        min_importance: float = 0.0,
        since: datetime | None = None,
        until: datetime | None = None,
        k: int = 5,
        scope: Collection[DocKind] = _MEMORY_SCOPE,
    ) -> builtins.list[RecallHit]:
        """The memories most relevant to ``query`` (delegated to the recaller).

        Raises:
            UnsupportedCapabilityError: no recaller was configured.
        """
        if self.recaller is None:
            raise UnsupportedCapabilityError(
                "this LongTermMemory has no recaller; build it with "
                "recaller=tiermem.longterm.recall.Recaller(...)"
            )
        return await self.recaller.recall(
            user_id,
            query,
            types=types,
            min_importance=min_importance,
            since=since,
            until=until,
            k=k,
            scope=scope,
        )

    async def build_user_context(
        self, user_id: str, query: str, *, budget_tokens: int, model: str | None = None
    ) -> UserContext:
        """A compact block of what is known about the user, within ``budget_tokens`` (see
        :func:`tiermem.longterm.context.build_user_context`)."""
        from tiermem.longterm.context import build_user_context

        return await build_user_context(
            self, user_id, query, budget_tokens=budget_tokens, model=model, models=self._models
        )

    async def stats(self, user_id: str) -> UserMemoryStats:
        """Counts, tokens and ages of the user's memories (reads the whole partition)."""
        validate_id(user_id, what="user_id")
        now = self.clock.now()
        by_type: dict[str, int] = {}
        tokens = superseded = expired = changes = 0
        oldest: datetime | None = None
        newest: datetime | None = None
        async for page in self._scan(user_id, include_expired=True):
            for record in page:
                if not is_live(record, now):
                    expired += 1
                elif record.memory_type == CHANGE_LOG_TYPE:
                    changes += 1
                elif is_hidden(record, now):
                    superseded += 1
                else:
                    by_type[record.memory_type] = by_type.get(record.memory_type, 0) + 1
                    tokens += self.tokens.count(record.content)
                    oldest = min(oldest or record.created_at, record.created_at)
                    newest = max(newest or record.created_at, record.created_at)
        return UserMemoryStats(
            user_id=user_id,
            total=sum(by_type.values()),
            by_type=dict(sorted(by_type.items())),
            total_tokens=tokens,
            oldest_created_at=oldest,
            newest_created_at=newest,
            superseded=superseded,
            expired_awaiting_collection=expired,
            change_log_entries=changes,
        )

    async def index_turns(
        self,
        user_id: str,
        session_id: str,
        turns: Sequence[Turn],
        *,
        expires_at: datetime | None,
        terms: Sequence[Mapping[str, int] | None] | None = None,
    ) -> None:
        """Index archived turns for episodic recall; their documents expire with them.
        ``terms``: the turns' term frequencies, when already computed (one per turn)."""
        docs = turn_docs(user_id, session_id, turns, expires_at=expires_at, terms=terms)
        await self.index_docs(docs)

    async def index_docs(self, docs: builtins.list[IndexedDoc]) -> None:
        """Index documents built by :func:`~tiermem.longterm.recall.turn_docs` (several
        sessions' at once: the background queue merges their index writes into one)."""
        if isinstance(self.recaller, Recaller) and self.index.supports_vectors:
            # Embedded once, here, off the response path: a recall embeds only its query.
            docs = await self.recaller.embed_documents(docs)
        await self.index.upsert(docs)

    async def aclose(self) -> None:
        """Close the index and the recaller (not the durable store: its owner closes it)."""
        if self.recaller is not None:
            await self.recaller.aclose()
        await self.index.aclose()
