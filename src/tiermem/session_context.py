"""What :meth:`Session.context <tiermem.session.Session.context>` keeps between calls, so
that a call costs the same at turn 10 and at turn 10,000 (:class:`ContextCache`).

A window is mostly what the previous call sent: the rolling summary and structured memory
change once per summarization pass, the hot turns once per turn. Two things were redone on
every call and grew with the session: turning the session's summary records into context
sections (validating them, dropping superseded sentences, rendering structured memory)
and counting the summary's tokens. The cache keeps

* the sections built from the records, per session, keyed by the records as read (kind,
  version, write time and data): the records are still read on every call (a pass of
  another process is seen at once), but an unchanged read reuses the sections whole;
* token counts per text (:class:`~tiermem.context.count_memo.MemoTokenCounter`), so the
  summary, structured memory and hot turns already counted are looked up, not counted.

* what each agent loop opened with (:class:`KnownOpenings`).

All are bounded (least recently used dropped first) and :meth:`ContextCache.shrink` empties
them. One cache per :class:`~tiermem.service.MemoryService`, shared by its handles.

It also owns which turn opens a window (:func:`opens_conversation`, :func:`needs_opening`,
:func:`opening_message`): a conversation must start with a user's own turn. Inside an agent
loop longer than the hot window that turn is older than the hot window; what was learnt of
it (from the archive once, then from each hot window the loop shows) is kept in
:class:`KnownOpenings`, so that the loop's later calls do not read the archive again.
"""

from __future__ import annotations

import enum
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tiermem.context.count_memo import MemoTokenCounter
from tiermem.context.models import ContextSection, ItemProvenance
from tiermem.models import ActiveEntity, Message, SessionRecord, TextBlock, ToolResultBlock, Turn
from tiermem.summaries.jobs import (
    STRUCTURED_RECORD,
    SUMMARY_RECORD,
    WATERMARKS_RECORD,
    SessionSummaries,
    current_entities,
    render_structured,
)
from tiermem.tokens import TokenCounter

if TYPE_CHECKING:
    from tiermem.summaries.jobs import SummaryJobs
    from tiermem.summaries.validate import PassQuality
    from tiermem.tiers.tiered import SessionView

__all__ = [
    "CONTEXT_SESSIONS",
    "OPENING_BYTES",
    "OPENING_REACH",
    "OPENING_SESSIONS",
    "OPENING_TURNS",
    "RECORD_KINDS",
    "UNKNOWN",
    "ContextCache",
    "KnownOpenings",
    "SummarySections",
    "latest_opening",
    "needs_opening",
    "opening_message",
    "opens_conversation",
    "quality_metrics",
    "summary_sections",
]

CONTEXT_SESSIONS = 1_024
"""Sessions whose summary sections are kept (a few KB each)."""
RECORD_KINDS = (SUMMARY_RECORD, STRUCTURED_RECORD, WATERMARKS_RECORD)
"""The session records a window is built from, read on every call."""
OPENING_REACH = 128
"""How many archived turns before the hot window :meth:`Session.context
<tiermem.session.Session.context>` reads, in one range read and only when the window
would start inside an agent loop whose request is older than the hot window
(:func:`needs_opening`), to find that request. Turns of tool output can be large: the bound
keeps that read to at most this many turns; an opening turn further back (or expired
from the archive) gives way to :func:`opening_message`'s continuation line."""
OPENING_SESSIONS = 1_024
"""Sessions whose loop opening :class:`KnownOpenings` keeps (least recently used dropped)."""
OPENING_BYTES = 8 * 1024 * 1024
"""The most :class:`KnownOpenings` holds, in the kept turns' JSON bytes: a request with a
pasted document is large; one larger than this is not kept (it is read each call)."""

_Stamp = tuple[tuple[int, Any, Any] | None, ...]
_HeldEntities = tuple[
    "SummarySections", tuple[tuple[str, ActiveEntity], ...], Mapping[str, ActiveEntity]
]


