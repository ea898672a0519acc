"""Session: one conversation's handle over the :class:`~tiermem.service.MemoryService`.

A handle is cheap and holds a cached view of the session, never the truth: every read goes
through the tiers (hot, reloaded from durable on a miss). Adding a turn prepares it (tokens,
importance, entities: :meth:`MemoryService.prepare_turns`), writes it through the tiers,
tracks its entities, and queues its indexing and memory detection as background work
(:mod:`tiermem.background`) off the response path.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import Field, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from tiermem.background import Batch
from tiermem.clock import Clock
from tiermem.errors import NotFoundError, TierMemError, ValidationError
from tiermem.extraction.turn_analysis import LARGE_TURN_CHARS, TurnAnalysis
from tiermem.longterm._detect_rules import (
    EN_NEGATED_TAIL,
    EN_SWITCH,
    JA_CONTRAST,
    JA_SWITCH,
)
from tiermem.longterm.detect import split_sentences
from tiermem.longterm.recall import turn_docs
from tiermem.longterm.text import text_term_counts
from tiermem.models import (
    ActiveEntity,
    ContentBlock,
    JsonValue,
    MemoryRecord,
    Message,
    NewTurn,
    Provenance,
    SessionMetadata,
    StateBlob,
    TextBlock,
    ToolResultBlock,
    Turn,
)
from tiermem.models.base import FrozenModel, problems
from tiermem.models.shape import check_shape
from tiermem.policies.phrases import TextView
from tiermem.policies.turn_text import TurnText
from tiermem.session_context import (
    OPENING_REACH,
    RECORD_KINDS,
    UNKNOWN,
    SummarySections,
    latest_opening,
    needs_opening,
    opening_message,
)
from tiermem.store.codec import check_idempotency_key
from tiermem.store.contract import MAX_TURNS_PER_APPEND, EntityChange
from tiermem.store.keys import validate_id
from tiermem.summaries.structured import ENTITY_SLOTS, SUBJECT_SLOTS, wrong_regions
from tiermem.text_caches import forget_texts
from tiermem.tiers.tiered import SessionView, derive_metadata, rebase_entity_change

if TYPE_CHECKING:
    from tiermem.context import Allocation, ContextWindow
    from tiermem.context.optimize import OptimizePolicy
    from tiermem.longterm.context import UserContext
    from tiermem.longterm.hits import RecallHit
    from tiermem.longterm.index import IndexedDoc
    from tiermem.longterm.memory import LongTermMemory
    from tiermem.models.convert import SystemBlock
    from tiermem.service import MemoryService
    from tiermem.state import StateCoordinator
    from tiermem.summaries.jobs import SessionSummaries, Watermarks
    from tiermem.summaries.models import StructuredMemory

__all__ = [
    "DEFAULT_CONTEXT_BUDGET",
    "Content",
    "Session",
    "SessionStats",
    "TurnInput",
    "content_blocks",
]

logger = logging.getLogger(__name__)

Content = str | Message | Sequence[ContentBlock | Mapping[str, Any]]

DEFAULT_CONTEXT_BUDGET = 8_000
"""Tokens :meth:`Session.context` assembles when given neither a budget nor a model (seed
001's working point: a summary, a few turns and the static prefix fit comfortably)."""
RECALL_K = 8
"""Per-turn recall hits :meth:`Session.context` asks for; the budget decides how many stay."""


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


_TURN_FIELDS = frozenset(TurnInput.model_fields)


def check_turn_fields(names: Collection[str], *, what: str) -> None:
    """Refuse a turn field :class:`TurnInput` does not have (a typo would otherwise be
    dropped without a word)."""
    unknown = set(names) - _TURN_FIELDS
    if unknown:
        raise ValidationError(
            f"unknown {what} {', '.join(sorted(map(repr, unknown)))}; a turn has "
            f"{', '.join(sorted(_TURN_FIELDS))} (put your own values in metadata)"
        )


_PLAIN_TURN: dict[str, Any] = {
    name: field.get_default(call_default_factory=True)
    for name, field in TurnInput.model_fields.items()
    if name not in ("role", "content")
}
"""A :class:`TurnInput`'s defaults (``metadata`` gets a dict of its own per turn)."""


_KIND_OF_SLOT = {slot: kind for kind, slot in ENTITY_SLOTS.items()}
SUBJECT_KINDS = frozenset(_KIND_OF_SLOT.get(slot, slot) for slot in SUBJECT_SLOTS)
"""The active entity kinds an explicit change of subject expires (seed 001: "forget that,
show me Naruto"): the product the user was asking about, the same kinds structured
memory expires (:data:`~tiermem.summaries.structured.SUBJECT_SLOTS`)."""


def switches_subject(turn: NewTurn, read: TurnText | None) -> bool:
    """Whether ``turn`` is a user's explicit change of subject: a sentence of what they
    wrote (text blocks, not tool results) opens with "forget that", "never mind",
    "scratch that", "let's switch to"... or 忘れて, もういい, やめて (the rules structured
    memory reads a switch with). ``read``: the turn's analysed text, if at hand."""
    if turn.role != "user":
        return False
    said = (read or TurnText.of_blocks(turn.content)).said
    if not (EN_SWITCH.opens(said.folded) or JA_SWITCH.opens(said.normal)):
        return False  # most turns: none of the rules' words
    return any(
        EN_SWITCH.match(sentence.lower()) or JA_SWITCH.match(sentence)
        for sentence in split_sentences(said.normal)
    )


def _negated_entities(read: TurnText, extractor: object) -> frozenset[tuple[str, str]]:
    """The ``(kind, value)`` pairs a user's text names only as the wrong ones: inside "not
    …", "instead of …", "rather than …" (to the next comma) or before じゃなくて/ではなく, as
    structured memory reads a correction; a value also named outside such a part is not
    wrong. Empty when no sentence holds those words, or when the service's entity
    extractor cannot say where it found a value (only the rule extractor can)."""
    said = read.said
    find = getattr(extractor, "find", None)
    if find is None or not (EN_NEGATED_TAIL.opens(said.folded) or JA_CONTRAST.opens(said.normal)):
        return frozenset()  # most turns
    wrong: set[tuple[str, str]] = set()
    right: set[tuple[str, str]] = set()
    for sentence in split_sentences(said.normal):
        folded = TextView(sentence).folded
        regions = wrong_regions(sentence, folded)
        for start, end, kind, value in find(sentence):
            inside = any(a <= start and end <= b for a, b in regions)
            (wrong if inside else right).add((kind, value))
    return frozenset(wrong - right)


def _merged(entities: Mapping[str, ActiveEntity], change: EntityChange) -> dict[str, ActiveEntity]:
    """``entities`` after ``change`` (remove first, then upsert: as the stores merge)."""
    if not change.remove:
        return {**entities, **change.upsert}
    kept = {k: v for k, v in entities.items() if k not in change.remove}
    return {**kept, **change.upsert}


def _listed_kinds(turn: NewTurn) -> set[str] | None:
    """The entity kinds a tool result in ``turn`` names with more than one value (None
    when the turn holds no tool result, or names each kind once).

    A search's or a catalogue's output lists candidates: the 34 series a search found
    are not the series the user is talking about, and the last row is no better a guess
    than the first. So such a kind keeps the value it had: the active entities are
    injected as "use these unless overridden", and a wrong one misleads every later
    turn. A tool result naming one value (the order a tool just created) still sets it,
    and a user's own turn still switches with its last mention ("not Berserk, show me
    Naruto")."""
    if not any(type(block) is ToolResultBlock for block in turn.content):
        return None
    first: dict[str, str] = {}
    listed: set[str] = set()
    for entity in turn.entities:
        if first.setdefault(entity.kind, entity.value) != entity.value:
            listed.add(entity.kind)
    return listed or None


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


def invalid_turn(
    exc: PydanticValidationError, *, within: tuple[str, ...] = (), hint: str = ""
) -> ValidationError:
    """tiermem's ValidationError for a turn pydantic refused, naming each bad field (a
    caller catches one error type, never pydantic's); ``within``: the field the errors'
    locations are in."""
    return ValidationError(
        f"the turn is not valid: {problems(exc, within=within, whole='turn')}{hint}"
    )


_BLOCKS: TypeAdapter[tuple[ContentBlock, ...]] = TypeAdapter(tuple[ContentBlock, ...])
_BLOCKS_HINT = (
    ' (blocks are tiermem.models content blocks: {"type": "text", "text": ...}, a'
    ' "tool_result" holds a list of such blocks; tiermem.models.convert reads provider'
    " formats)"
)


def invalid_fields(what: str, exc: PydanticValidationError) -> ValidationError:
    """tiermem's ValidationError for ``what`` (metadata, an entity) pydantic refused."""
    return ValidationError(f"the {what} is not valid: {problems(exc, whole=what)}")


_PROTECTED_METADATA = frozenset(
    {"schema_version", "session_id", "user_id", "created_at", "turn_count"}
)
_CHANGEABLE_METADATA = SessionMetadata.model_fields.keys() - _PROTECTED_METADATA


def content_blocks(content: Content) -> tuple[Any, ...]:
    """``content`` as content blocks: a string is one text block; blocks given as mappings
    (``{"type": "text", "text": ...}``) are parsed into block models here, at the edge, so
    that token counting, entity rules and importance read their text (a mapping read as
    it is has none: the turn would count 0 tokens).

    Raises:
        ValidationError: content of another type, or a block that is not valid (each bad
            field named).
    """
    if isinstance(content, str):
        return (TextBlock(text=content),)
    if isinstance(content, Message):
        return content.content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        blocks = tuple(content)
        if all(isinstance(block, FrozenModel) for block in blocks):
            return blocks  # block models (their type is checked where the turn is built)
        check_shape(blocks, what="turn content")  # its size and depth, before parsing it
        try:
            return _BLOCKS.validate_python(blocks)
        except PydanticValidationError as exc:
            raise invalid_turn(exc, within=("content",), hint=_BLOCKS_HINT) from exc
    raise ValidationError(
        "content must be a string, a Message, or a sequence of content blocks; got "
        f"{type(content).__name__}"
    )


class Session:
    """A handle on one session. Cheap; holds a cached view, never the truth."""

    def __init__(self, service: MemoryService, view: SessionView) -> None:
        self._service = service
        self._tiers = service.tiers
        self._view = view
        # A handle's session and owner never change: kept apart from the view, whose
        # metadata a hot read derives only when asked (SessionView).
        metadata = view.stored_metadata
        self._id = metadata.session_id
        self._user_id = metadata.user_id
        self._hot_hits = 1 if view.source == "hot" else 0
        self._reloads = 1 if view.source == "reload" else 0
        self._stored_since: int | None = None
        """The last turn stored through this handle since a read last found the session."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def user_id(self) -> str:
        return self._user_id

    @property
    def clock(self) -> Clock:
        """The service's clock: state deadlines and timestamps use it, never the wall clock."""
        return self._service.clock

    def _remember(self, view: SessionView) -> SessionView:
        self._view = view
        self._stored_since = None
        self._hot_hits += view.source == "hot"
        self._reloads += view.source == "reload"
        return view

    # -- turns ------------------------------------------------------------------------------

    async def add_turn(
        self, role: str, content: Content, *, idempotency_key: str | None = None, **options: Any
    ) -> Turn:
        """Add one turn; returns it with its index once the write policy is satisfied.

        ``options``: timestamp (aware datetime, for imports and replays), importance
        (overrides the scorer), pinned, agent_name, intent, latency_ms, metadata.

        ``idempotency_key`` makes a retry safe (after a client timeout, say): a second call
        with the same key returns the turn the first one stored instead of adding it again,
        for as long as the session lives.

        Raises:
            ValidationError: bad content, role or key.
        """
        if (
            not options
            and type(role) is str
            and type(content) is str
            and len(content) <= LARGE_TURN_CHARS
        ):
            # Every plain turn's path: a role and a string, analysed in place.
            check_idempotency_key(idempotency_key)
            turn, analysis = self._service.analyse_text_turn(role, content)
            turns = await self._append_one(turn, analysis, idempotency_key)
            if not turns:
                raise NotFoundError(
                    f"the turn added with idempotency key {idempotency_key!r} has expired"
                )
            return turns[0]
        if not options and type(role) is str:
            # What validation would build (a str role, any content: the blocks are checked
            # when the turn is analysed), without it: this is every plain turn's path.
            item = TurnInput.trusted(
                {"role": role, "content": content, **_PLAIN_TURN, "metadata": {}},
                {"role", "content"},
            )
        else:
            check_turn_fields(options.keys(), what="add_turn option")
            try:
                item = TurnInput(role=role, content=content, **options)
            except PydanticValidationError as exc:
                raise invalid_turn(exc) from exc
        turns = await self.add_turns([item], idempotency_key=idempotency_key)
        if not turns:
            raise NotFoundError(
                f"the turn added with idempotency key {idempotency_key!r} has expired"
            )
        return turns[0]

    async def add_turns(
        self,
        items: Sequence[TurnInput | NewTurn | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> list[Turn]:
        """Add several turns, in one write per tier for every 50 (``MAX_TURNS_PER_APPEND``).
        A turn is a :class:`TurnInput`, a mapping of its fields (``{"role": "user",
        "content": "..."}``) or a prepared :class:`NewTurn`.

        Each batch of 50 is atomic; a longer list is several batches, in order. With
        ``idempotency_key`` each batch is keyed (``key``, then ``key#1``, ``key#2``...), so
        a retry of the whole call adds nothing that was already stored.
        """
        if not items:
            raise ValidationError("add_turns needs at least one turn")
        check_idempotency_key(idempotency_key)
        return await self._append_analysed(
            await self._service.analyse_turns(items), idempotency_key
        )

    async def _append_analysed(
        self,
        analysed: Sequence[tuple[NewTurn, TurnAnalysis | None]],
        idempotency_key: str | None,
    ) -> list[Turn]:
        """Write analysed turns (:meth:`add_turns` after the analysis) and queue their
        background work."""
        stored: list[Turn] = []
        analyses: list[TurnAnalysis | None] = []
        closed_at = self._view.stored_metadata.closed_at
        if closed_at is not None and analysed:
            # Before the appends, as in _append_one: a failed reopen raises with nothing
            # stored (after them, the turns were stored behind the error).
            await self._reopen(closed_at)
        for n, start in enumerate(range(0, len(analysed), MAX_TURNS_PER_APPEND)):
            key = idempotency_key if not n or idempotency_key is None else f"{idempotency_key}#{n}"
            sent = analysed[start : start + MAX_TURNS_PER_APPEND]
            batch_turns = list(map(_first, sent))  # no comprehension frame per turn
            first = self._view.next_index
            reads = [None if a is None else a.text for a in map(_second, sent)]
            change = self._entity_change(batch_turns, first, reads)
            batch = await self._tiers.append(
                self._view.stored_metadata,  # what the tiers read of it is never derived
                batch_turns,
                turn_count_hint=first,
                idempotency_key=key,
                entities=change,
            )
            if batch:
                entities = self._view.entities
                if change is not None:
                    if batch[0].index != first:  # another writer got there first
                        change = rebase_entity_change(change, first, batch[0].index, len(batch))
                    entities = _merged(entities, change)
                self._view = self._view.after_append(
                    max(self._view.next_index, batch[-1].index + 1), entities
                )
            stored.extend(batch)
            # A retry may return fewer turns (some expired): then analyse them again later.
            analyses += map(_second, sent) if len(batch) == len(sent) else [None] * len(batch)
        if stored:
            self._stored_since = stored[-1].index
            await self._after_stored(stored, analyses)
        return stored

    async def _reopen(self, closed_at: datetime) -> None:
        """A turn is being added to the session this handle saw closed (at ``closed_at``):
        it is open again (``closed_at`` cleared in both tiers; one write, on the first turn after
        a close). A close this handle did not see (another ``closed_at``) stands: it came
        after what the handle knew, and the next handoff covers the turn anyway (the
        ``handoff`` record says through which turn it went)."""

        def reopen(current: SessionMetadata) -> SessionMetadata:
            if current.closed_at != closed_at:
                return current
            return current.model_copy(update={"closed_at": None})

        stored = await self._tiers.update_metadata(self._id, reopen)
        view = self._view
        self._view = replace(view, metadata=derive_metadata(stored, view.turns, view.next_index))

    async def _append_one(
        self, turn: NewTurn, analysis: TurnAnalysis | None, idempotency_key: str | None
    ) -> list[Turn]:
        """:meth:`_append_analysed` of one turn (a plain ``add_turn``), without its batch
        loop."""
        view = self._view
        metadata = view.stored_metadata  # what the tiers read of it is never derived
        if metadata.closed_at is not None:
            # Before the append: a failed reopen then raises with nothing stored (after it,
            # the turn was stored behind the error and a retry stored it twice).
            await self._reopen(metadata.closed_at)
            view = self._view
            metadata = view.stored_metadata
            now = None  # the reopen awaited: the write reads the clock again
        else:
            # The turn's timestamp is the service clock's reading that add_turn's analysis
            # took just before, with no await since (analyse_text_turn): the write's
            # reading too (its entities' time, the tiers' expiries), instead of two more
            # (a reading costs more than copying the turn's fields).
            now = turn.timestamp if self._tiers.clock is self._service.clock else None
        first = view.next_index
        # Most turns name no entity and change no subject: no call to find that nothing
        # changed.
        read = None if analysis is None else analysis.text
        if turn.entities or switches_subject(turn, read):
            change = self._entity_change([turn], first, (read,), now)
        else:
            change = None
        stored = await self._tiers.append(
            metadata,
            [turn],
            turn_count_hint=first,
            idempotency_key=idempotency_key,
            entities=change,
            now=now,
        )
        if not stored:
            return stored
        view = self._view  # as _append_analysed: the handle's view after the write
        entities = view.entities
        if change is not None:
            if stored[0].index != first:  # another writer got there first
                change = rebase_entity_change(change, first, stored[0].index, len(stored))
            entities = _merged(entities, change)
        self._view = view.after_append(max(view.next_index, stored[-1].index + 1), entities)
        self._stored_since = stored[-1].index
        await self._after_stored(stored, [analysis] if len(stored) == 1 else [None] * len(stored))
        return stored

    async def _after_stored(self, stored: list[Turn], analyses: list[TurnAnalysis | None]) -> None:
        """Queue the background work of turns just stored (indexing, memory detection) and
        a summary pass when one is due."""
        index = self._service.index_turns
        detect = self._service.auto_detect and (
            stored[0].role == "user"  # one turn: most calls
            if len(stored) == 1
            else any(t.role == "user" for t in stored)
        )
        if index or detect:
            # One background item for both; queued items of any session are merged into
            # one index write (the service's after_append batch), so at 50 sessions it
            # costs one transaction.
            after = _AfterAppend(self, stored, analyses, index=index, detect=detect)
            background = self._service.background
            # Queued without a coroutine when the lane has room (most turns), and without
            # a future until somebody waits for it.
            batch = self._service.after_append
            if not background.queue_batched(self._user_id, self._id, batch, after):
                await background.submit_batched(self._user_id, self._id, batch, after)
        if self._service.auto_summarize:
            await self._queue_summary(stored)

    def _index_docs(self, appends: Sequence[_AfterAppend]) -> list[IndexedDoc]:
        """The recall documents of this session's archived turns of ``appends`` (BM25),
        from the text each turn's analysis normalised (its terms too, for a large turn:
        counted in the worker thread); one call for all of them."""
        turns: list[Turn] = []
        terms: list[dict[str, int] | None] = []
        for append in appends:
            turns += append.turns
            # Fresh counts, given away to the documents (no copy, no type check there).
            terms += [
                None
                if a is None
                else (dict(a.terms) if a.terms is not None else text_term_counts(a.text))
                for a in append.analyses
            ]
        return turn_docs(
            self.user_id,
            self.id,
            turns,
            expires_at=self._tiers.durable_expiry(),
            terms=terms,
            owned_terms=True,
        )

    async def _detect_logged(self, turns: Sequence[Turn], texts: Sequence[TurnText | None]) -> None:
        """Auto-detection of memories, off the response path; the background queue runs a
        session's jobs in order, so later preferences win. Failures are logged and
        counted, never raised."""
        try:
            await self.remember_from_turns(turns, texts=texts)
        except TierMemError as exc:
            self._service.auto_detect_failures += 1
            logger.warning(
                "auto-detection for session %s turns %s failed; the turns are stored, "
                "their memories are not: %s",
                self.id,
                [t.index for t in turns],
                exc,
            )

    async def remember_from_turns(
        self,
        turns: Sequence[Turn] | None = None,
        *,
        texts: Sequence[TurnText | None] | None = None,
    ) -> list[MemoryRecord]:
        """Detect memories in user turns (default: every archived turn of the session) and
        write them to long-term memory with provenance ``auto`` (``explicit`` for
        "!remember"), this session and the turn's index. Returns the records written.

        ``texts`` (one per turn, or None) are the turns' texts as the turn analysis already
        normalised them; missing ones are built from the turns.

        ``add_turn`` calls this in the background when ``auto_detect`` is on; call it
        directly to re-run detection, e.g. after importing turns with it off.
        """
        if turns is None:
            turns = await self.get_turns()
        written: list[MemoryRecord] = []
        detect = self._service.detector.detect
        for i, turn in enumerate(turns):
            if turn.role != "user":
                continue
            text = texts[i] if texts is not None else None
            if text is None:
                text = TurnText.of_blocks(turn.content)
            if not text.said_text.strip():
                continue
            # Rules hold the loop while they run; a pasted document goes to a thread.
            drafts = (
                await asyncio.to_thread(detect, text)
                if len(text.said_text) > LARGE_TURN_CHARS
                else detect(text)
            )
            if drafts:
                provenance = Provenance(
                    source="auto", session_id=self.id, turn_indexes=(turn.index,)
                )
                written += await self._service.longterm.remember_detected(
                    self.user_id, drafts, provenance=provenance
                )
        return written

    def _entity_change(
        self,
        turns: Sequence[NewTurn],
        first: int,
        reads: Sequence[TurnText | None] | None = None,
        now: datetime | None = None,
    ) -> EntityChange | None:
        """What these turns change in the active entities (seed 001's "use these unless
        overridden"): a new value of an entity kind replaces the old one, except

        * where a tool result lists several values of a kind (:func:`_listed_kinds`);
        * a value the user names as the wrong one ("volume 5, not volume 4", "3巻じゃなくて
          4巻": :func:`_negated_entities`);
        * a user's explicit change of subject ("forget that, show me Naruto":
          :func:`switches_subject`) expires the product kinds (:data:`SUBJECT_KINDS`)
          before the turn's own entities are set.

        ``reads``: each turn's analysed text, where at hand (else read again if needed).
        Turn indexes count from ``first``, the index the handle expects the first turn to
        get (the tiers move them if it gets another). ``now``: the service clock's reading
        for this write, if the caller took it (else the clock is read)."""
        held: Mapping[str, ActiveEntity] = self._view.entities
        # A kind's value as of the last entity read, and the turn of its last change: one
        # ActiveEntity is built per changed kind, not per change.
        latest: dict[str, tuple[str, int]] = {}
        removed: set[str] = set()
        for position, turn in enumerate(turns):
            entities = turn.entities
            if turn.role != "user":
                negated: Collection[tuple[str, str]] = ()
            else:
                read = reads[position] if reads is not None else None
                if read is None:
                    read = TurnText.of_blocks(turn.content)
                if switches_subject(turn, read):
                    gone = SUBJECT_KINDS & (held.keys() | latest.keys())
                    if gone:
                        removed |= gone
                        held = {k: v for k, v in held.items() if k not in gone}
                        for kind in gone:
                            latest.pop(kind, None)
                negated = _negated_entities(read, self._service.entities) if entities else ()
            listed = _listed_kinds(turn) if len(entities) > 1 else None
            for entity in entities:
                kind, value = entity.kind, entity.value
                if listed is not None and kind in listed:
                    continue
                if negated and (kind, value) in negated:
                    continue
                pending = latest.get(kind)
                if pending is not None:
                    if pending[0] != value:
                        latest[kind] = (value, first + position)
                    continue
                current = held.get(kind)
                if current is None or current.value != value:
                    latest[kind] = (value, first + position)
        if not latest and not removed:
            return None
        if now is None:
            now = self._service.clock.now()
        # Validated values (the extractor's entity, the clock's aware time).
        changed = {
            kind: ActiveEntity.trusted(
                {"kind": kind, "value": value, "turn_index": index, "updated_at": now}
            )
            for kind, (value, index) in latest.items()
        }
        remove = tuple(sorted(removed - changed.keys()))
        return EntityChange.trusted({"upsert": changed, "remove": remove})

    async def view(self) -> SessionView:
        """The session now: hot window, metadata, entities, state (reloads on a hot miss)."""
        view = await self._tiers.view(self.id)
        if view is None:
            view = await self._found_again()
        return self._remember(view)

    async def _found_again(self) -> SessionView:
        """The session when no tier knows it any more although this handle stored turns
        since a read last found it: its whole retention passed while the handle was kept
        (both tiers forgot the metadata), and the turns went to the archive all the same.
        Its metadata is written again, as ``memory.session()`` does, so reads find the
        session and those turns (before, every read raised NotFoundError until the
        session was opened again). Anything else is gone (cleared or purged): a read never
        brings a session back by itself.

        Raises:
            NotFoundError: the session is gone and this handle stored nothing since.
        """
        stored = self._stored_since
        if stored is None or not await self._tiers.holds_turn(self._id, stored):
            raise_gone(self._id)  # nothing stored since, or cleared or purged after it
        now = self._service.clock.now()
        metadata = self._view.stored_metadata.model_copy(
            update={"created_at": now, "last_activity": now, "closed_at": None}
        )
        await self._tiers.create(metadata)
        view = await self._tiers.view(self._id)
        if view is None:
            raise_gone(self._id)
        return view

    async def history(self) -> tuple[Turn, ...]:
        """The hot window of recent turns, oldest first."""
        # What view() does, without awaiting when the hot tier answers in this process.
        view = self._tiers.view_now(self._id) or await self._tiers.view(self._id)
        if view is None:
            view = await self._found_again()
        return self._remember(view).turns

    async def get_turn(self, index: int) -> Turn:
        """Any archived turn by index. Raises NotFoundError if there is none."""
        return await self._tiers.get_turn(self.id, index)

    async def get_turns(self, start: int = 0, end: int | None = None) -> list[Turn]:
        """Archived turns with ``start <= index < end``."""
        return await self._tiers.get_turns(self.id, start, end)

    async def redact_turn(self, index: int) -> Turn:
        """Replace a turn's content in every tier, the recall index and the session's
        summaries (rebuilt without it on the next pass); its slot (index, timestamp) stays."""
        redacted = await self._tiers.redact(self.id, index)
        # Summaries derived from the turn are reset; the next pass rebuilds them without it.
        # Right after the archive: rewriting the summary records is also what tells every
        # process's context() that a turn it kept (the loop's opening, KnownOpenings) may
        # have changed.
        try:
            await self._service.summaries.redacted(self.id, index)
        finally:
            # Even when the reset failed ("redact again"): the index forgets the words now.
            await self._service.longterm.unindex_turns(self.user_id, self.id, [index])
        # ...and so is what the handoff derived from it (long-term memory, roll-ups).
        await self._service.handoff.redacted(self.user_id, self.id, index, self._tiers.durable_view)
        forget_texts()  # the turn's former text, in the caches of what was read
        return redacted

    # -- metadata, entities, state ----------------------------------------------------

    async def metadata(self) -> SessionMetadata:
        return (await self.view()).metadata

    async def update_metadata(self, **changes: Any) -> SessionMetadata:
        """Change metadata fields (compare-and-set with retry, so two devices never lose an
        update). ``attributes`` is merged, not replaced."""
        protected = _PROTECTED_METADATA & changes.keys()
        if protected:
            raise ValidationError(f"cannot change {', '.join(sorted(protected))}")
        unknown = changes.keys() - SessionMetadata.model_fields.keys()
        if unknown:
            raise ValidationError(
                f"unknown metadata field {', '.join(sorted(map(repr, unknown)))}; the fields "
                f"are {', '.join(sorted(_CHANGEABLE_METADATA))} (put your own values in "
                "attributes)"
            )
        if "attributes" in changes and not isinstance(changes["attributes"], Mapping):
            raise ValidationError(
                f"attributes must be a mapping, got {type(changes['attributes']).__name__}"
            )

        def change(current: SessionMetadata) -> SessionMetadata:
            update = dict(changes)
            if "attributes" in update:
                update["attributes"] = {**current.attributes, **update["attributes"]}
            try:
                return SessionMetadata.model_validate({**current.model_dump(), **update})
            except PydanticValidationError as exc:
                raise invalid_fields("metadata", exc) from exc

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
        if not isinstance(values, Mapping):
            raise ValidationError(
                f"entities are a mapping of kind to value, got {type(values).__name__}"
            )
        if isinstance(remove, str) or not all(isinstance(kind, str) for kind in remove):
            raise ValidationError("remove is a collection of entity kinds (strings)")
        now = self._service.clock.now()
        try:
            upsert = {k: ActiveEntity(kind=k, value=v, updated_at=now) for k, v in values.items()}
        except PydanticValidationError as exc:
            raise invalid_fields("entity", exc) from exc
        merged = await self._tiers.update_entities(
            self._view.metadata, upsert, remove, turn_count_hint=self._view.next_index
        )
        self._view = replace(self._view, entities=merged)
        return merged

    async def get_state(self, name: str, *, fresh: bool = False) -> StateBlob | None:
        """A named state blob, from the hot tier (reloaded from the durable tier on a miss).

        ``fresh=True`` reads the durable tier, the source of truth for versions. Use it after
        a compare-and-set lost (``ConflictError``): a writer that died between its durable
        write and the hot copy, or wrote while the hot tier was bypassed, leaves the hot
        copy behind until the blob's next successful write, so a re-read from the hot tier
        would lose again.
        """
        validate_id(name, what="state name")
        if fresh:
            view = await self._tiers.durable_view(self.id)
            if view is None:
                raise_gone(self.id)
            return view.state.get(name)
        return (await self.view()).state.get(name)

    async def put_state(
        self, name: str, data: Mapping[str, JsonValue], *, expected_version: int | None = None
    ) -> StateBlob:
        """Write a named state blob; ``expected_version`` makes it compare-and-set."""
        if not isinstance(data, Mapping):
            raise ValidationError(
                f"state data is a mapping (a JSON object), got {type(data).__name__}"
            )
        if expected_version is not None and (
            type(expected_version) is not int or expected_version < 0
        ):
            raise ValidationError(
                f"expected_version is a version number (an integer >= 0), got {expected_version!r}"
            )
        return await self._tiers.put_state(
            self._view.metadata,
            name,
            data,
            expected_version=expected_version,
            turn_count_hint=self._view.next_index,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self) -> SessionMetadata:
        """Flush pending writes (this session's background work included), mark the
        session closed (``closed_at``) and hand it off to long-term memory (an
        ``interaction_summary`` memory and its preferences: ``docs/summaries.md``).
        Returns the metadata, with ``turn_count`` and ``last_activity`` derived from the
        archive.

        A closed session is not gone: a turn added to it later reopens it (``closed_at``
        is cleared), as a user coming back to a conversation does, and the next close (or
        the expiry sweeper) hands the whole session off again: its summary supersedes the
        one the earlier close wrote. Closing a closed session with no new turns changes
        nothing. (A handle that had not seen the close, in another process say, leaves
        ``closed_at`` set when it adds a turn; the next handoff still covers that turn.)
        To delete a session, :meth:`clear` it."""
        await self._service.background.wait_for(session_id=self.id)
        closed = await self._tiers.close(self.id)
        view = await self._tiers.view(self.id, refresh_ttl=False)
        if view is None:
            raise_gone(self.id)
        self._view = replace(view, metadata=derive_metadata(closed, view.turns, view.next_index))
        await self._handoff_on_close()
        return self._view.metadata

    async def clear(self) -> None:
        """Delete the session from every tier, and its turns from the search index."""
        await self._service.background.wait_for(session_id=self.id)
        await self._service.summaries.unindex(self.user_id, self.id)  # before the records go
        count = await self._tiers.clear(self.id)
        self._service.summaries.forget(self.id)
        self._service.context_cache.drop(self.id)
        await self._service.longterm.unindex_turns(self.user_id, self.id, range(count))

    async def context(
        self,
        query: str | None = None,
        budget: int | None = None,
        model: str | None = None,
        system: str | Sequence[SystemBlock] | None = None,
        tools: Sequence[Any] | None = None,
        *,
        current: str | Message | None = None,
        allocation: Allocation | None = None,
        recall_k: int = RECALL_K,
        state: StateCoordinator | None = None,
        optimize: bool | OptimizePolicy = True,
    ) -> ContextWindow:
        """What to send the model now, assembled by :func:`tiermem.context.assemble_context`.

        One read of the hot window and the session's summary records (one round trip on
        Redis hot + Redis durable: ``TieredSessionStore.view_with_records``; the hot window
        is reloaded from the durable tier on a miss); what it builds from unchanged records
        and the token counts of unchanged texts are kept between calls in the service's
        :class:`~tiermem.session_context.ContextCache`. With a ``query``, the
        user's long-term context (:meth:`LongTermMemory.build_user_context`, within half of
        the memory share) and per-turn recall over memories, archived turns and knowledge
        chunks (``recall_k`` hits; hits of turns already in the hot window are skipped) are
        read concurrently. Read-only: recall is placed in the window, never written into the
        history. ``current`` is a message not yet added as a turn; usually the caller has
        added it and it is the latest hot turn. ``state``: this session's
        :class:`~tiermem.state.StateCoordinator` (loaded): its block (intent and slots,
        task, environment; within a quarter of the memory share) goes after the active
        entities. With neither ``budget`` nor ``model`` the
        budget is :data:`DEFAULT_CONTEXT_BUDGET`. The session's rolling summaries and
        structured memory go in as sections, and hot turns they cover are left out (see
        ``docs/summaries.md``); ``stats.quality_metrics`` is the latest pass's quality.
        The conversation starts with a user's own turn (not a tool result): when the hot
        turns hold none (an agent loop longer than the hot window), the turn that opened
        the task is read from the archive (one range read of at most
        :data:`~tiermem.session_context.OPENING_REACH` turns, in that case only) and put
        first with a marker of the turns left out, or, beyond that reach, a line saying
        the task continues (``docs/context.md``).

        ``optimize``: the hot turns offered are first shrunk by the pre-save optimization
        (:mod:`tiermem.context.optimize`; ``stats.optimization`` says what it did): with
        True (default, :data:`~tiermem.context.optimize.VIEW_POLICY`) a failed call that
        later succeeded goes with its result, an assistant text repeated within one agent
        loop is said once, and a large tool output the model has seen and that is no
        longer the final result of its call becomes a reference to its turn
        (``session.get_turn(i)`` returns it whole: the archive keeps everything); every
        final successful result stays verbatim and a call and its result stay together.
        An :class:`~tiermem.context.optimize.OptimizePolicy` runs every step under it
        (name your tools with side effects to collapse repeated calls of the others);
        False sends the turns as stored. Prompt caches: each of these changes rewrites
        the history once, at the turn it touches (an output becomes a reference the first
        call after the model answered it), so a provider that caches the message prefix
        (OpenAI's automatic cache) misses from that turn on once; the cache points of the
        window (system, tools, profile, summaries) are before the history and unchanged.

        Raises:
            ValidationError: a bad budget, system block, current message or ``optimize``.
            UnknownModelError: ``model`` is not in the default model registry.
            BudgetExceededError: the system prompt, tool manifest and required turns do not
                fit the budget even truncated.
            BackendError: a tier or the index failed.
        """
        from tiermem.context import assemble_context, resolve_budget
        from tiermem.context.assemble import check_context_call
        from tiermem.context.optimize import optimize_view
        from tiermem.tokens import default_registry

        allocation = check_context_call(
            query=query, model=model, recall_k=recall_k, allocation=allocation
        )
        policy = _view_policy(optimize)
        spec = default_registry().get(model) if model is not None else None
        if budget is None and spec is None:
            budget = DEFAULT_CONTEXT_BUDGET
        total = resolve_budget(budget, spec)
        cache = self._service.context_cache
        jobs = self._service.summaries
        # The hot window and the summary records: one round trip on Redis, else concurrent.
        found, records = await self._tiers.view_with_records(self.id, RECORD_KINDS)
        if found is None:
            found = await self._found_again()
        view = self._remember(found)
        built = await cache.sections(jobs, self.id, records)
        turns: Sequence[Turn] = built.hot_turns(view.turns)
        optimization = None
        if policy is not None:
            turns, optimization = optimize_view(turns, policy, cache.tokens)
        opening = None
        if needs_opening(turns):
            # Inside an agent loop longer than the hot window: the only case that may read
            # more (once per loop; then what was read is kept with the records read here).
            opening = await self._opening(view, built, turns[0].index)
        user_context: UserContext | None = None
        hits: Sequence[RecallHit] = ()
        if query is not None and query.strip():
            longterm = self._service.longterm
            profile_tokens = max(1, int(total * allocation.memory) // 2)
            # The profile is the user's preferences alone, not what this query recalls: it
            # sits before the cache point, so it must not change from turn to turn (a
            # changed prefix is a cache write and no hit on every request). Memories the
            # query finds come through per-turn recall, after the cache point.
            user_context, hits = await asyncio.gather(
                longterm.build_user_context(self.user_id, "", budget_tokens=profile_tokens),
                self._recall_for_context(query, recall_k, {t.index for t in view.turns}),
            )
        state_text = None
        if state is not None:
            state_text = self._state_block(state, max(1, int(total * allocation.memory) // 4))
        window = assemble_context(
            system=system,
            tools=tools or (),
            state=state_text,
            user_context=user_context,
            entities=cache.entities(view, built, jobs),
            recall=hits,
            sections=built.sections,
            turns=turns,
            current=current,
            opening=opening,
            budget=budget,
            model=spec,
            allocation=allocation,
            session_id=self.id,
            total_turns=view.next_index,
            counter=cache.tokens,
        )
        if optimization is None and not built.quality_metrics:
            return window
        stats = window.stats.model_copy(
            update={"optimization": optimization, "quality_metrics": dict(built.quality_metrics)}
        )
        return window.model_copy(update={"stats": stats})

    async def _opening(
        self, view: SessionView, built: SummarySections, first_shown: int
    ) -> Turn | Message:
        """The user message to open a window whose turns start at ``first_shown`` with an
        assistant's turn or a tool result: the newest user turn before it, from the hot
        window, else from one range read of at most :data:`OPENING_REACH
        <tiermem.session_context.OPENING_REACH>` archived turns before the hot window
        (:func:`~tiermem.session_context.opening_message`). What the read found and the
        hot turns are kept (:class:`~tiermem.session_context.KnownOpenings`, valid while
        the summary records read with them are: a redaction rewrites them), so the next
        calls of the loop need no read.

        Raises:
            BackendError: the durable tier failed.
        """
        hot = view.turns
        found = latest_opening(hot, first_shown)
        oldest = hot[0].index if hot else first_shown
        known = self._service.context_cache.openings
        created_at = view.stored_metadata.created_at
        now = self._service.clock.now()
        read = None
        if found is None and oldest > 0:
            held = known.before(self.id, built, created_at, view.next_index, oldest, now)
            if held is UNKNOWN:
                start = max(0, oldest - OPENING_REACH)
                found = latest_opening(await self._tiers.get_turns(self.id, start, oldest), oldest)
                read = (start, oldest, found)
            else:
                found = held
        known.learn(
            self.id,
            built,
            created_at,
            view.next_index,
            hot,
            now,
            self._tiers.config.durable_ttl,
            read=read,
        )
        return opening_message(found, first_shown)

    def _state_block(self, state: StateCoordinator, budget_tokens: int) -> str | None:
        from tiermem.state import StateCoordinator

        if not isinstance(state, StateCoordinator):
            raise ValidationError(
                f"state must be this session's StateCoordinator, got {type(state).__name__}"
            )
        if state.session_id != self.id:
            raise ValidationError(
                f"state is session {state.session_id!r}'s coordinator, not {self.id!r}'s"
            )
        block = state.to_agent_context(
            budget_tokens=budget_tokens, tokens=self._service.context_cache.tokens
        )
        return block.text or None

    async def _recall_for_context(
        self, query: str, k: int, hot_indexes: set[int]
    ) -> Sequence[RecallHit]:
        """Per-turn recall (``tiermem.longterm.recall_context``): hot-window turns left out
        before the top ``k``, dated query, second hop, de-duplicated, diverse, with the
        turns completing each hit's exchange."""
        from tiermem.longterm.recall import Recaller
        from tiermem.longterm.recall_context import ContextRecallPolicy, recall_for_context

        longterm = self._service.longterm
        if not isinstance(longterm.recaller, Recaller):
            return await longterm.recall(
                self.user_id, query, k=k, scope=("memory", "turn", "chunk")
            )
        return await recall_for_context(
            longterm.recaller,
            self.user_id,
            query,
            now=self._service.clock.now(),
            scope=("memory", "turn", "chunk"),
            session_id=self.id,
            hot_indexes=hot_indexes,
            policy=ContextRecallPolicy(k=k, candidates=max(12, k)),
        )

    async def stats(self) -> SessionStats:
        view = await self.view()
        oldest = await self._tiers.get_turns(self.id, 0, 1) if view.next_index else []
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

    # -- summaries and structured memory (docs/summaries.md) -----------------------------

    async def summaries(self, *, wait_through: int | None = None) -> SessionSummaries:
        """The session's rolling summaries, structured memory and watermarks.

        ``wait_through=N`` is read-your-writes: it returns once the summaries reach turn N,
        running the pass now if no background job has (turns after N - ``keep_hot`` are
        summarized too only when the caller asks for them this way).

        Raises:
            ValidationError: turn ``wait_through`` does not exist.
            ModelFailedError: the engine failed; the previous summaries are unchanged.
            BackendError: a tier failed.
        """
        jobs = self._service.summaries
        if wait_through is None:
            return await jobs.read(self.id)
        if type(wait_through) is not int or wait_through < 0:
            raise ValidationError(
                f"wait_through is a turn index (an integer >= 0), got {wait_through!r}"
            )
        return await jobs.wait_through(self.id, wait_through)

    async def structured(self, *, wait_through: int | None = None) -> StructuredMemory:
        """The session's structured memory (see :meth:`summaries`)."""
        return (await self.summaries(wait_through=wait_through)).structured

    async def watermarks(self) -> Watermarks:
        """ "Summarized through turn N", "extracted through turn N", and the compression
        values in force."""
        return (await self.summaries()).watermarks

    async def _queue_summary(self, stored: Sequence[Turn]) -> None:
        """Queue a summarization pass when one is due (no I/O when it is not)."""
        if not self._service.auto_summarize or not stored:
            return
        await self._service.summaries.after_append(
            self.user_id, self.id, stored, max(self._view.next_index, stored[-1].index + 1)
        )

    async def _handoff_on_close(self) -> None:
        """Hand the closed session off to long-term memory; a failure is logged and left to
        the expiry sweeper, which retries it (the handoff is idempotent)."""
        view = await self._tiers.durable_view(self.id)
        if view is None:
            return
        try:
            await self._service.handoff(view)
        except TierMemError as exc:
            self._service.handoff.failures += 1
            logger.warning(
                "handoff of closed session %s failed; the expiry sweeper retries it: %s",
                self.id,
                exc,
            )


_first = itemgetter(0)
_second = itemgetter(1)


@dataclass(slots=True)
class _AfterAppend:
    """The background part of one ``add_turns``: index its turns, detect memories."""

    session: Session
    turns: Sequence[Turn]
    analyses: Sequence[TurnAnalysis | None]
    index: bool
    detect: bool


async def _after_appends(items: list[_AfterAppend]) -> None:
    """Index the turns of queued appends (any sessions) in one write per long-term
    memory, then run memory detection of each append in order. Each step logs and counts
    its own failures, so one failing never skips another."""
    by_memory: dict[int, tuple[LongTermMemory, list[_AfterAppend]]] = {}
    for item in items:
        if item.index:
            memory = item.session._service.longterm
            by_memory.setdefault(id(memory), (memory, []))[1].append(item)
    for memory, indexed in by_memory.values():
        docs: list[IndexedDoc] = []
        built: list[_AfterAppend] = []
        by_session: dict[int, list[_AfterAppend]] = {}
        for item in indexed:  # a session's appends in one call (in order)
            by_session.setdefault(id(item.session), []).append(item)
        for appends in by_session.values():
            try:
                docs += appends[0].session._index_docs(appends)
            except TierMemError as exc:  # this session's turns only; the others go on
                for item in appends:
                    _index_failed(item, exc)
            else:
                built += appends
        try:
            await memory.index_docs(docs)
        except TierMemError as exc:
            for item in built:
                _index_failed(item, exc)
    for item in items:
        if item.detect:
            texts = [a.text if a is not None else None for a in item.analyses]
            await item.session._detect_logged(item.turns, texts)


def _index_failed(item: _AfterAppend, exc: TierMemError) -> None:
    item.session._service.index_failures += 1
    logger.warning(
        "indexing turns %s of session %s failed: %s",
        [t.index for t in item.turns],
        item.session.id,
        exc,
    )


AFTER_APPEND: Batch[_AfterAppend] = Batch(_after_appends, max_items=64, linger=0.005)
"""Queued appends merged into one background call (bounded: a large batch would hold the
worker, and the index transaction, for long)."""


@functools.lru_cache(maxsize=16)
def after_append_batch(linger: float) -> Batch[_AfterAppend]:
    """The batch of :data:`AFTER_APPEND`'s kind with another ``linger`` (seconds): one per
    value, so services sharing a :class:`~tiermem.background.BackgroundWork` with the same
    linger merge their items (batches are told apart by identity)."""
    if linger == AFTER_APPEND.linger:
        return AFTER_APPEND
    return Batch(_after_appends, max_items=AFTER_APPEND.max_items, linger=linger)


def _view_policy(optimize: object) -> OptimizePolicy | None:
    """The policy ``Session.context(optimize=...)`` asks for; None: no optimization."""
    from tiermem.context.optimize import VIEW_POLICY, OptimizePolicy

    if optimize is True:
        return VIEW_POLICY
    if optimize is False:
        return None
    if isinstance(optimize, OptimizePolicy):
        return optimize
    raise ValidationError(
        f"optimize must be True, False or an OptimizePolicy, got {type(optimize).__name__}"
    )


def raise_gone(session_id: str) -> NoReturn:
    raise NotFoundError(f"session {session_id!r} no longer exists (cleared or purged)")
