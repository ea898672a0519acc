"""MemoryService: the one API every interface (SDK, CLI, REST, MCP) calls.

::

    async with MemoryService.from_settings() as memory:        # embedded: no server
        session = await memory.session("s-1", user_id="u-1", user_tier="vip")
        turn = await session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
        history = await session.history()                      # the hot window

Adding a turn counts its tokens, scores its importance and extracts its entities with rules
(no LLM on this path), then writes it through the tiers (see :mod:`tiermem.tiers.tiered`).

Long-term memory (:attr:`MemoryService.longterm`) is fed from user turns by auto-detection
(:mod:`tiermem.longterm.detect`, rules only). It runs **off the response path**: ``add_turn``
returns once the turn is written, and detection runs in a background task, one at a time and
in turn order per session handle (so "I prefer seinen" then "I prefer shonen" ends at
shonen). :meth:`Session.close`, :meth:`MemoryService.drain` and :meth:`MemoryService.aclose`
wait for those tasks; a failed detection write is logged and counted
(``auto_detect_failures``), never raised into ``add_turn``. Turn it off with
``MemoryService(..., auto_detect=False)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, NoReturn, Self

from pydantic import Field

from tiermem.clock import Clock, IdFactory, SystemClock, UlidFactory
from tiermem.errors import NotFoundError, TierMemError, ValidationError
from tiermem.extraction.entities import EntityExtractor, RuleEntityExtractor
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.access import AccessTracker
from tiermem.longterm.detect import MemoryDetector, RuleMemoryDetector
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.knowledge import KnowledgeBase
from tiermem.longterm.memory import LongTermMemory
from tiermem.longterm.recall import turn_doc_id, turn_docs
from tiermem.models import (
    ActiveEntity,
    ContentBlock,
    JsonValue,
    MemoryRecord,
    Message,
    NewTurn,
    Provenance,
    SessionMetadata,
    SessionRef,
    StateBlob,
    TextBlock,
    Turn,
    UserTier,
    text_of,
)
from tiermem.models.base import FrozenModel
from tiermem.policies.importance import ImportanceScorer, RuleImportanceScorer
from tiermem.policies.ttl import HybridTtl, TtlPolicy
from tiermem.settings import TierMemSettings
from tiermem.store.contract import MAX_TURNS_PER_APPEND, Capability, DurableStore, HotStore
from tiermem.store.keys import validate_id
from tiermem.tiers.config import SessionTierConfig
from tiermem.tiers.sweeper import ExpirySweeper, Handoff
from tiermem.tiers.tiered import SessionView, TieredSessionStore, TierMetrics, derive_metadata
from tiermem.tokens import TiktokenCounter, TokenCounter

__all__ = ["MemoryService", "Session", "SessionStats", "TurnInput"]

logger = logging.getLogger(__name__)

Content = str | Message | Sequence[ContentBlock | Mapping[str, Any]]


class TurnInput(FrozenModel):
    """One turn to add, for :meth:`Session.add_turns`. Only role and content are required."""

    role: str
    content: Any
    timestamp: datetime | None = None
    importance: float | None = None
    pinned: bool = False
    agent_name: str | None = None
    intent: str | None = None
    latency_ms: float | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


class SessionStats(FrozenModel):
    session_id: str
    turn_count: int
    hot_turns: int
    hot_tokens: int
    oldest_turn_age_s: float | None
    expires_at: datetime | None
    hot_hits: int
    reloads: int
    served_from: str


def _blocks(content: Content) -> tuple[Any, ...]:
    if isinstance(content, str):
        return (TextBlock(text=content),)
    if isinstance(content, Message):
        return content.content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        return tuple(content)
    raise ValidationError(
        "content must be a string, a Message, or a sequence of content blocks; got "
        f"{type(content).__name__}"
    )


class MemoryService:
    """Sessions over a hot and a durable store, with the turn pipeline in front.

    Construct with stores and engines (everything injectable), or from settings with
    :meth:`from_settings`. Use as an async context manager, or call :meth:`aclose`.
    """

    def __init__(
        self,
        hot: HotStore,
        durable: DurableStore,
        *,
        clock: Clock | None = None,
        ids: IdFactory | None = None,
        tokens: TokenCounter | None = None,
        importance: ImportanceScorer | None = None,
        entities: EntityExtractor | None = None,
        ttl_policy: TtlPolicy | None = None,
        config: SessionTierConfig | None = None,
        index: SearchIndex | None = None,
        longterm: LongTermMemory | None = None,
        auto_detect: bool = True,
        detector: MemoryDetector | None = None,
        embedder: Embedder | None = None,
        index_turns: bool = True,
    ) -> None:
        self.clock = clock or SystemClock()
        self.ids = ids or UlidFactory()
        self.tokens = tokens or TiktokenCounter()
        self.importance = importance or RuleImportanceScorer()
        self.entities = entities or RuleEntityExtractor()
        self.tiers = TieredSessionStore(
            hot, durable, clock=self.clock, ttl_policy=ttl_policy or HybridTtl(), config=config
        )
        built, knowledge, access = _default_longterm(
            durable,
            index,
            clock=self.clock,
            ids=self.ids,
            tokens=self.tokens,
            embedder=embedder,
        )
        self.longterm = longterm or built
        """Long-term user memory (remember, preferences, recall, forget) over ``durable``."""
        self.knowledge = knowledge
        """Knowledge documents (txt, md, pdf, docx) per user, recalled as ``chunk`` hits."""
        self.access = access
        """Recall hits counted in memory, written back in batches off the request path."""
        self.index_turns = index_turns
        """Index archived turns for episodic recall (``recall(scope=("turn",))``)."""
        self.index_failures = 0
        """Turn-indexing writes that failed (logged); the turns themselves were written."""
        self.auto_detect = auto_detect
        self.detector: MemoryDetector = detector or RuleMemoryDetector()
        self.auto_detect_failures = 0
        """Auto-detection writes that failed (logged); the turns themselves were written."""
        self._background: set[asyncio.Task[None]] = set()

    @classmethod
    def from_settings(
        cls, settings: TierMemSettings | None = None, *, clock: Clock | None = None, **engines: Any
    ) -> MemoryService:
        """Build the stores, search index and embedder the settings name (default: in-process
        hot tier, SQLite durable tier with a SQLiteIndex in the same file, no embeddings).
        ``engines`` override any constructor argument."""
        from tiermem.composition import (
            open_durable_store,
            open_embedder,
            open_hot_store,
            open_search_index,
        )

        settings = settings or TierMemSettings()
        clock = clock or SystemClock()
        engines.setdefault("config", SessionTierConfig(window=settings.hot_window))
        if "index" not in engines and "longterm" not in engines:
            engines["index"] = open_search_index(settings)
        if "embedder" not in engines:
            engines["embedder"] = open_embedder(settings)
        return cls(
            open_hot_store(settings, clock=clock),
            open_durable_store(settings, clock=clock),
            clock=clock,
            **engines,
        )

    @property
    def metrics(self) -> TierMetrics:
        return self.tiers.metrics

    async def session(
        self,
        session_id: str | None = None,
        *,
        user_id: str,
        user_tier: UserTier | str = UserTier.STANDARD,
        locale: str = "en-US",
    ) -> Session:
        """Open a session: resume it if either tier knows it, else create it.

        ``user_tier`` and ``locale`` apply to a new session; an existing one keeps its own
        (change them with :meth:`Session.update_metadata`).

        Raises:
            ValidationError: a bad id, an unknown tier, or a session of another user.
        """
        session_id = validate_id(session_id or self.ids.new_id(), what="session_id")
        validate_id(user_id, what="user_id")
        try:
            tier = UserTier(user_tier)
        except ValueError:
            raise ValidationError(
                f"unknown user tier {user_tier!r}; use one of {', '.join(UserTier)}"
            ) from None
        now = self.clock.now()
        view = await self.tiers.create(
            SessionMetadata(
                session_id=session_id,
                user_id=user_id,
                user_tier=tier,
                locale=locale,
                created_at=now,
                last_activity=now,
            )
        )
        if view.metadata.user_id != user_id:
            raise ValidationError(
                f"session {session_id!r} belongs to another user; use a new session id"
            )
        return Session(self, view)

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        """A user's sessions, newest first."""
        return await self.tiers.durable.list_sessions(user_id, limit=limit)

    async def purge_user(self, user_id: str) -> int:
        """GDPR erasure: delete everything of the user from every tier.

        In order: pending auto-detection is awaited; each of the user's sessions (listed
        from the durable tier) is deleted from the hot tier; the durable tier purges the
        sessions' turns and records and the user's memories and change log; the search
        index drops every document of the user. Returns how many sessions and memories the
        durable tier deleted. A hot tier that cannot be reached raises (it is not bypassed:
        a purge must not leave copies behind). Writes made for the user while the purge
        runs may survive it; purge when the user has no active session.

        Raises:
            ValidationError: a bad id.
            BackendError: a tier failed; the purge can be run again.
        """
        validate_id(user_id, what="user_id")
        await self.drain()
        deleted = 0
        while True:
            refs = await self.tiers.durable.list_sessions(user_id, limit=_PURGE_PAGE)
            for ref in refs:
                await self.tiers.hot.delete(ref.session_id)
            if len(refs) < _PURGE_PAGE:
                break
            # More sessions than one page lists: drop these from the list to reach the rest.
            for ref in refs:
                await self.tiers.durable.delete_session(ref.session_id)
            deleted += len(refs)
        return deleted + await self.longterm.purge_user(user_id)

    def spawn(self, session_id: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run background work of a session (auto-detection), tracked so that
        :meth:`drain` and :meth:`aclose` wait for it."""
        task = asyncio.get_running_loop().create_task(work, name=f"tiermem-bg-{session_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self) -> None:
        """Wait for the background work started so far (auto-detection of added turns).

        Raises the first unexpected (non-tiermem) error a task raised: that is a bug.
        """
        while self._background:
            await _wait_all(set(self._background))

    def sweeper(self, handoff: Handoff, *, owner: str | None = None) -> ExpirySweeper:
        """An expiry sweeper that hands each expired session to ``handoff`` exactly once."""
        return ExpirySweeper(self.tiers, handoff, owner=owner or f"sweeper-{self.ids.new_id()}")

    def prepare_turn(self, item: TurnInput) -> NewTurn:
        """Count tokens, extract entities and score importance: the pure part of adding."""
        if item.role not in ("user", "assistant"):
            raise ValidationError(f"role must be 'user' or 'assistant', got {item.role!r}")
        blocks = _blocks(item.content)
        if not blocks:
            raise ValidationError("a turn needs at least one content block")
        entities = self.entities.extract(text_of(blocks))
        metadata = dict(item.metadata)
        importance = item.importance
        if importance is None:
            scored = self.importance.score(item.role, blocks, entities=entities)
            importance = scored.score
            metadata.setdefault("importance_reason", scored.reason)
        return NewTurn.model_validate(
            {
                "role": item.role,
                "content": blocks,
                "timestamp": item.timestamp or self.clock.now(),
                "token_count": self.tokens.count_blocks(blocks),
                "importance": importance,
                "pinned": item.pinned,
                "agent_name": item.agent_name,
                "intent": item.intent,
                "latency_ms": item.latency_ms,
                "entities": entities,
                "metadata": metadata,
            }
        )

    async def aclose(self) -> None:
        """Wait for background work, then close long-term memory (index, recaller) and the
        stores."""
        try:
            await self.drain()
        finally:
            await self.access.aclose()
            await self.longterm.aclose()
            await self.tiers.hot.aclose()
            await self.tiers.durable.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Session:
    """A handle on one session. Cheap; holds a cached view, never the truth."""

    def __init__(self, service: MemoryService, view: SessionView) -> None:
        self._service = service
        self._tiers = service.tiers
        self._view = view
        self._hot_hits = 1 if view.source == "hot" else 0
        self._reloads = 1 if view.source == "reload" else 0
        self._detections: set[asyncio.Task[None]] = set()
        self._detect_order = asyncio.Lock()  # FIFO: detections run in turn order

    @property
    def id(self) -> str:
        return self._view.metadata.session_id

    @property
    def user_id(self) -> str:
        return self._view.metadata.user_id

    def _remember(self, view: SessionView) -> SessionView:
        self._view = view
        self._hot_hits += view.source == "hot"
        self._reloads += view.source == "reload"
        return view

    # -- turns ------------------------------------------------------------------------------

    async def add_turn(self, role: str, content: Content, **options: Any) -> Turn:
        """Add one turn; returns it with its index once the write policy is satisfied.

        ``options``: timestamp (aware datetime, for imports and replays), importance
        (overrides the scorer), pinned, agent_name, intent, latency_ms, metadata.
        """
        (turn,) = await self.add_turns([TurnInput(role=role, content=content, **options)])
        return turn

    async def add_turns(self, items: Sequence[TurnInput | NewTurn]) -> list[Turn]:
        """Add several turns, in one write per tier for every 50 (``MAX_TURNS_PER_APPEND``).

        Each batch of 50 is atomic; a longer list is several batches, in order.
        """
        if not items:
            raise ValidationError("add_turns needs at least one turn")
        prepared = [i if isinstance(i, NewTurn) else self._service.prepare_turn(i) for i in items]
        stored: list[Turn] = []
        for start in range(0, len(prepared), MAX_TURNS_PER_APPEND):
            batch = await self._tiers.append(
                self._view.metadata,
                prepared[start : start + MAX_TURNS_PER_APPEND],
                turn_count_hint=self._view.next_index,
            )
            self._view = replace(
                self._view, next_index=max(self._view.next_index, batch[-1].index + 1)
            )
            stored.extend(batch)
        await self._track_entities(stored)
        if self._service.index_turns:
            self._service.spawn(self.id, self._index_in_background(stored))
        if self._service.auto_detect and any(t.role == "user" for t in stored):
            task = self._service.spawn(self.id, self._detect_in_background(stored))
            self._detections.add(task)
            task.add_done_callback(self._detections.discard)
        return stored

    async def _index_in_background(self, turns: Sequence[Turn]) -> None:
        """Index archived turns for episodic recall (BM25), off the response path."""
        try:
            await self._service.longterm.index.upsert(turn_docs(self.user_id, self.id, turns))
        except TierMemError as exc:
            self._service.index_failures += 1
            logger.warning(
                "indexing turns %s of session %s failed: %s", [t.index for t in turns], self.id, exc
            )

    async def _detect_in_background(self, turns: Sequence[Turn]) -> None:
        async with self._detect_order:
            try:
                await self.remember_from_turns(turns)
            except TierMemError as exc:
                self._service.auto_detect_failures += 1
                logger.warning(
                    "auto-detection for session %s turns %s failed; the turns are stored, "
                    "their memories are not: %s",
                    self.id,
                    [t.index for t in turns],
                    exc,
                )

    async def remember_from_turns(self, turns: Sequence[Turn] | None = None) -> list[MemoryRecord]:
        """Detect memories in user turns (default: every archived turn of the session) and
        write them to long-term memory with provenance ``auto`` (``explicit`` for
        "!remember"), this session and the turn's index. Returns the records written.

        ``add_turn`` calls this in the background when ``auto_detect`` is on; call it
        directly to re-run detection, e.g. after importing turns with it off.
        """
        if turns is None:
            turns = await self.get_turns()
        written: list[MemoryRecord] = []
        for turn in turns:
            if turn.role != "user":
                continue
            text = "\n".join(b.text for b in turn.content if isinstance(b, TextBlock))
            drafts = self._service.detector.detect(text) if text.strip() else ()
            if drafts:
                provenance = Provenance(
                    source="auto", session_id=self.id, turn_indexes=(turn.index,)
                )
                written += await self._service.longterm.remember_detected(
                    self.user_id, drafts, provenance=provenance
                )
        return written

    async def _track_entities(self, turns: Sequence[Turn]) -> None:
        """A new value of an entity kind replaces the old one (seed 001)."""
        now = self._service.clock.now()
        changed: dict[str, ActiveEntity] = {}
        for turn in turns:
            for entity in turn.entities:
                held = changed.get(entity.kind) or self._view.entities.get(entity.kind)
                if held is None or held.value != entity.value:
                    changed[entity.kind] = ActiveEntity(
                        kind=entity.kind,
                        value=entity.value,
                        turn_index=turn.index,
                        updated_at=now,
                    )
        if changed:
            await self._tiers.update_entities(
                self._view.metadata, changed, turn_count_hint=self._view.next_index
            )
            self._view.entities.update(changed)

    async def view(self) -> SessionView:
        """The session now: hot window, metadata, entities, state (reloads on a hot miss)."""
        view = await self._tiers.view(self.id)
        if view is None:
            raise_gone(self.id)
        return self._remember(view)

    async def history(self) -> tuple[Turn, ...]:
        """The hot window of recent turns, oldest first."""
        return (await self.view()).turns

    async def get_turn(self, index: int) -> Turn:
        """Any archived turn by index. Raises NotFoundError if there is none."""
        return await self._tiers.durable.get_turn(self.id, index)

    async def get_turns(self, start: int = 0, end: int | None = None) -> list[Turn]:
        """Archived turns with ``start <= index < end``."""
        return await self._tiers.durable.get_turns(self.id, start, end)

    async def redact_turn(self, index: int) -> Turn:
        """Replace a turn's content in every tier; its slot (index, timestamp) stays."""
        redacted = await self._tiers.redact(self.id, index)
        await self._service.longterm.index.remove(self.user_id, [turn_doc_id(self.id, index)])
        return redacted

    # -- metadata, entities, state ----------------------------------------------------

    async def metadata(self) -> SessionMetadata:
        return (await self.view()).metadata

    async def update_metadata(self, **changes: Any) -> SessionMetadata:
        """Change metadata fields (compare-and-set with retry, so two devices never lose an
        update). ``attributes`` is merged, not replaced."""
        protected = {"session_id", "user_id", "created_at", "turn_count"} & changes.keys()
        if protected:
            raise ValidationError(f"cannot change {', '.join(sorted(protected))}")

        def change(current: SessionMetadata) -> SessionMetadata:
            update = dict(changes)
            if "attributes" in update:
                update["attributes"] = {**current.attributes, **update["attributes"]}
            return SessionMetadata.model_validate({**current.model_dump(), **update})

        stored = await self._tiers.update_metadata(self.id, change)
        metadata = derive_metadata(stored, self._view.turns, self._view.next_index)
        self._view = replace(self._view, metadata=metadata)
        return metadata

    async def active_entities(self) -> dict[str, ActiveEntity]:
        return (await self.view()).entities

    async def set_entities(
        self, values: Mapping[str, str], *, remove: Collection[str] = ()
    ) -> dict[str, ActiveEntity]:
        """Set active entities by kind (``{"series": "Naruto"}``) and remove others."""
        now = self._service.clock.now()
        upsert = {k: ActiveEntity(kind=k, value=v, updated_at=now) for k, v in values.items()}
        await self._tiers.update_entities(
            self._view.metadata, upsert, remove, turn_count_hint=self._view.next_index
        )
        return await self.active_entities()

    async def get_state(self, name: str) -> StateBlob | None:
        return (await self.view()).state.get(name)

    async def put_state(
        self, name: str, data: Mapping[str, JsonValue], *, expected_version: int | None = None
    ) -> StateBlob:
        """Write a named state blob; ``expected_version`` makes it compare-and-set."""
        return await self._tiers.put_state(
            self._view.metadata,
            name,
            data,
            expected_version=expected_version,
            turn_count_hint=self._view.next_index,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self) -> SessionMetadata:
        """Flush pending writes (auto-detection included) and mark the session closed."""
        while self._detections:
            await _wait_all(set(self._detections))
        return await self._tiers.close(self.id)

    async def clear(self) -> None:
        """Delete the session from every tier, and its turns from the search index."""
        await self._service.drain()
        count = await self._tiers.durable.next_index(self.id)
        await self._tiers.clear(self.id)
        await self._service.longterm.index.remove(
            self.user_id, [turn_doc_id(self.id, i) for i in range(count)]
        )

    async def stats(self) -> SessionStats:
        view = await self.view()
        oldest = await self._tiers.durable.get_turns(self.id, 0, 1) if view.next_index else []
        now = self._service.clock.now()
        first = oldest[0].timestamp if oldest else (view.turns[0].timestamp if view.turns else None)
        return SessionStats(
            session_id=self.id,
            turn_count=view.next_index,
            hot_turns=len(view.turns),
            hot_tokens=sum(t.token_count for t in view.turns),
            oldest_turn_age_s=(now - first).total_seconds() if first else None,
            expires_at=view.expires_at,
            hot_hits=self._hot_hits,
            reloads=self._reloads,
            served_from=view.source,
        )


_PURGE_PAGE = 500


def _default_longterm(
    durable: DurableStore,
    index: SearchIndex | None,
    *,
    clock: Clock,
    ids: IdFactory,
    tokens: TokenCounter,
    embedder: Embedder | None,
) -> tuple[LongTermMemory, KnowledgeBase, AccessTracker]:
    """Long-term memory, knowledge documents and access tracking over one durable store and
    one search index. Without an index: a persistent store gets an in-process index warmed
    per user from the store on first query (memories, archived turns, document chunks), the
    in-memory store a plain one."""
    from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
    from tiermem.longterm.recall import Recaller, memory_loader, turn_loader

    warming: WarmingIndex | None = None
    if index is None:
        if Capability.PERSISTENT in durable.capabilities:
            index = warming = WarmingIndex([memory_loader(durable), turn_loader(durable)])
        else:
            index = InProcessIndex()
    knowledge = KnowledgeBase(durable, index, clock=clock, ids=ids, embedder=embedder)
    if warming is not None:
        warming.add_loader(knowledge.indexed_docs)
    access = AccessTracker(durable, clock=clock)
    recaller = Recaller(durable, index, clock=clock, embedder=embedder, access=access)
    recaller.register_resolver("chunk", knowledge.resolve_chunks)
    longterm = LongTermMemory(
        durable,
        index,
        clock=clock,
        ids=ids,
        tokens=tokens,
        embedder=embedder,
        recaller=recaller,
    )
    return longterm, knowledge, access


async def _wait_all(tasks: set[asyncio.Task[None]]) -> None:
    """Wait for every task; then raise the first error that is not a TierMemError (those
    were logged and counted by the task itself)."""
    if not tasks:
        return
    await asyncio.wait(tasks)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


def raise_gone(session_id: str) -> NoReturn:
    raise NotFoundError(f"session {session_id!r} no longer exists (cleared or purged)")