@dataclass(frozen=True, slots=True)
class SummarySections:
    """A session's summary records as context: the sections (summary tiers, then
    structured memory), the last turn the summaries cover, how many newest hot turns stay
    beside them, the summaries as read (for the entities' corrections) and the latest
    pass's quality as :attr:`ContextStats.quality_metrics
    <tiermem.context.models.ContextStats.quality_metrics>` (:func:`quality_metrics`)."""

    sections: tuple[ContextSection, ...]
    summarized_through: int
    keep_hot: int
    summaries: SessionSummaries
    quality_metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def hot_turns(self, turns: Sequence[Turn]) -> list[Turn]:
        """The hot turns the summaries do not cover (pinned ones and the newest
        ``keep_hot`` always stay), reaching back to a user's own turn when they would
        start with anything else (:func:`opens_conversation`): the newest six turns of a
        user/assistant exchange start with the assistant, and Bedrock Converse refuses a
        conversation that does not start with the user."""
        done, keep = self.summarized_through, self.keep_hot
        start = max(0, len(turns) - keep) if keep else len(turns)
        for position, turn in enumerate(turns):
            if turn.index > done:
                start = min(start, position)
                break
        # The first turn kept (pinned ones aside) is the user's, if one is at hand.
        if start < len(turns) and not opens_conversation(turns[start]):
            for back in range(start - 1, -1, -1):
                if opens_conversation(turns[back]):
                    start = back
                    break
        return [t for position, t in enumerate(turns) if position >= start or t.pinned]


def opens_conversation(turn: Turn) -> bool:
    """Whether a conversation may start with ``turn``: a user's turn that answers no tool
    call (a tool result without the call before it is refused by every provider)."""
    return turn.role == "user" and not any(type(block) is ToolResultBlock for block in turn.content)


def needs_opening(turns: Sequence[Turn]) -> bool:
    """Whether a window of ``turns`` (oldest first) needs a user message put before them.
    The assembly starts a window at its first turn that may open the conversation
    (:func:`opens_conversation`) only when no turn before it must stay: a pinned one, or
    a tool result (eviction keeps the first user turn, its call with it). So a window
    needs one when a tool result or a pinned turn comes before the user's first own
    turn, or when there is none: a window inside an agent loop longer than the hot
    window, or starting inside the loop before the one the user's latest turn opened.
    Assistant turns before the user's turn are left out instead (no read)."""
    for turn in turns:
        if opens_conversation(turn):
            return False
        if turn.pinned or turn.role == "user":
            return True
    return bool(turns)


def latest_opening(turns: Sequence[Turn], before: int) -> Turn | None:
    """The newest of ``turns`` (oldest first) with an index under ``before`` that may open
    a conversation (:func:`opens_conversation`), or None."""
    for turn in reversed(turns):
        if turn.index < before and opens_conversation(turn):
            return turn
    return None


def opening_message(found: Turn | None, first_shown: int) -> Turn | Message:
    """The user message that opens a window whose hot turns (from turn ``first_shown``)
    start inside a task: ``found``, the user turn that opened it, followed by a marker of
    the turns left out between the two (none when they are adjacent); with none found,
    one line saying the task continues. Never an assistant's or a tool result's turn: a
    conversation that starts with either is refused by Bedrock Converse and Anthropic.

    The opening turn is the same on every call of the task, and its marker changes only
    when the hot window moves on (when the messages after it change as well): a provider
    caching the message prefix keeps it as long as the window lets it."""
    if found is None:
        return Message.text(
            "user",
            f"[This task continues from turns before turn {first_shown} that are not shown; "
            "session.get_turn(i) returns turn i.]",
        )
    if found.index + 1 >= first_shown:
        return found
    gap = (
        f"turn {found.index + 1} of this task is"
        if found.index + 2 == first_shown
        else f"turns {found.index + 1}-{first_shown - 1} of this task are"
    )
    marker = TextBlock(text=f"[{gap} not shown; session.get_turn(i) returns turn i.]")
    return found.model_copy(update={"content": (*found.content, marker)})


class _Unknown(enum.Enum):
    UNKNOWN = "unknown"


UNKNOWN = _Unknown.UNKNOWN
""":meth:`KnownOpenings.before`'s answer when what it knows does not settle it: read the
archive."""


