"""Strands Agents backed by tiermem (extra ``strands``: ``pip install 'tiermem[strands]'``).

::

    from strands import Agent
    from tiermem.integrations.strands import TierMemConversationManager, TierMemSessionManager
    from tiermem.sync import SyncMemory

    memory = SyncMemory.from_settings()      # or, async: await TierMemSessionManager.open(...)
    agent = Agent(
        model=...,
        session_manager=TierMemSessionManager(memory, "s-1", user_id="u-1"),
        conversation_manager=TierMemConversationManager(),   # summarize → slide → shorten
    )
    agent("I prefer seinen. Is Berserk vol 42 in stock?")

:class:`TierMemSessionManager` keeps each message the agent adds as a tiermem turn of the
session (``agent_name`` is the agent's id), so the turns get everything tiermem does with
turns: the hot window, the durable archive, entity tracking, recall indexing and memory
detection. The agent's state, its conversation manager's state and the shape of its working
window are one state blob per agent (``strands:agent:<agent_id>``). A new agent with the
same session and agent id gets its messages back. What it gets back is the window the agent
last had, not the whole archive: after a reduction (a summary in front, messages dropped,
tool outputs shortened) the blob records the window as runs of turn indexes and the few
messages that are not turns (the summary, a shortened copy), so the restored agent does not
overflow again and the archive still holds every turn. Turns added after the blob was
written (a crash between the two) are appended on restore. A tool call whose result never
arrived is kept in the last message (Strands runs it on the next call) and turned into
text elsewhere (:func:`tiermem.context.tool_pairs.close_orphans`). A guardrail redaction
redacts the turn in every tier (:meth:`tiermem.session.Session.redact_turn`) and keeps
Strands' replacement text in the window.

:class:`TierMemConversationManager` runs a :mod:`tiermem.managers` manager (by default the
summarizing one with the rule summarizer) on the agent's messages and writes the result
back as a new list: messages the manager kept are the same objects, messages it made
(summaries) are new ones; nothing is edited in place. On overflow Strands calls
``reduce_context`` and retries the model call; when nothing can be reduced, the
overflow is re-raised with the manager's reasons. Proactive reduction is Strands'
``proactive_compression`` option.

**Event loops.** Strands calls its session manager from its own event loop (a fresh one per
synchronous ``agent(...)`` call) and some methods synchronously. Two ways to give the
manager a service:

* ``TierMemSessionManager(memory, ...)`` with a :class:`~tiermem.sync.SyncMemory`: the
  service runs on the facade's loop; writes are submitted there (awaited from Strands'
  async hooks, blocking in its synchronous calls). Works with ``agent(...)`` and
  ``await agent.invoke_async(...)`` alike.
* ``await TierMemSessionManager.open(service, ...)`` with a
  :class:`~tiermem.service.MemoryService` on the running loop: call the agent with ``await
  agent.invoke_async(...)`` on that loop. Writes from Strands' synchronous calls wait for
  its next hook (at the latest the end of the invocation; :meth:`TierMemSessionManager.flush`
  forces them). A hook on another loop raises :class:`~tiermem.errors.TierMemError`.

Both read the session's turns and blobs when opened; an agent initialized later restores
from that reading. Writes are queued in order; one that fails is raised from the hook (so
the agent call fails) and stays first in the queue, retried by the next flush without
duplicating turns (each append has an idempotency key).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic

from tiermem.context.tool_pairs import close_orphans
from tiermem.errors import TierMemError
from tiermem.models import JsonValue, Turn

try:
    from strands.agent.state import AgentState
    from strands.hooks import (
        AfterInvocationEvent,
        AgentInitializedEvent,
        BeforeInvocationEvent,
        HookRegistry,
        MessageAddedEvent,
    )
    from strands.session.session_manager import SessionManager as StrandsSessionManager
    from strands.types.content import Message as StrandsMessage
    from strands.types.exceptions import SessionException
    from strands.types.session import SessionAgent

    from tiermem.integrations._strands_conversation import TierMemConversationManager
    from tiermem.integrations._strands_messages import (
        extras_of,
        json_safe,
        to_strands,
        to_tiermem,
    )
    from tiermem.integrations._strands_window import (
        AgentLog,
        AgentRecord,
        Entry,
        Inline,
        Snapshot,
        record_of,
        restore_window,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"tiermem.integrations.strands needs the 'strands' extra: pip install 'tiermem[strands]' "
        f"({exc})"
    ) from exc

if TYPE_CHECKING:
    from strands.agent.agent import Agent

    from tiermem.service import MemoryService
    from tiermem.session import Session
    from tiermem.sync import SyncMemory

__all__ = ["STATE_PREFIX", "TierMemConversationManager", "TierMemSessionManager"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

STATE_PREFIX = "strands:agent:"
"""State blobs named ``strands:agent:<agent_id>`` hold each agent's record."""


