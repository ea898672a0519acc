"""MemoryService: the one API every interface (SDK, CLI, REST, MCP) calls.

::

    async with MemoryService.from_settings() as memory:        # embedded: no server
        session = await memory.session("s-1", user_id="u-1", user_tier="vip")
        turn = await session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
        history = await session.history()                      # the hot window

Adding a turn counts its tokens, scores its importance and extracts its entities with rules
(no LLM on this path), then writes it through the tiers (see :mod:`tiermem.tiers.tiered`).
One session's handle is :class:`tiermem.session.Session`.

Long-term memory (:attr:`MemoryService.longterm`) is fed from user turns by auto-detection
(:mod:`tiermem.longterm.detect`, rules only), and archived turns are indexed for episodic
recall. Both run **off the response path** on :attr:`MemoryService.background`
(:mod:`tiermem.background`): bounded (a full queue slows ``add_turn`` down rather than
growing), in turn order per session (so "I prefer seinen" then "I prefer shonen" ends at
shonen). :meth:`Session.close` and :meth:`Session.clear` wait for their session's jobs,
:meth:`MemoryService.purge_user` for its user's, :meth:`MemoryService.drain` and
:meth:`MemoryService.aclose` for all. A failed detection or indexing write is logged and
counted (``auto_detect_failures``, ``index_failures``), never raised into ``add_turn``.
Turn detection off with ``MemoryService(..., auto_detect=False)``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC
from types import TracebackType
from typing import Any, Self

from pydantic import ValidationError as PydanticValidationError

from tiermem.background import BackgroundWork
from tiermem.clock import Clock, IdFactory, SystemClock, UlidFactory
from tiermem.errors import ValidationError
from tiermem.extraction.entities import EntityExtractor, RuleEntityExtractor
from tiermem.extraction.plain_analysis import analyse_plain_text
from tiermem.extraction.turn_analysis import (
    TurnAnalysis,
    analyse_text_block,
    analyse_turn,
    analyse_turn_async,
    is_large_turn,
)
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.detect import MemoryDetector, RuleMemoryDetector
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.memory import LongTermMemory
from tiermem.models import NewTurn, SessionMetadata, SessionRef, TextBlock, UserTier
from tiermem.models.base import shared_fields
from tiermem.models.shape import check_shape
from tiermem.models.turns import TURN_SCHEMA_VERSION
from tiermem.policies.importance import ImportanceScorer, RuleImportanceScorer
from tiermem.policies.ttl import HybridTtl, TtlPolicy
from tiermem.session import (
    AFTER_APPEND,
    Session,
    SessionStats,
    TurnInput,
    after_append_batch,
    check_turn_fields,
    content_blocks,
    invalid_turn,
)
from tiermem.session_context import ContextCache
from tiermem.settings import TierMemSettings
from tiermem.store.contract import DurableStore, HotStore
from tiermem.store.keys import validate_id
from tiermem.summaries.models import SessionSummarizer, StructuredExtractor
from tiermem.summaries.rolling import SummaryPolicy
from tiermem.summaries.rollup import RollupPolicy
from tiermem.text_caches import forget_texts
from tiermem.tiers.config import SessionTierConfig
from tiermem.tiers.sweeper import ExpirySweeper, Handoff
from tiermem.tiers.tiered import TieredSessionStore, TierMetrics
from tiermem.tokens import TiktokenCounter, TokenCounter
from tiermem.tools import SharedBreakers, ToolDispatcher, ToolRegistry

__all__ = ["MemoryService", "Session", "SessionStats", "TurnInput"]

logger = logging.getLogger(__name__)

_TEXT_FIELDS = shared_fields(("text",))
"""The fields set of a text block built from a string (``TextBlock(text=...)``'s)."""


MAX_INDEX_LINGER = 1.0
"""The longest ``index_linger`` (seconds): a lingering batch holds its background lane."""


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
        index_linger: float = AFTER_APPEND.linger,
        background: BackgroundWork | None = None,
        summarizer: SessionSummarizer | None = None,
        extractor: StructuredExtractor | None = None,
        summary_policy: SummaryPolicy | None = None,
        auto_summarize: bool = True,
        rollup_policy: RollupPolicy | None = None,
    ) -> None:
        if isinstance(index_linger, bool) or not 0 <= index_linger <= MAX_INDEX_LINGER:
            # Checked before anything is built: nothing is left open by a bad value.
            raise ValueError(
                f"index_linger must be 0..{MAX_INDEX_LINGER} seconds, got {index_linger!r}: "
                "it is how long a short batch of background index writes waits for more"
            )
        self.clock = clock or SystemClock()
        self.ids = ids or UlidFactory()
        self.tokens = tokens or TiktokenCounter()
        self.context_cache = ContextCache(self.tokens)
        """What ``Session.context`` keeps between calls (summary sections, token counts);
        bounded, ``context_cache.shrink()`` empties it."""
        self.importance = importance or RuleImportanceScorer()
        self.entities = entities or RuleEntityExtractor()
        self.tiers = TieredSessionStore(
            hot, durable, clock=self.clock, ttl_policy=ttl_policy or HybridTtl(), config=config
        )
        from tiermem.composition import build_longterm

        self.longterm, knowledge, access = build_longterm(
            durable,
            index,
            longterm=longterm,
            clock=self.clock,
            ids=self.ids,
            tokens=self.tokens,
            embedder=embedder,
            turn_retention=self.tiers.config.durable_ttl,
        )
        """Long-term user memory (remember, preferences, recall, forget) over ``durable``."""
        self.knowledge = knowledge
        """Knowledge documents (txt, md, pdf, docx) per user, recalled as ``chunk`` hits."""
        self.access = access
        """Recall hits counted in memory, written back in batches off the request path."""
        self.index_turns = index_turns
        """Index archived turns for episodic recall (``recall(scope=("turn",))``)."""
        self.after_append = after_append_batch(index_linger)
        """The batch kind of this service's background work after an append (indexing,
        detection). Its ``linger`` (``index_linger``, seconds; setting ``index_linger_ms``) is
        how long a short batch waits for more turns before its one index write: 5 ms by
        default, which merges a busy process's turns; where turns come tens of ms apart,
        each goes alone, and a longer linger merges them at the cost of that much more lag
        before a turn is searchable or its memories detected (docs/decisions.md, "Index
        write linger"). ``drain`` and the scoped waits cut it short."""
        self.index_failures = 0
        """Turn-indexing writes that failed (logged); the turns themselves were written."""
        self.auto_detect = auto_detect
        self.detector: MemoryDetector = detector or RuleMemoryDetector()
        self.auto_detect_failures = 0
        """Auto-detection writes that failed (logged); the turns themselves were written."""
        self.background = background or BackgroundWork()
        """Bounded, per-session-ordered background jobs (indexing, detection)."""
        # -- summaries (docs/summaries.md) --------------------------------------------------
        from tiermem.composition import build_summaries

        self.summaries, self.handoff, self.rollup = build_summaries(
            durable,
            self.longterm,
            self.background,
            clock=self.clock,
            tokens=self.tokens,
            summarizer=summarizer,
            extractor=extractor,
            policy=summary_policy,
            rollup_policy=rollup_policy,
        )
        """Rolling summaries and structured memory: jobs, records, watermarks, stats."""
        self.auto_summarize = auto_summarize
        """Queue a summarization pass after ``add_turns`` when one is due (off the response
        path); off, passes run only when a caller waits for them."""

    @classmethod
    def from_settings(
        cls, settings: TierMemSettings | None = None, *, clock: Clock | None = None, **engines: Any
    ) -> MemoryService:
        """Build the stores, search index and embedder the settings name (default: in-process
        hot tier, SQLite durable tier with a SQLiteIndex in the same file, no embeddings).
        ``engines`` override any constructor argument. See :mod:`tiermem.composition`."""
        from tiermem.composition import open_service

        return open_service(settings or TierMemSettings(), clock=clock, **engines)

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
        if session_id is None:
            session_id = self.ids.new_id()
        session_id = validate_id(session_id, what="session_id")
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
        return Session(self, view)

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        """A user's sessions, newest first."""
        validate_id(user_id, what="user_id")
        return await self.tiers.list_sessions(user_id, limit=limit)

    async def purge_user(self, user_id: str) -> int:
        """GDPR erasure: delete everything of the user from every tier.

        In order: pending auto-detection is awaited; each of the user's sessions (listed
        from the durable tier) is deleted from the hot tier, and this process forgets what
        it kept of it; the durable tier purges the sessions' turns and records and the
        user's memories and change log; the search index drops every document of the user;
        the process's caches keyed by text are emptied
        (:func:`~tiermem.text_caches.forget_texts`; other processes keep theirs until they
        evict the text). Returns how many sessions and memories the durable tier deleted.
        A hot tier that cannot be reached raises (it is not bypassed: a purge must not leave
        copies behind). Writes made for the user while the purge
        runs may survive it; purge when the user has no active session.

        Raises:
            ValidationError: a bad id.
            BackendError: a tier failed; the purge can be run again.
        """
        validate_id(user_id, what="user_id")
        await self.background.wait_for(user_id=user_id)
        deleted = await self.tiers.forget_user_sessions(user_id, forget=self._forget_session)
        deleted += await self.longterm.purge_user(user_id)
        forget_texts()
        return deleted

    def _forget_session(self, session_id: str) -> None:
        """Drop what this process keeps of a deleted session: the summary jobs' records,
        watermark and turns, and the context cache's entry (bounded caches, but a purged
        user's facts must not stay in memory until they are evicted)."""
        self.summaries.forget(session_id)
        self.context_cache.drop(session_id)

    async def roll_up(self, user_id: str) -> int:
        """Roll the user's older session summaries into weekly and monthly ones (run after
        every handoff too); returns how many records were written. See
        :mod:`tiermem.summaries.rollup`.

        Raises:
            ValidationError: a bad id.
            BackendError: the durable tier failed; run it again.
        """
        validate_id(user_id, what="user_id")
        return await self.rollup.roll_up(user_id)

    async def drain(self) -> None:
        """Wait for the background work submitted so far (indexing, detection).

        Raises:
            ExceptionGroup: every job that failed unexpectedly (a bug, not a backend error:
                those are logged and counted by the job itself).
        """
        await self.background.drain()

    def tools(self, registry: ToolRegistry) -> ToolDispatcher:
        """A dispatcher for ``registry``'s tools whose circuit breakers live in the hot
        tier's shared keyspace, so every worker of the deployment sees the same breakers
        (one read per check; see :mod:`tiermem.tools`)."""
        breakers = SharedBreakers(self.tiers.hot, clock=self.clock)
        return ToolDispatcher(registry, breakers, clock=self.clock, ids=self.ids)

    def sweeper(self, handoff: Handoff | None = None, *, owner: str | None = None) -> ExpirySweeper:
        """An expiry sweeper that hands each expired session to ``handoff`` (default:
        :attr:`handoff`, the session summary and preferences into long-term memory)."""
        return ExpirySweeper(
            self.tiers,
            handoff or self.handoff,
            owner=owner or f"sweeper-{self.ids.new_id()}",
            index=self.longterm.index,
        )

    async def prepare_turns(
        self, items: Sequence[TurnInput | NewTurn | Mapping[str, Any]]
    ) -> list[NewTurn]:
        """:meth:`prepare_turn` for each item that is not prepared yet, with the analysis of
        a large turn (over ``LARGE_TURN_CHARS`` characters) in a worker thread so that the
        event loop keeps serving other sessions; prepared ones are shape-checked too."""
        return [turn for turn, _ in await self.analyse_turns(items)]

    async def analyse_turns(
        self, items: Sequence[TurnInput | NewTurn | Mapping[str, Any]]
    ) -> list[tuple[NewTurn, TurnAnalysis | None]]:
        """:meth:`prepare_turns`, keeping each turn's analysis (None for an item that came
        prepared): its normalised text, and for a large turn its search terms, counted in
        the worker thread, so indexing and detection never normalise it again."""
        analysed: list[tuple[NewTurn, TurnAnalysis | None]] = []
        for position, item in enumerate(items):
            if isinstance(item, NewTurn):
                check_shape(item.content, what="turn content")
                check_shape(item.metadata, what="turn metadata")
                analysed.append((item, None))
                continue
            if not isinstance(item, TurnInput):
                item = _turn_input(item, position)
            blocks = self._checked_blocks(item)
            analysis = await analyse_turn_async(
                item.role,
                blocks,
                tokens=self.tokens,
                entities=self.entities,
                importance=self.importance if item.importance is None else None,
                index_terms=self.index_turns and is_large_turn(blocks),
            )
            analysed.append((self._new_turn(item, blocks, analysis), analysis))
        return analysed

    def analyse_text_turn(self, role: str, text: str) -> tuple[NewTurn, TurnAnalysis]:
        """:meth:`analyse_turns` of one turn given as a role and a string of at most
        ``LARGE_TURN_CHARS`` characters, and no other option: the path of every plain
        ``add_turn``, without the :class:`TurnInput` and the per-item dispatch.

        The same checks and the same turn as the general path (``content_blocks`` and
        ``check_shape`` of one text block amount to the text's surrogate test).

        Raises:
            ValidationError: a bad role, or a lone surrogate in the text.
        """
        if role not in ("user", "assistant"):
            raise ValidationError(f"role must be 'user' or 'assistant', got {role!r}")
        if not text.isascii():
            check_shape(text, what="turn content")
        # A str is all a text block validates: no second validation.
        blocks = (TextBlock.trusted({"type": "text", "text": text}, _TEXT_FIELDS),)
        tokens, entities, scorer = self.tokens, self.entities, self.importance
        if (
            type(tokens) is TiktokenCounter
            and type(entities) is RuleEntityExtractor
            and type(scorer) is RuleImportanceScorer
        ):
            # The built-in engines: the same analysis, inlined (plain_analysis says why).
            analysis = analyse_plain_text(role, blocks, tokens, entities, scorer)
        else:
            analysis = analyse_text_block(role, blocks, tokens, entities, scorer)
        score = analysis.importance
        assert score is not None  # a scorer was given
        importance = score.score
        if not 0.0 <= importance <= 1.0:  # a custom scorer's score is checked still
            return self._new_turn(TurnInput(role=role, content=text), blocks, analysis), analysis
        turn = NewTurn.trusted(
            {
                "schema_version": TURN_SCHEMA_VERSION,
                "role": role,
                "content": blocks,
                "timestamp": self.clock.now().astimezone(UTC),  # as validation would
                "token_count": analysis.token_count,
                "importance": importance,
                "pinned": False,
                "agent_name": None,
                "intent": None,
                "latency_ms": None,
                "entities": analysis.entities,
                "redacted": False,
                "metadata": {"importance_reason": score.reason},
            }
        )
        return turn, analysis

    def prepare_turn(self, item: TurnInput) -> NewTurn:
        """Count tokens, extract entities and score importance: the pure part of adding.

        Raises:
            ValidationError: a bad role, no content, or content of a bad shape.
        """
        blocks = self._checked_blocks(item)
        analysis = analyse_turn(
            item.role,
            blocks,
            tokens=self.tokens,
            entities=self.entities,
            importance=self.importance if item.importance is None else None,
        )
        return self._new_turn(item, blocks, analysis)

    @staticmethod
    def _checked_blocks(item: TurnInput) -> tuple[Any, ...]:
        if item.role not in ("user", "assistant"):
            raise ValidationError(f"role must be 'user' or 'assistant', got {item.role!r}")
        blocks = content_blocks(item.content)
        if not blocks:
            raise ValidationError("a turn needs at least one content block")
        check_shape(blocks, what="turn content")
        check_shape(item.metadata, what="turn metadata")
        return blocks

    def _new_turn(
        self, item: TurnInput, blocks: tuple[Any, ...], analysis: TurnAnalysis
    ) -> NewTurn:
        metadata = dict(item.metadata)
        importance = item.importance
        if analysis.importance is not None:
            importance = analysis.importance.score
            metadata.setdefault("importance_reason", analysis.importance.reason)
        if (
            item.timestamp is None
            and item.latency_ms is None
            and item.importance is None
            and importance is not None
            and 0.0 <= importance <= 1.0  # a custom scorer's score is checked still
            and all(type(block) is TextBlock for block in blocks)
        ):
            # Every field is already checked (the edge validated the input, the rest is the
            # library's own): no second validation of a plain text turn.
            return NewTurn.trusted(
                {
                    "schema_version": TURN_SCHEMA_VERSION,
                    "role": item.role,
                    "content": blocks,
                    "timestamp": self.clock.now().astimezone(UTC),  # as validation would
                    "token_count": analysis.token_count,
                    "importance": importance,
                    "pinned": item.pinned,
                    "agent_name": item.agent_name,
                    "intent": item.intent,
                    "latency_ms": None,
                    "entities": analysis.entities,
                    "redacted": False,
                    "metadata": metadata,
                }
            )
        try:
            return NewTurn.model_validate(
                {
                    "role": item.role,
                    "content": blocks,
                    "timestamp": item.timestamp or self.clock.now(),
                    "token_count": analysis.token_count,
                    "importance": importance,
                    "pinned": item.pinned,
                    "agent_name": item.agent_name,
                    "intent": item.intent,
                    "latency_ms": item.latency_ms,
                    "entities": analysis.entities,
                    "metadata": metadata,
                }
            )
        except PydanticValidationError as exc:
            raise invalid_turn(exc) from exc

    async def aclose(self) -> None:
        """Wait for background work, then close long-term memory (index, recaller) and the
        stores."""
        try:
            await self.background.aclose()
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


def _turn_input(item: object, position: int) -> TurnInput:
    """A turn given as a mapping (``{"role": ..., "content": ...}``, the other
    :class:`TurnInput` fields optional), validated; anything else is refused by name."""
    if not isinstance(item, Mapping):
        raise ValidationError(
            f"turn {position} must be a TurnInput, a NewTurn or a mapping with role and "
            f"content; got {type(item).__name__}"
        )
    check_turn_fields(item.keys(), what=f"field of turns[{position}]")
    try:
        return TurnInput.model_validate(item)
    except PydanticValidationError as exc:
        raise invalid_turn(exc, within=(f"turns[{position}]",)) from exc