@dataclass(slots=True)
class _Known:
    """Turns ``low`` to ``through - 1`` of a session were seen, and ``turns`` (oldest
    first, at most :data:`OPENING_TURNS`) are all of them that may open a conversation.
    Good while the session's summary records are those read with them (``records``: the
    :class:`SummarySections` the cache built from them, a new object whenever they
    change), the session is the one created at ``created_at`` and the turns are within
    the archive's retention (``expires_at``). ``sizes``: the turns' JSON bytes."""

    records: SummarySections
    created_at: datetime
    low: int
    through: int
    turns: tuple[Turn, ...]
    sizes: tuple[int, ...]
    expires_at: datetime | None


OPENING_TURNS = 3
"""Opening turns :class:`KnownOpenings` keeps per session: the loop's request and the
user's turns after it, while the window still starts inside the loop."""


class KnownOpenings:
    """The turn that opened each session's agent loop, as far as this process has seen:
    what :meth:`Session.context <tiermem.session.Session.context>` read from the archive
    (:data:`OPENING_REACH` turns before the hot window), extended by the hot window of each
    later call, so that a loop's second and later calls read nothing more than a plain
    call. :meth:`before` answers what that archive read would find.

    Redaction: :meth:`Session.redact_turn <tiermem.session.Session.redact_turn>` in any
    process redacts the archived turn, then rewrites the session's summary records
    (:meth:`SummaryJobs.redacted <tiermem.summaries.jobs.SummaryJobs.redacted>`: always,
    also when no summary covers the turn), which every ``context()`` call reads anyway.
    What is kept is used only with the records it was learnt with, so the first call
    after a redaction returned reads the archive again (and sees the redacted turn); a
    call running while a redaction is under way may show either. A session cleared and
    created again under the same id has another creation time. A turn is dropped at its
    timestamp (or when it was first seen, if that is earlier) plus the archive's
    retention, when the archive may have dropped it.

    Bounded: :data:`OPENING_SESSIONS` sessions and :data:`OPENING_BYTES` bytes of kept
    turns (least recently used dropped first); :meth:`shrink` empties it."""

    def __init__(self, *, sessions: int = OPENING_SESSIONS, max_bytes: int = OPENING_BYTES) -> None:
        self.max_sessions = sessions
        self.max_bytes = max_bytes
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._known)

    @property
    def size_bytes(self) -> int:
        """The kept turns' JSON bytes."""
        return self._bytes

    def before(
        self,
        session_id: str,
        records: SummarySections,
        created_at: datetime,
        next_index: int,
        oldest: int,
        now: datetime,
    ) -> Turn | _Unknown | None:
        """The newest turn with an index in ``[oldest - OPENING_REACH, oldest)`` that may
        open a conversation, None when there is none, or :data:`UNKNOWN`. ``records``:
        the sections this call built from the records it read; ``created_at`` and
        ``next_index``: the session's, as this call read them."""
        with self._lock:
            known = self._valid(session_id, records, created_at, next_index, now)
            answer = UNKNOWN if known is None else _known_before(known, oldest)
            if answer is UNKNOWN:
                self.misses += 1
            else:
                self.hits += 1
                self._known.move_to_end(session_id)
            return answer

    def learn(
        self,
        session_id: str,
        records: SummarySections,
        created_at: datetime,
        next_index: int,
        hot: Sequence[Turn],
        now: datetime,
        retention: timedelta | None,
        *,
        read: tuple[int, int, Turn | None] | None = None,
    ) -> None:
        """Keep what this call saw: ``read``, the archive read's ``(start, end, newest
        opening turn found)`` if it read, then the hot turns (oldest first), which extend
        what is known while they follow on from it. ``retention``: how long the archive
        keeps a turn (None: forever)."""
        with self._lock:
            held = self._valid(session_id, records, created_at, next_index, now)
            turns: tuple[Turn, ...]
            if read is not None:
                start, through, found = read
                # Only the newest was kept: what is known starts there.
                low, turns = (start, ()) if found is None else (found.index, (found,))
            elif held is not None:
                low, through, turns = held.low, held.through, held.turns
            else:
                low = through = hot[0].index if hot else 0
                turns = ()
            for hot_turn in hot:
                index = hot_turn.index
                if index < through:
                    continue
                if index > through:  # turns never seen in between: start again from here
                    low = through = index
                    turns = ()
                through += 1
                if opens_conversation(hot_turn):
                    turns = (*turns, hot_turn)
            if held is not None and read is None and turns is held.turns and low == held.low:
                held.through = through  # the loop went on: only how far it was seen moves
                self._known.move_to_end(session_id)
                return
            if len(turns) > OPENING_TURNS:
                turns = turns[-OPENING_TURNS:]
                low = turns[0].index
            if held is not None and [t.index for t in turns] == [t.index for t in held.turns]:
                turns, sizes, expires_at = held.turns, held.sizes, held.expires_at
            else:
                sizes = tuple(len(t.model_dump_json()) for t in turns)
                seen = min((min(t.timestamp, now) for t in turns), default=None)
                expires_at = None if retention is None or seen is None else seen + retention
            self._drop(session_id)
            size = sum(sizes)
            if size > self.max_bytes:
                return
            self._known[session_id] = _Known(
                records, created_at, low, through, turns, sizes, expires_at
            )
            self._bytes += size
            while len(self._known) > self.max_sessions or self._bytes > self.max_bytes:
                _, dropped = self._known.popitem(last=False)
                self._bytes -= sum(dropped.sizes)

    def drop(self, session_id: str) -> None:
        """Forget a session's openings (it was cleared)."""
        with self._lock:
            self._drop(session_id)

    def shrink(self) -> int:
        """Empty it; returns how many sessions were dropped."""
        with self._lock:
            dropped = len(self._known)
            self._known.clear()
            self._bytes = 0
        return dropped

    def _valid(
        self,
        session_id: str,
        records: SummarySections,
        created_at: datetime,
        next_index: int,
        now: datetime,
    ) -> _Known | None:
        known = self._known.get(session_id)
        if known is None:
            return None
        if (
            known.records is records
            and known.created_at == created_at
            and known.through <= next_index
            and (known.expires_at is None or now < known.expires_at)
        ):
            return known
        self._drop(session_id)
        return None

    def _drop(self, session_id: str) -> None:
        known = self._known.pop(session_id, None)
        if known is not None:
            self._bytes -= sum(known.sizes)