# ---------------------------------------------------------------- loops


class _Bridge:
    """Runs tiermem coroutines on the loop the service lives on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, portal: bool) -> None:
        self.loop = loop
        self.portal = portal

    def can_block(self) -> bool:
        """Whether a synchronous call may wait for the service here."""
        if not self.portal:
            return False
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return True
        return running is not self.loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        if asyncio.get_running_loop() is self.loop:
            return await coro
        if not self.portal:
            coro.close()
            raise TierMemError(
                "this TierMemSessionManager was opened with a MemoryService on another event "
                "loop; call the agent with `await agent.invoke_async(...)` on that loop, or "
                "open the manager with a SyncMemory (TierMemSessionManager(memory, ...))"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wrap_future(future)


@dataclass(frozen=True, slots=True)
class _Loaded:
    session: Session
    turns: tuple[Turn, ...]
    records: dict[str, dict[str, JsonValue]]


async def _load(
    service: MemoryService, session_id: str, user_id: str, user_tier: str, locale: str
) -> _Loaded:
    session = await service.session(session_id, user_id=user_id, user_tier=user_tier, locale=locale)
    turns = tuple(await session.get_turns())
    view = await session.view()
    records = {
        name[len(STATE_PREFIX) :]: dict(blob.data)
        for name, blob in view.state.items()
        if name.startswith(STATE_PREFIX)
    }
    return _Loaded(session, turns, records)


# ---------------------------------------------------------------- session manager


class TierMemSessionManager(StrandsSessionManager):
    """A Strands session manager that keeps the agent's messages as tiermem turns (see the
    module docstring for what is stored where, and for the two ways to open one).

    Raises:
        ValidationError: bad ids or user tier (from :meth:`MemoryService.session`).
        TierMemError: a hook ran on a loop the manager cannot reach.
        BackendError: a tier failed while opening, or while writing (raised from the hook
            that wrote; the write is retried by the next one).
    """

    def __init__(
        self,
        memory: SyncMemory,
        session_id: str,
        *,
        user_id: str,
        user_tier: str = "standard",
        locale: str = "en-US",
    ) -> None:
        bridge = _Bridge(memory.loop, portal=True)
        loaded = bridge.run(_load(memory.__wrapped__, session_id, user_id, user_tier, locale))
        self._setup(bridge, loaded)

    @classmethod
    async def open(
        cls,
        service: MemoryService,
        session_id: str,
        *,
        user_id: str,
        user_tier: str = "standard",
        locale: str = "en-US",
    ) -> TierMemSessionManager:
        """A manager for ``service`` running on the current loop (see the module docstring).

        Raises:
            ValidationError: bad ids or user tier.
            BackendError: a tier failed.
        """
        manager = cls.__new__(cls)
        bridge = _Bridge(asyncio.get_running_loop(), portal=False)
        manager._setup(bridge, await _load(service, session_id, user_id, user_tier, locale))
        return manager

    def _setup(self, bridge: _Bridge, loaded: _Loaded) -> None:
        self.session_id = loaded.session.id
        self.session: Session = loaded.session
        """The tiermem session the turns are written to."""
        self._bridge = bridge
        self._loaded = loaded
        self._logs: dict[str, AgentLog] = {}
        self._pending: deque[Callable[[], Awaitable[None]]] = deque()
        self._lock: asyncio.Lock | None = None

    # -- hooks ------------------------------------------------------------------------------

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Restore on initialization; write each added message, and the agent's record when
        it changed, from Strands' async hooks."""
        registry.add_callback(AgentInitializedEvent, lambda event: self.initialize(event.agent))
        registry.add_callback(BeforeInvocationEvent, self._on_before_invocation)
        registry.add_callback(MessageAddedEvent, self._on_message_added)
        registry.add_callback(AfterInvocationEvent, self._on_after_invocation)

    async def _on_before_invocation(self, event: BeforeInvocationEvent) -> None:
        await self.flush()

    async def _on_message_added(self, event: MessageAddedEvent) -> None:
        self._queue_append(event.agent, event.message)
        self._queue_sync(event.agent)
        await self.flush()

    async def _on_after_invocation(self, event: AfterInvocationEvent) -> None:
        self._queue_sync(event.agent)
        await self.flush()

    async def flush(self) -> None:
        """Wait until every queued write is stored.

        Raises:
            BackendError: a write failed (it stays queued; flush again to retry it).
            TierMemError: called on a loop the manager cannot reach.
        """
        await self._bridge.arun(self._drain())

    # -- Strands' synchronous interface -------------------------------------------------------

    def append_message(self, message: StrandsMessage, agent: Agent, **kwargs: Any) -> None:
        """Store ``message`` as a turn of the agent (blocking when it can, else queued)."""
        self._queue_append(agent, message)
        self._flush_if_possible()

    def sync_agent(self, agent: Agent, **kwargs: Any) -> None:
        """Store the agent's record if it changed (blocking when it can, else queued)."""
        self._queue_sync(agent)
        self._flush_if_possible()

    def redact_latest_message(
        self, redact_message: StrandsMessage, agent: Agent, **kwargs: Any
    ) -> None:
        """Redact the agent's latest turn in every tier; ``redact_message`` (Strands'
        replacement) stays in the window.

        Raises:
            SessionException: the agent has no message yet.
        """
        log = self._log(agent)
        latest = log.last
        if latest is None:
            raise SessionException("No message to redact.")

        async def redact() -> None:
            if latest.turn_index is None:
                raise TierMemError("the message to redact was not written")
            await self.session.redact_turn(latest.turn_index)

        self._pending.append(redact)
        self._queue_sync(agent)
        self._flush_if_possible()

    def initialize(self, agent: Agent, **kwargs: Any) -> None:
        """Restore the agent from the session as it was read when the manager was opened,
        or, for an agent new to the session, store its initial messages.

        Raises:
            SessionException: an agent with this id was already initialized here.
        """
        agent_id = agent.agent_id
        if agent_id in self._logs:
            raise SessionException("The `agent_id` of an agent must be unique in a session.")
        log = self._logs[agent_id] = AgentLog()
        turns = [t for t in self._loaded.turns if t.agent_name == agent_id]
        raw_record = self._loaded.records.get(agent_id)
        if not turns and raw_record is None:
            for message in agent.messages:
                self._queue_append(agent, message)
            self._queue_sync(agent)
            self._flush_if_possible()
            return
        record = self._parse(agent_id, raw_record)
        if record is not None:
            self._restore_state(agent, record)
        ordinal = {t.index: n for n, t in enumerate(turns)}
        log.next_seq = len(turns)
        log.restored_through = max(
            record.through if record is not None else -1, turns[-1].index if turns else -1
        )
        if agent.model.stateful:
            return  # the provider keeps the conversation
        window = restore_window(turns, record)
        closed = close_orphans([m.content for m, _, _ in window], open_last=True)
        messages: list[StrandsMessage] = []
        for (stored, extras, turn), blocks in zip(window, closed, strict=True):
            fixed = (
                stored
                if blocks == stored.content
                else stored.model_copy(update={"content": blocks})
            )
            raw = to_strands(fixed, extras)
            if turn is not None and fixed is stored and not turn.redacted:
                entry = Entry(raw, raw["content"], ordinal[turn.index], turn.index)
                log.entries[id(raw)] = entry
                if turn.index == log.restored_through:
                    log.last = entry
            messages.append(raw)
        agent.messages = messages
        logger.debug(
            "restored agent %s of session %s: %d messages from %d turns",
            agent_id,
            self.session_id,
            len(messages),
            len(turns),
        )

    def _parse(self, agent_id: str, raw: dict[str, JsonValue] | None) -> AgentRecord | None:
        if raw is None:
            return None
        try:
            return AgentRecord.model_validate(raw)
        except pydantic.ValidationError as exc:
            logger.warning(
                "the record of agent %s in session %s cannot be read (%s); restoring every "
                "turn of the agent instead",
                agent_id,
                self.session_id,
                exc.errors()[0]["msg"] if exc.errors() else exc,
            )
            return None

    def _restore_state(self, agent: Agent, record: AgentRecord) -> None:
        stored = SessionAgent.from_dict({**record.agent, "agent_id": agent.agent_id})
        agent.state = AgentState(stored.state)
        stored.initialize_internal_state(agent)
        manager_state = stored.conversation_manager_state
        manager = agent.conversation_manager
        if manager_state.get("__name__") == type(manager).__name__:
            # Its prepend list (a summary) is ignored: the restored window holds it already.
            manager.restore_from_session(manager_state)
        elif manager_state:
            logger.warning(
                "agent %s was saved with a %s and now has a %s; its conversation manager "
                "starts fresh (the messages are restored)",
                agent.agent_id,
                manager_state.get("__name__"),
                type(manager).__name__,
            )

    # -- the write queue ------------------------------------------------------------------------

    def _log(self, agent: Agent) -> AgentLog:
        log = self._logs.get(agent.agent_id)
        if log is None:
            raise SessionException(
                f"agent {agent.agent_id!r} was not initialized with this session manager"
            )
        return log

    def _queue_append(self, agent: Agent, message: StrandsMessage) -> None:
        log = self._log(agent)
        entry = Entry(message, message.get("content"), log.next_seq)
        log.add(entry)
        tiermem_message = to_tiermem(message)
        extras = extras_of(message)
        key = f"strands-{uuid.uuid4().hex}"  # one per message: a retried write stores it once
        agent_id = agent.agent_id

        async def append() -> None:
            turn = await self.session.add_turn(
                tiermem_message.role,
                tiermem_message,
                agent_name=agent_id,
                metadata={"strands": extras},
                idempotency_key=key,
            )
            entry.turn_index = turn.index

        self._pending.append(append)

    def _queue_sync(self, agent: Agent) -> None:
        log = self._log(agent)
        items: list[Entry | Inline] = []
        for message in agent.messages:
            entry = log.entries.get(id(message))
            if entry is not None and entry.unchanged(message):
                items.append(entry)
            else:
                items.append(Inline(message=to_tiermem(message), strands=extras_of(message)))
        stored = SessionAgent.from_agent(agent).to_dict()
        agent_data = {k: v for k, v in stored.items() if k not in ("created_at", "updated_at")}
        snap = Snapshot(tuple(items), json_safe(agent_data), log.last, log.restored_through)
        # Entries out of the window are not needed again (the newest stays for `through`).
        held = {id(item.message) for item in items if isinstance(item, Entry)}
        log.entries = {k: e for k, e in log.entries.items() if k in held or e is log.last}
        name = STATE_PREFIX + agent.agent_id

        async def write() -> None:
            data = record_of(snap).model_dump(mode="json", by_alias=True)
            if data != log.written:
                await self.session.put_state(name, data)
                log.written = data

        self._pending.append(write)

    def _flush_if_possible(self) -> None:
        if self._bridge.can_block():
            self._bridge.run(self._drain())

    async def _drain(self) -> None:
        # Runs on the service's loop only, so the lock is made and used there.
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while self._pending:
                await self._pending[0]()
                self._pending.popleft()