def _known_before(known: _Known, oldest: int) -> Turn | _Unknown | None:
    """What the archive read of ``[oldest - OPENING_REACH, oldest)`` finds, from ``known``."""
    if known.through < oldest:
        return UNKNOWN
    floor = max(0, oldest - OPENING_REACH)
    below = latest_opening(known.turns, oldest)
    if below is None:
        return None if known.low <= floor else UNKNOWN
    # No turn after it below ``oldest`` may open: beyond the reach, none within it either.
    return below if below.index >= floor else None


def quality_metrics(quality: PassQuality | None) -> dict[str, float]:
    """A pass's quality as context stats (keys: :attr:`ContextStats.quality_metrics
    <tiermem.context.models.ContextStats.quality_metrics>`); empty with no pass."""
    if quality is None:
        return {}
    measured = {
        "context_retention": quality.fact_preservation,
        "first_attempt_retention": quality.fact_preservation_first,
        "entity_drift": quality.entity_drift,
        "compression_ratio": quality.compression_ratio,
    }
    metrics = {key: round(value, 4) for key, value in measured.items() if value is not None}
    parts = [
        value
        for value in (
            quality.fact_preservation,
            None if quality.entity_drift is None else 1.0 - quality.entity_drift,
        )
        if value is not None
    ]
    if parts:
        metrics["overall_score"] = round(math.prod(parts), 4)
    return metrics


def summary_sections(session_id: str, found: SessionSummaries) -> SummarySections:
    """The context sections of a session's summaries and structured memory."""
    sections: list[ContextSection] = []
    for tier in found.tiers:
        if not tier.text:
            continue
        sections.append(
            ContextSection(
                kind="summary",
                name=tier.tier.value,
                text=f"Summary of turns {tier.first_index}-{tier.through_index} "
                f"({tier.tier.value}):\n{tier.text}",
                provenance=ItemProvenance(
                    tier="session",
                    session_id=session_id,
                    turn_indexes=(tier.first_index, tier.through_index),
                    summary_id=f"{session_id}:summary:v{found.summary_version}:{tier.tier}",
                ),
            )
        )
    structured_text = render_structured(found.structured)
    if structured_text:
        memory = found.structured
        sections.append(
            ContextSection(
                kind="structured_memory",
                text=structured_text,
                provenance=ItemProvenance(tier="session", session_id=session_id),
                counts={
                    "entities": len(memory.entities),
                    "facts": len(memory.facts),
                    "decisions": len(memory.decisions),
                    "goals": len(memory.goals),
                    "unresolved": len(memory.unresolved),
                },
            )
        )
    return SummarySections(
        sections=tuple(sections),
        summarized_through=found.watermarks.summarized_through,
        keep_hot=found.compression.keep_hot,
        summaries=found,
        quality_metrics=MappingProxyType(quality_metrics(found.quality)),
    )


def _stamp(records: Sequence[SessionRecord | None]) -> _Stamp:
    # The data is compared too: a session cleared and summarized again under a fake clock
    # can repeat a version and a write time, never the content as well.
    return tuple(None if r is None else (r.version, r.updated_at, r.data) for r in records)


class ContextCache:
    """Summary sections per session and token counts per text, for context assembly."""

    def __init__(
        self,
        tokens: TokenCounter,
        *,
        sessions: int = CONTEXT_SESSIONS,
        counts: MemoTokenCounter | None = None,
    ) -> None:
        self.tokens = counts if counts is not None else MemoTokenCounter(tokens)
        """The service's counter with a memo of counts."""
        self.max_sessions = sessions
        self._sections: OrderedDict[str, tuple[_Stamp, SummarySections]] = OrderedDict()
        self._entities: OrderedDict[str, _HeldEntities] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.openings = KnownOpenings()
        """What each session's agent loop opened with (:class:`KnownOpenings`)."""

    def __len__(self) -> int:
        return len(self._sections)

    async def sections(
        self, jobs: SummaryJobs, session_id: str, records: Sequence[SessionRecord | None]
    ) -> SummarySections:
        """The session's summary sections, given its records as just read (one per
        :data:`RECORD_KINDS`): when they are what the cache last saw, its sections are
        reused; otherwise the summaries are read through ``jobs`` and built again.

        Raises:
            BackendError: the durable tier failed.
        """
        stamp = _stamp(records)
        with self._lock:
            held = self._sections.get(session_id)
            if held is not None and held[0] == stamp:
                self._sections.move_to_end(session_id)
                self.hits += 1
                return held[1]
            self.misses += 1
        # A pass committed since (or first sight): read and build once. A pass landing
        # between the two reads only makes the next call miss again.
        built = summary_sections(session_id, await jobs.read(session_id))
        with self._lock:
            self._sections[session_id] = (stamp, built)
            self._sections.move_to_end(session_id)
            while len(self._sections) > self.max_sessions:
                self._sections.popitem(last=False)
        return built

    def entities(
        self, view: SessionView, built: SummarySections, jobs: SummaryJobs
    ) -> Mapping[str, ActiveEntity]:
        """The view's active entities agreeing with structured memory's corrections
        (:func:`~tiermem.summaries.jobs.current_entities`), kept per session while neither
        the entities nor the summaries change."""
        structured = built.summaries.structured
        if not (structured.entities or structured.facts):
            return view.entities
        active = tuple(view.entities.items())
        session_id = view.metadata.session_id
        with self._lock:
            held = self._entities.get(session_id)
            if held is not None and held[0] is built and held[1] == active:
                return held[2]
        found = current_entities(view.entities, structured, jobs.entity_reader())
        with self._lock:
            self._entities[session_id] = (built, active, found)
            self._entities.move_to_end(session_id)
            while len(self._entities) > self.max_sessions:
                self._entities.popitem(last=False)
        return found

    def drop(self, session_id: str) -> None:
        """Forget a session's sections (it was cleared)."""
        with self._lock:
            self._sections.pop(session_id, None)
            self._entities.pop(session_id, None)
        self.openings.drop(session_id)

    def shrink(self) -> int:
        """Empty the cache (sections, openings and counts); returns how many entries were
        dropped."""
        with self._lock:
            dropped = len(self._sections) + len(self._entities)
            self._sections.clear()
            self._entities.clear()
        return dropped + self.openings.shrink() + self.tokens.shrink()
