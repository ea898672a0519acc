"""Summarization jobs: off the response path, idempotent, committed with a version check.

**Records** (durable session records, kept ``record_retention`` -- 30 days by default --
so they outlive the raw turns' 24 hours):

* ``summary`` -- the tiers (:class:`~tiermem.summaries.models.SummaryText`), the turn they
  reach (``through_index``), the last pass's quality (:class:`PassQuality`) and the
  watermarks (:class:`Watermarks`: "summarized through turn N", "extracted through turn
  N", the number of passes and the compression values in force -- quality-aware
  compression), written in the same compare-and-set;
* ``structured`` -- :class:`~tiermem.summaries.models.StructuredMemory`;
* ``watermarks`` -- the watermarks as they were stored before they moved into the summary
  record (one durable write fewer per pass, issue #8): still read when the summary record
  carries none (records written before, or by a process of an older version), and reset
  by a redaction when present; no pass writes it.

The ``summary`` and ``structured`` records are the truth (structured memory is written
first); readers take the larger of the watermarks and what the records reach, so a crash
between the two writes only leaves the summary behind until the next pass.

**A job** is keyed by ``(session, through-turn)``. It reads the three records and the raw
turns it needs, extracts structured memory from the turns after ``extracted_through``,
builds the tiers (:mod:`tiermem.summaries.rolling`) and validates them
(:mod:`tiermem.summaries.validate`), then commits: ``structured`` and ``summary`` each with
compare-and-set on the version it read. A job that loses a race to another job that got
as far (another worker, a retry) stops without writing: concurrent jobs commit once. An
engine or backend that fails mid-job leaves everything as it was (nothing is written before
the engines are done), and the job runs again on the session's next trigger check (the
in-process watermark is dropped, so the next ``add_turns`` submits it) or when a caller
waits for it.

**Off the response path**: ``add_turns`` only compares the in-process watermark with the
hot window (no I/O) and, when a pass is due, submits one job per session to the service's
background work (:mod:`tiermem.background`), beside its lanes so that the turns' index
writes never queue behind a pass. A pass is CPU work on the event loop, so two more rules
keep it off the turns' latency: at most ``SummaryPolicy.max_concurrent_passes`` background
passes run at once in a process (the others wait, still "queued": they see the newest turns
when they start), and a pass yields to the event loop between its stages (read, extract,
each tier, validate, retry, commit, index), so a turn waits behind one stage, not a pass --
nor, when every session reaches its trigger on the same turn, behind a wall of passes.
While a session's pass runs, its appends only record what arrived (the turn count and the
tokens, O(1)); when the pass ends, that is judged against the watermark the pass left, and
the next pass runs in the same job only if one is due (judged against the watermark the
pass started from, every turn meanwhile would queue a job that finds nothing due).
Callers that need their writes summarized await :meth:`SummaryJobs.wait_through`
(``await session.summaries(wait_through=N)``), which runs the job inline if it has not run
yet (not counted in the bound: the caller is waiting for it).

**Round trips** (issue #8): a background pass starts from what this process last read or
wrote -- the three records (and the recall claim), the models its previous pass wrote them
from (valid only for those very record objects, so not parsed again), the turns its previous
pass summarized (valid only over the summary version that pass wrote) and the turn count the
session's appends reported -- so a steady session's pass makes one archive read (the turns
after the summaries) and its two compare-and-set writes. Those caches are bounded and only ever
stale, never wrong: another process's pass or redaction changes the versions, so the stale
pass's compare-and-set fails, the cache is dropped, and the pass reads afresh (a decision
"not due" taken from a stale record only waits for the next trigger, as the in-process
watermark always did). A failed pass drops them too.

**Recall** (:mod:`tiermem.summaries.recall_docs`, when :meth:`SummaryJobs.index_for_recall`
attached a long-term memory): a committed pass indexes the session's summary lines and
structured items, and removes the previous version's other lines, in the job (so off the
response path, except for a caller that waits for the pass); a redaction that resets the
summaries removes them all. An index failure is logged and counted, never fails the pass:
recall checks every line against the records anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from tiermem.background import BackgroundWork
from tiermem.clock import Clock
from tiermem.errors import ConflictError, TierMemError, ValidationError
from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.models import ActiveEntity, JsonValue, SessionRecord, Turn
from tiermem.models.base import FrozenModel, UtcDatetime
from tiermem.models.content import TextBlock, text_of
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.contract import DurableStore
from tiermem.store.keys import validate_id
from tiermem.summaries.models import (
    SessionSummarizer,
    StructuredExtractor,
    StructuredMemory,
    SummaryText,
    SummaryTier,
)
from tiermem.summaries.rolling import (
    Compression,
    RollingBuilder,
    SummaryPolicy,
    adjust_compression,
    plan_pass,
    plan_tiers,
    summarized_through,
)
from tiermem.summaries.structured import ENTITY_SLOTS, same_value
from tiermem.summaries.structured import render_structured as structured_text
from tiermem.summaries.validate import PassQuality, drop_stale, validated_pass
from tiermem.tokens import TokenCounter

if TYPE_CHECKING:
    from tiermem.longterm.memory import LongTermMemory
    from tiermem.summaries.recall_docs import CurrentSummary, SummaryLine, SummaryRecall

__all__ = [
    "STRUCTURED_RECORD",
    "SUMMARY_RECORD",
    "WATERMARKS_RECORD",
    "JobOutcome",
    "SessionSummaries",
    "SummaryJobStats",
    "SummaryJobs",
    "Watermarks",
    "current_entities",
    "render_structured",
]

logger = logging.getLogger(__name__)

SUMMARY_RECORD = "summary"
STRUCTURED_RECORD = "structured"
WATERMARKS_RECORD = "watermarks"
LINES_RECORD = "summary_lines"
"""Which summary-line documents the recall index may hold for the session (a superset), and
when they were last all written (:meth:`SummaryJobs.refresh_lines`)."""
LINES_REFRESH = timedelta(hours=6)
"""How often a session's summary lines are written to the recall index again by its passes
(and at handoff): well inside the raw turns' 24 h, which recall searches meanwhile."""
COMMIT_ATTEMPTS = 3
"""Passes a job recomputes after losing a race to a different (shorter) commit."""
KNOWN_SESSIONS = 10_000
"""Sessions whose watermark is remembered in process (least recently used dropped)."""
RECORD_CACHE_SESSIONS = 1_000
"""Sessions whose last read or written records (summary, structured, watermarks, claim) a
process keeps, so that a pass need not read them again (least recently used dropped; a few
kilobytes each)."""
TURN_CACHE_AGE = timedelta(minutes=10)
"""How long the turns a pass summarized stay usable by the session's next pass in this
process (an active session's next pass comes within minutes; the archive keeps turns for
hours, so they are alive then)."""
TURN_CACHE_TURNS = 96
"""At most this many of a pass's newest summarized turns are kept for the next pass (it
re-reads those rolled from the middle tier into the ancient one)."""
TURN_CACHE_CHARS = 16_000_000
"""Bound on the text of all kept turns together (least recently kept sessions dropped
first): large turns must not make the session bound a gigabyte one."""
_TIER_ORDER = (SummaryTier.ANCIENT, SummaryTier.MIDDLE, SummaryTier.RECENT)


def _chars(turn: Turn) -> int:
    """Characters of a turn's text (what :data:`TURN_CACHE_CHARS` bounds), without joining
    plain text blocks (a pass keeps up to 96 turns: this runs on every pass)."""
    content = turn.content
    if len(content) == 1 and type(content[0]) is TextBlock:  # most turns: no generator
        return len(content[0].text)
    return sum(
        len(block.text) if type(block) is TextBlock else len(text_of((block,)))
        for block in turn.content
    )


@dataclass(frozen=True, slots=True)
class _PassTurns:
    """Turns a committed pass summarized, valid for the next pass only over the summary
    record this process wrote (``summary_version``): any other write of it (a redaction,
    another process's pass) changes the version, and then the turns are read again."""

    summary_version: int
    read_at: datetime
    """When the first-read of them was read from the archive."""
    turns: Mapping[int, Turn]
    sizes: Mapping[int, int]
    """Each turn's characters of text (by index), so that the next pass, which keeps most
    of these very turns again, need not count them again."""
    chars: int
    """Characters of text the turns hold (for :data:`TURN_CACHE_CHARS`)."""


@dataclass(frozen=True, slots=True)
class _Written:
    """The models of the records a committed pass wrote, as the pass built them, so that
    the session's next pass here starts from them instead of validating the records again
    (three ``model_validate`` calls per pass, issue #8). Each part is valid only for that
    very record object: a record read or written since (another process's pass, a
    redaction, a conflict's fresh read) is another object, and is parsed again."""

    summary: SessionRecord
    tiers: tuple[SummaryText, ...]
    """What ``_tiers(summary)`` returns."""
    marks: Watermarks
    """What ``_marks(summary, ...)`` returns (the summary record carries them)."""
    structured: SessionRecord | None
    """The structured record as of the commit (None: not known to this pass)."""
    memory: StructuredMemory
    """What ``_structured(structured)`` returns."""


@dataclass
class _Known:
    """What this process knows of a session: the watermark, the compression in force, and
    the tokens of the turns after the watermark counted so far (through ``counted_through``)."""

    done: int
    compression: Compression
    pending_tokens: int
    counted_through: int


def _due(known: _Known, next_index: int) -> bool:
    """A pass is due: ``every_turns`` turns after the watermark, or more than
    ``trigger_tokens`` tokens counted since it."""
    compression = known.compression
    return (
        next_index - 1 - known.done >= compression.every_turns
        or known.pending_tokens > compression.trigger_tokens
    )


@dataclass
class _Arrived:
    """What a session's appends reported while its background pass ran (O(1), no I/O): the
    pass's end judges from it, against the watermark the pass left, whether another pass is
    due -- judged against the watermark the pass started from, every turn after the
    trigger would queue a pass that only finds it is not due."""

    next_index: int = -1
    """The largest turn count reported (-1: no turn arrived)."""
    through: int = -1
    """The largest index of the turns reported."""
    tokens: int = 0
    """Their tokens, added up."""

    def record(self, stored: Sequence[Turn], next_index: int) -> None:
        for turn in stored:
            if turn.index > self.through:
                self.through = turn.index
            self.tokens += turn.token_count
        if next_index > self.next_index:
            self.next_index = next_index

    def apply(self, known: _Known) -> None:
        """Count the turns into ``known``. Turns it already counted (only when another
        pass, e.g. an inline one, read further meanwhile) are counted again: a token count
        too high at worst queues a pass that reads and finds it is not due."""
        if self.through > known.counted_through:
            known.pending_tokens += self.tokens
            known.counted_through = self.through


class JobOutcome(StrEnum):
    COMMITTED = "committed"
    NOT_DUE = "not_due"
    ALREADY_DONE = "already_done"
    """The summaries already reached the job's turn."""
    LOST_RACE = "lost_race"
    """Another job committed as far while this one ran; nothing written."""


class Watermarks(FrozenModel):
    """What is visible: summaries through ``summarized_through``, structured memory through
    ``extracted_through`` (-1: nothing yet)."""

    summarized_through: int = -1
    extracted_through: int = -1
    passes: int = 0
    compression: Compression | None = None
    """The compression values in force for the session (None: the policy's base)."""
    updated_at: UtcDatetime | None = None


class SessionSummaries(FrozenModel):
    """A session's summaries, structured memory and watermarks, as read."""

    session_id: str
    tiers: tuple[SummaryText, ...] = ()
    structured: StructuredMemory = StructuredMemory()
    watermarks: Watermarks = Watermarks()
    compression: Compression
    """The values in force (quality-aware compression)."""
    quality: PassQuality | None = None
    """The last pass's quality."""
    summary_version: int = 0
    structured_version: int = 0

    def tier(self, tier: SummaryTier) -> SummaryText | None:
        return next((t for t in self.tiers if t.tier is tier), None)

    @property
    def text(self) -> str:
        """The tiers' text, oldest first."""
        return "\n".join(t.text for t in self.tiers if t.text)


def current_entities(
    active: Mapping[str, ActiveEntity],
    structured: StructuredMemory,
    extractor: RuleEntityExtractor | None = None,
) -> dict[str, ActiveEntity]:
    """The session's active entities, each agreeing with ``structured``: an active value
    that structured memory records as replaced (a ``previous`` value of any slot: the
    language, or the anniversary a date was said for), set at or before the turn that
    gave the slot its current value, is replaced by that value when it is an entity of the
    same kind, else left out.

    Why: the hot tier tracks entities by kind with no reading of corrections, so "make it
    the French edition, not German" leaves ``language: German`` active (and "my
    anniversary is 2015-12-12, not 2015-08-21" leaves ``date: 2015-08-21``), which the
    context would present as current next to structured memory's latest values. A value
    said after the slot's latest statement is newer than it and stays."""
    reader = extractor or _ENTITY_READER
    slots = [*structured.entities.items(), *structured.facts.items()]
    out = dict(active)
    for kind, entity in active.items():
        if entity.turn_index is None:
            continue
        for slot, fact in slots:
            if entity.turn_index > fact.turn_index or same_value(
                entity.value, fact.value, slot=slot
            ):
                continue
            if not any(same_value(entity.value, old, slot=slot) for old in fact.previous):
                continue
            if ENTITY_SLOTS.get(entity.kind, entity.kind) == slot:
                value: str | None = fact.value
            else:
                found = reader.extract(fact.value)
                value = next((e.value for e in found if e.kind == entity.kind), None)
            if value is None:
                out.pop(kind, None)
            else:
                out[kind] = entity.model_copy(
                    update={"value": value, "turn_index": fact.turn_index}
                )
            break
    return out


_ENTITY_READER = RuleEntityExtractor()


def render_structured(structured: StructuredMemory) -> str:
    """Structured memory as a context section: only current values (a superseded value is
    never presented as current)."""
    body = structured_text(structured)
    return f"Structured memory of this session (latest values):\n{body}" if body else ""


@dataclass
class SummaryJobStats:
    """Counters since the service started (process-local), and the last pass's quality."""

    jobs: int = 0
    committed: int = 0
    not_due: int = 0
    already_done: int = 0
    lost_races: int = 0
    failures: int = 0
    """Jobs that raised a TierMemError (model or backend failure); retried later."""
    validation_retries: int = 0
    """Passes that re-summarized a tier with ``must_keep``."""
    verbatim_appends: int = 0
    """Passes that appended lost items verbatim."""
    compression_changes: int = 0
    """Passes after which the compression values in force changed."""
    last_quality: PassQuality | None = None
    last_compression: Compression | None = None
    preservation_sum: float = 0.0
    preservation_passes: int = 0
    drift_sum: float = 0.0
    drift_passes: int = 0
    queued: int = 0
    """Sessions with a pass queued and not started."""
    recall_index_failures: int = 0
    """Commits and resets whose summary lines could not be (un)indexed for recall (logged)."""

    def snapshot(self) -> dict[str, object]:
        """The counters and averages as plain values (for stats endpoints)."""
        return {
            "jobs": self.jobs,
            "committed": self.committed,
            "not_due": self.not_due,
            "already_done": self.already_done,
            "lost_races": self.lost_races,
            "failures": self.failures,
            "validation_retries": self.validation_retries,
            "verbatim_appends": self.verbatim_appends,
            "compression_changes": self.compression_changes,
            "mean_fact_preservation_first": (
                self.preservation_sum / self.preservation_passes
                if self.preservation_passes
                else None
            ),
            "mean_entity_drift": self.drift_sum / self.drift_passes if self.drift_passes else None,
            "last_quality": None if self.last_quality is None else self.last_quality.model_dump(),
            "compression_in_force": (
                None if self.last_compression is None else self.last_compression.model_dump()
            ),
            "queued": self.queued,
            "recall_index_failures": self.recall_index_failures,
        }


class SummaryJobs:
    """Runs and commits summarization passes for every session of a service."""

    def __init__(
        self,
        durable: DurableStore,
        *,
        summarizer: SessionSummarizer,
        extractor: StructuredExtractor,
        background: BackgroundWork,
        clock: Clock,
        tokens: TokenCounter,
        policy: SummaryPolicy | None = None,
    ) -> None:
        self.durable = durable
        self.summarizer = summarizer
        self.extractor = extractor
        self.background = background
        self.clock = clock
        self.tokens = tokens
        self.policy = policy or SummaryPolicy()
        self.stats = SummaryJobStats()
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._queued: set[str] = set()
        self._running: dict[str, _Arrived] = {}
        """Per session whose background pass runs, what its appends reported meanwhile."""
        self._next_seen: dict[str, int] = {}
        """Per queued session, the turn count its appends reported: the pass reads the
        turns up to it, with no ``next_index`` round trip."""
        self._records: OrderedDict[str, dict[str, SessionRecord | None]] = OrderedDict()
        """Per session, the records (by kind; None: absent) as this process last read or
        wrote them. A pass starts from them instead of reading them again; another process's
        write makes them stale, which costs the pass a compare-and-set conflict and a fresh
        read (every commit is compare-and-set on the version), never a wrong commit."""
        self._written: OrderedDict[str, _Written] = OrderedDict()
        """Per session, the models of the records its last pass here wrote (bounded like
        ``_records``; only ever used for the identical record objects)."""
        self._pass_turns: OrderedDict[str, _PassTurns] = OrderedDict()
        self._pass_turn_chars = 0
        """Per session, the turns its last pass here summarized (bounded like ``_records``)."""
        self._unindexed: OrderedDict[str, None] = OrderedDict()
        """Sessions whose last summary-line indexing failed: their next pass indexes every
        line again (bounded like ``_known``)."""
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self.recall: SummaryRecall | None = None
        """Indexes committed summary lines for recall (:meth:`index_for_recall`)."""

    def index_for_recall(self, longterm: LongTermMemory, *, structured: bool = True) -> None:
        """Make every session's summary lines (and structured items, with ``structured``)
        recall sources of ``longterm``: indexed in its index when a pass commits, resolved
        by its recaller (``Recaller.recall(summaries=True)``), and loaded by a warming
        index with the user's newest sessions (``WARM_SESSIONS``)."""
        from tiermem.longterm.index_memory import WarmingIndex
        from tiermem.longterm.recall import WARM_SESSIONS, Recaller
        from tiermem.summaries.recall_docs import SummaryRecall

        self.recall = SummaryRecall(
            longterm.index,
            self.current_for_recall,
            write=longterm.index_docs,
            structured=structured,
        )
        if isinstance(longterm.recaller, Recaller):
            longterm.recaller.register_summary_resolver(self.recall.resolve)
        if isinstance(longterm.index, WarmingIndex):
            durable = self.durable

            async def sessions(user_id: str) -> list[str]:
                refs = await durable.list_sessions(user_id, limit=WARM_SESSIONS)
                return [ref.session_id for ref in refs]

            longterm.index.add_loader(self.recall.loader(sessions))

    async def current_for_recall(self, session_id: str, with_structured: bool) -> CurrentSummary:
        """The session's stored tiers (and structured memory, when asked), as recall checks
        its summary lines against them."""
        from tiermem.summaries.recall_docs import CurrentSummary

        structured_rec = None
        if with_structured:
            summary_rec, structured_rec = await asyncio.gather(
                self.durable.get_record(session_id, SUMMARY_RECORD),
                self.durable.get_record(session_id, STRUCTURED_RECORD),
            )
        else:
            summary_rec = await self.durable.get_record(session_id, SUMMARY_RECORD)
        return CurrentSummary(
            tiers=_tiers(summary_rec),
            structured=_structured(structured_rec) if with_structured else None,
            summary_version=summary_rec.version if summary_rec else 0,
            structured_version=structured_rec.version if structured_rec else 0,
            structured_at=structured_rec.updated_at if structured_rec else None,
            expires_at=summary_rec.expires_at if summary_rec else None,
        )

    # -- reading ----------------------------------------------------------------------

    async def read(self, session_id: str) -> SessionSummaries:
        """The session's summaries, structured memory and watermarks (empty ones if no
        pass has run yet)."""
        validate_id(session_id, what="session_id")
        summary_rec, structured_rec, marks_rec = await asyncio.gather(
            self.durable.get_record(session_id, SUMMARY_RECORD),
            self.durable.get_record(session_id, STRUCTURED_RECORD),
            self.durable.get_record(session_id, WATERMARKS_RECORD),
        )
        self._keep(
            session_id,
            {
                SUMMARY_RECORD: summary_rec,
                STRUCTURED_RECORD: structured_rec,
                WATERMARKS_RECORD: marks_rec,
            },
        )
        structured = _structured(structured_rec)
        tiers = self._current(_tiers(summary_rec), structured)
        marks = _marks(summary_rec, marks_rec)
        marks = marks.model_copy(
            update={
                "summarized_through": max(marks.summarized_through, summarized_through(tiers)),
                "extracted_through": max(marks.extracted_through, structured.through_index),
            }
        )
        quality = None
        if summary_rec is not None and isinstance(summary_rec.data.get("quality"), dict):
            quality = PassQuality.model_validate(summary_rec.data["quality"])
        return SessionSummaries(
            session_id=session_id,
            tiers=tiers,
            structured=structured,
            watermarks=marks,
            compression=marks.compression or self.policy.base_compression(),
            quality=quality,
            summary_version=summary_rec.version if summary_rec else 0,
            structured_version=structured_rec.version if structured_rec else 0,
        )

    def entity_reader(self) -> RuleEntityExtractor | None:
        """The structured extractor's entity reader (its title catalogue), if it has one."""
        reader = getattr(self.extractor, "entities", None)
        return reader if isinstance(reader, RuleEntityExtractor) else None

    def _current(
        self, tiers: tuple[SummaryText, ...], structured: StructuredMemory
    ) -> tuple[SummaryText, ...]:
        """``tiers`` without sentences that present a value ``structured`` has superseded.

        A pass already drops them from every tier it commits; this holds the same rule when
        the two records were committed by different passes (a pass that lost the summary's
        compare-and-set after committing structured memory, a crash between the writes),
        so what is read never depends on how the jobs were timed."""
        out = []
        for tier in tiers:
            text, dropped = drop_stale(tier.text, structured, extractor=self.entity_reader())
            if dropped:
                tier = tier.model_copy(update={"text": text, "tokens": self.tokens.count(text)})
            out.append(tier)
        return tuple(out)

    # -- the response path: a check without I/O -----------------------------------------

    async def after_append(
        self, user_id: str, session_id: str, stored: Sequence[Turn], next_index: int
    ) -> None:
        """Queue a pass if one is due, judged from the in-process watermark and a running
        count of the tokens added since (no I/O); an unknown session queues a job that
        reads and decides. While the session's pass runs, only note what arrived: the
        pass's end judges it (:meth:`_job`)."""
        if session_id in self._queued:
            self._next_seen[session_id] = max(self._next_seen.get(session_id, 0), next_index)
            return
        arrived = self._running.get(session_id)
        if arrived is not None:  # the pass's end decides, from the watermark it leaves
            arrived.record(stored, next_index)
            return
        known = self._known.get(session_id)
        if known is not None:
            self._known.move_to_end(session_id)
            for turn in stored:
                if turn.index > known.counted_through:
                    known.pending_tokens += turn.token_count
                    known.counted_through = turn.index
            if not _due(known, next_index):
                return
        self._next_seen[session_id] = next_index
        await self._submit(user_id, session_id)

    async def _submit(self, user_id: str, session_id: str) -> asyncio.Future[None] | None:
        """Queue one pass of the session on the background queue (None if one is queued
        and has not started: it will see the newest turns when it runs)."""
        if session_id in self._queued:
            return None
        self._queued.add(session_id)
        self.stats.queued = len(self._queued)
        return self.background.submit_beside(user_id, session_id, lambda: self._job(session_id))

    def _pass_slots(self) -> asyncio.Semaphore:
        """The running loop's bound on background passes (``max_concurrent_passes``)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.policy.max_concurrent_passes))
        return self._slots[1]

    async def _job(self, session_id: str) -> None:
        """The session's background passes: one, then another while the turns that
        arrived during the last one make one due (judged from the watermark it left), in
        this job, so that a wait for the session's jobs covers them too. While a pass runs,
        the session's appends only record what arrived (:class:`_Arrived`)."""
        while True:
            async with self._pass_slots():
                self._queued.discard(session_id)
                self.stats.queued = len(self._queued)
                arrived = self._running[session_id] = _Arrived()
                try:
                    await self._guarded(session_id, self._next_seen.pop(session_id, None))
                finally:
                    self._running.pop(session_id, None)
            if arrived.next_index < 0:
                return
            known = self._known.get(session_id)
            if known is not None:
                arrived.apply(known)
                if not _due(known, arrived.next_index):
                    return
            # else the pass failed (or the session was forgotten): the turns that arrived
            # meanwhile are the next turns, which queue a retry.
            self._queued.add(session_id)  # waits for a slot like any queued pass
            self.stats.queued = len(self._queued)
            self._next_seen[session_id] = arrived.next_index

    async def _guarded(self, session_id: str, next_index: int | None) -> None:
        """One background pass; a TierMemError is logged and counted, and retried later."""
        try:
            await self.run(session_id, next_index=next_index)
        except TierMemError as exc:
            self.stats.failures += 1
            self._known.pop(session_id, None)  # the next add_turns checks again: a retry
            self._records.pop(session_id, None)  # and reads the records again
            logger.warning(
                "summarizing session %s failed; the previous summary stays and the job "
                "runs again on the next turn: %s",
                session_id,
                exc,
            )

    # -- the job ------------------------------------------------------------------------

    async def wait_through(self, session_id: str, through: int) -> SessionSummaries:
        """Read-your-writes: the summaries once they reach turn ``through``, running the
        pass inline if no job got there yet.

        Raises:
            ValidationError: turn ``through`` does not exist.
            ModelFailedError: the engine failed (nothing was written).
            BackendError: a tier failed.
        """
        current = await self.read(session_id)
        if current.watermarks.summarized_through >= through:
            return current
        last = await self.durable.next_index(session_id) - 1
        if not 0 <= through <= last:
            raise ValidationError(
                f"session {session_id!r} has turns 0..{last}; cannot wait for turn {through}"
            )
        await self.run(session_id, through=through)
        return await self.read(session_id)

    async def run(
        self, session_id: str, *, through: int | None = None, next_index: int | None = None
    ) -> JobOutcome:
        """One pass: through ``through`` if given (a caller waiting), else through what the
        trigger plans, over the turns before ``next_index`` if given (the count the
        session's appends reported; None: every archived turn). Idempotent (module
        docstring).

        Raises:
            ModelFailedError: an engine failed; nothing was written.
            ConflictError: other writers kept changing the records.
            BackendError: a tier failed; nothing after the failed write was written.
        """
        self.stats.jobs += 1
        for _ in range(COMMIT_ATTEMPTS):
            outcome = await self._attempt(session_id, through, next_index)
            if outcome is not None:
                return outcome
        raise ConflictError(
            f"the summaries of session {session_id!r} kept changing under {COMMIT_ATTEMPTS} "
            "passes; try again"
        )

    async def _attempt(
        self, session_id: str, through: int | None, next_index: int | None
    ) -> JobOutcome | None:
        summary_rec, structured_rec, marks_rec = await self._records_of(
            session_id, (SUMMARY_RECORD, STRUCTURED_RECORD, WATERMARKS_RECORD)
        )
        written = self._written.get(session_id)
        if written is not None and written.summary is summary_rec:
            current, marks = written.tiers, written.marks
        else:
            current, marks = _tiers(summary_rec), _marks(summary_rec, marks_rec)
        done = summarized_through(current)
        compression = marks.compression or self.policy.base_compression()
        read_at = self.clock.now()
        if through is None:
            # The turns after the summaries, up to the count the appends reported (else to
            # the last): the last one read is the last turn (turns expire oldest first),
            # so no ``next_index`` round trip.
            pending = await self.durable.get_turns(session_id, done + 1, next_index)
            last = pending[-1].index if pending else done
            counts = [(t.index, t.token_count or self.tokens.count(t.text)) for t in pending]
            target = plan_pass(counts, done, compression, last=last)
            if target is None:
                self.stats.not_due += 1
                tokens = sum(c for _, c in counts)
                self._remember(session_id, _Known(done, compression, tokens, last))
                return JobOutcome.NOT_DUE
        else:
            pending = None
            last = await self.durable.next_index(session_id) - 1
            target = min(through, last)
            if target <= done:
                self.stats.already_done += 1
                self._known.pop(session_id, None)  # the next turn's check reads again
                return JobOutcome.ALREADY_DONE
        await asyncio.sleep(0)  # stage boundary: the reads and plan are done
        if (
            written is not None
            and structured_rec is not None
            and written.structured is structured_rec
        ):
            structured = written.memory
        else:
            structured = _structured(structured_rec)
        spans = plan_tiers(current, target)

        async def source(first: int, upto: int) -> list[Turn]:
            if first < start:  # a rolled tier whose turns expired: its whole span, to tell
                return list(await self.durable.get_turns(session_id, first, upto + 1))
            return [by_index[i] for i in range(first, upto + 1) if i in by_index]

        builder = RollingBuilder(
            self.summarizer,
            targets=self.policy.targets,
            counter=self.tokens,
            clock=self.clock,
            turns=source,
        )
        start = min(builder.first_needed(spans, current), structured.through_index + 1)
        # The turns the tiers are built from (a verbatim engine's ancient tier needs only
        # those rolled into it) and those to extract from: the planning read's, and one
        # more read only for turns before it.
        prior: _PassTurns | None = None  # the previous pass's turns, when this one uses them
        if pending is None:
            turns = await self.durable.get_turns(session_id, start, last + 1)
        elif start <= done:
            prior = self._pass_turns.get(session_id)  # what _earlier_turns takes, if it does
            held = self._earlier_turns(session_id, summary_rec, start, done)
            if held is None:
                prior = None
                earlier = await self.durable.get_turns(session_id, start, done + 1)
            else:
                earlier, read_at = held[0], min(read_at, held[1])
            turns = [*earlier, *pending]
        else:
            turns = [t for t in pending if t.index >= start]
        by_index = {t.index: t for t in turns}

        fresh_structured: StructuredMemory | None = None
        if structured.through_index < last:
            extracted = structured.through_index
            # Every turn of ``turns`` after ``done`` is one of ``pending``: when extraction
            # has reached ``done`` (a steady session), only those are looked at.
            fresh = [
                t
                for t in (pending if pending is not None and extracted >= done else turns)
                if t.index > extracted
            ]
            fresh_structured = await self.extractor.extract(fresh, prior=structured)
            if fresh_structured.through_index < last:
                # Turns that expired before extraction cannot be read again: move on.
                fresh_structured = fresh_structured.model_copy(update={"through_index": last})
        effective = fresh_structured or structured
        await asyncio.sleep(0)  # stage boundary: extraction is done
        built, quality = await validated_pass(
            builder,
            spans,
            current,
            effective,
            check=self.policy.validate,
            extractor=self.entity_reader(),
        )
        await asyncio.sleep(0)  # stage boundary: the tiers are built and validated
        # Commit: nothing was written before this point, so a failure above changes nothing.
        expires_at = self.record_expiry()
        structured_now: SessionRecord | None = structured_rec  # the record ``effective`` is
        if fresh_structured is not None:
            try:
                structured_now = await self.durable.put_record(
                    session_id,
                    STRUCTURED_RECORD,
                    fresh_structured.model_dump(mode="json"),
                    expected_version=structured_rec.version if structured_rec else 0,
                    expires_at=expires_at,
                )
                self._keep(session_id, {STRUCTURED_RECORD: structured_now})
            except ConflictError:
                structured_now = None  # another writer's record: not ``effective``
                # Another writer (or a stale cache): what this process holds is not to be
                # trusted any more; the rest of the pass and the next ones read afresh.
                self._records.pop(session_id, None)
                latest = _structured(await self.durable.get_record(session_id, STRUCTURED_RECORD))
                if latest.through_index < last:
                    return None  # someone committed less than we need: recompute
        tiers = tuple(sorted((b.text for b in built), key=lambda t: _TIER_ORDER.index(t.tier)))
        adjusted = adjust_compression(compression, self.policy, quality.fact_preservation_first)
        # The watermarks ride with the summary (one write, under its compare-and-set):
        # never lowered, as a watermarks record of the old layout may be ahead.
        new_marks = Watermarks(
            summarized_through=max(marks.summarized_through, target),
            extracted_through=max(marks.extracted_through, effective.through_index),
            passes=marks.passes + 1,
            compression=adjusted,
            updated_at=self.clock.now(),
        )
        record = {
            "schema": 1,
            "through_index": target,
            "job": f"{session_id}:{target}",
            "tiers": [t.model_dump(mode="json") for t in tiers],
            "quality": quality.model_dump(mode="json"),
            WATERMARKS_RECORD: new_marks.model_dump(mode="json"),
        }
        try:
            summary_now = await self.durable.put_record(
                session_id,
                SUMMARY_RECORD,
                record,
                expected_version=summary_rec.version if summary_rec else 0,
                expires_at=expires_at,
            )
            self._keep(session_id, {SUMMARY_RECORD: summary_now})
            self._keep_written(
                session_id, _Written(summary_now, tiers, new_marks, structured_now, effective)
            )
            self._keep_turns(session_id, summary_now.version, by_index, target, read_at, prior)
        except ConflictError:
            self._records.pop(session_id, None)
            latest_tiers = _tiers(await self.durable.get_record(session_id, SUMMARY_RECORD))
            if summarized_through(latest_tiers) >= target:
                self.stats.lost_races += 1
                return JobOutcome.LOST_RACE
            return None
        if self.recall is not None:
            await asyncio.sleep(0)  # stage boundary: committed; indexing is the last stage
            recall = self.recall
            await self._refresh_lines(
                session_id, lambda: recall.lines(tiers, effective), turns=by_index, force=False
            )
        self._count(quality, compression, adjusted)
        # The turns after the pass's target: at most the few kept raw, not all those read.
        after = (by_index[i] for i in range(target + 1, last + 1) if i in by_index)
        left = sum(t.token_count or self.tokens.count(t.text) for t in after)
        self._remember(session_id, _Known(target, adjusted, left, last))
        return JobOutcome.COMMITTED

    # -- bookkeeping --------------------------------------------------------------------

    async def refresh_lines(self, session_id: str) -> None:
        """Write the session's current summary lines to the recall index now (the handoff
        calls it, so a closed session's last lines are searchable once its turns expire).
        Failures are logged and counted, like a pass's."""
        if self.recall is None:
            return
        current = await self.current_for_recall(session_id, True)
        lines = self.recall.lines(current.tiers, current.structured)
        await self._refresh_lines(session_id, lambda: lines, turns={}, force=True)

    async def _refresh_lines(
        self,
        session_id: str,
        current_lines: Callable[[], Sequence[SummaryLine]],
        *,
        turns: Mapping[int, Turn],
        force: bool,
    ) -> None:
        """Index ``current_lines()`` (the session's current summary lines; made only when
        due, as most passes write none) for recall when it is due:
        forced, never done, :data:`LINES_REFRESH` (or an eighth of the records' retention)
        since the last time, or this session's last attempt failed. Between times a pass
        writes nothing to the index: its lines' turns are still searchable themselves, and
        writing every pass's lines cost more than the turn on Redis.

        The ``summary_lines`` record names every line document the index may hold for the
        session, and is written *before* the index: first the old claim plus the new
        lines, then, once the index has them and the old ones are removed, the new lines
        alone. A crash leaves a superset, so a reset (redaction, clear) always removes every
        document that could carry a redacted turn's text. Failures are logged and counted
        (module docstring); a claim written meanwhile by another process wins (its refresh
        covers the lines)."""
        recall = self.recall
        if recall is None:
            return
        try:
            # Whether it is due is judged from the claim this process last saw: another
            # writer only renews it (later: due later), or resets it together with the
            # summary record, whose compare-and-set then fails and drops what is cached.
            fresh = session_id not in self._records or LINES_RECORD not in self._records[session_id]
            (claim_rec,) = await self._records_of(session_id, (LINES_RECORD,))
            renewed_at = _renewed(claim_rec)  # the keys only when due: most passes
            now = self.clock.now()
            due = (
                force
                or renewed_at is None
                or session_id in self._unindexed
                or now - renewed_at >= self._refresh_every()
            )
            if not due:
                return
            if not fresh:  # act on the claim as it is now
                claim_rec = await self.durable.get_record(session_id, LINES_RECORD)
                self._keep(session_id, {LINES_RECORD: claim_rec})
            claimed = _claim(claim_rec)[0]
            lines = current_lines()
            if not lines and not claimed:
                return
            ref = await self.durable.get_session(session_id)
            if ref is None:
                return
            keys = {line.key for line in lines}
            version = await self._put_claim(
                session_id, claim_rec, sorted(set(claimed) | keys), renewed_at
            )
            if version is None:
                return
            await recall.replace(
                ref.user_id,
                session_id,
                claimed=claimed,
                lines=lines,
                turns=turns,
                at=now,
                expires_at=self.record_expiry(),
            )
            await self._put_claim(session_id, version, sorted(keys), now)
            self._unindexed.pop(session_id, None)
        except TierMemError as exc:
            self._index_failed(session_id, exc)

    async def _reset_lines(self, session_id: str, lines: Sequence[SummaryLine]) -> None:
        """Remove every summary-line document of the session from the recall index: those
        the claim names and ``lines`` (a redaction, a clear)."""
        recall = self.recall
        if recall is None:
            return
        try:
            claim_rec = await self.durable.get_record(session_id, LINES_RECORD)
            claimed, _renewed = _claim(claim_rec)
            keys = set(claimed) | {line.key for line in lines}
            if not keys:
                return
            ref = await self.durable.get_session(session_id)
            if ref is None:
                return
            await recall.remove_keys(ref.user_id, session_id, keys)
            if claim_rec is not None:
                await self._put_claim(session_id, claim_rec, [], None)
        except TierMemError as exc:
            self._index_failed(session_id, exc)

    async def _put_claim(
        self,
        session_id: str,
        prior: SessionRecord | None,
        keys: list[str],
        renewed_at: UtcDatetime | None,
    ) -> SessionRecord | None:
        """Write the claim over ``prior`` (compare-and-set); None when another writer got
        there first."""
        data: dict[str, JsonValue] = {
            "schema": 1,
            "keys": list(keys),
            "renewed_at": renewed_at.isoformat() if renewed_at else None,
        }
        try:
            written = await self.durable.put_record(
                session_id,
                LINES_RECORD,
                data,
                expected_version=prior.version if prior else 0,
                expires_at=self.record_expiry(),
            )
        except ConflictError:
            self._records.get(session_id, {}).pop(LINES_RECORD, None)
            return None
        self._keep(session_id, {LINES_RECORD: written})
        return written

    def _refresh_every(self) -> timedelta:
        retention = self.policy.record_retention
        return LINES_REFRESH if retention is None else min(LINES_REFRESH, retention / 8)

    def _index_failed(self, session_id: str, exc: TierMemError) -> None:
        self.stats.recall_index_failures += 1
        self._unindexed[session_id] = None
        while len(self._unindexed) > KNOWN_SESSIONS:
            self._unindexed.popitem(last=False)
        logger.warning(
            "indexing the summary lines of session %s for recall failed; recall checks "
            "them against the records, and the next pass indexes them again: %s",
            session_id,
            exc,
        )

    async def unindex(self, user_id: str, session_id: str) -> None:
        """Remove the session's summary lines from the recall index (a session being
        cleared: call it before its records are deleted, which name the lines). Recall
        would drop them anyway once the records are gone; this removes their text now.

        Raises:
            BackendError: the durable tier or the index failed.
        """
        recall = self.recall
        if recall is None:
            return
        current = await self.current_for_recall(session_id, True)
        claim_rec = await self.durable.get_record(session_id, LINES_RECORD)
        keys = set(_claim(claim_rec)[0])
        keys |= {line.key for line in recall.lines(current.tiers, current.structured)}
        await recall.remove_keys(user_id, session_id, keys)

    def record_expiry(self) -> UtcDatetime | None:
        """When records written now expire (``record_retention`` from now; None: never)."""
        retention = self.policy.record_retention
        return None if retention is None else self.clock.now() + retention

    def _remember(self, session_id: str, known: _Known) -> None:
        self._known[session_id] = known
        self._known.move_to_end(session_id)
        while len(self._known) > KNOWN_SESSIONS:
            self._known.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """Drop the in-process watermark, records and turns of a cleared (or redacted)
        session."""
        self._known.pop(session_id, None)
        self._records.pop(session_id, None)
        self._written.pop(session_id, None)
        self._drop_pass_turns(session_id)

    def _keep_written(self, session_id: str, written: _Written) -> None:
        """Remember the models of a commit (bounded: :data:`RECORD_CACHE_SESSIONS`)."""
        self._written[session_id] = written
        self._written.move_to_end(session_id)
        while len(self._written) > RECORD_CACHE_SESSIONS:
            self._written.popitem(last=False)

    def _keep_turns(
        self,
        session_id: str,
        version: int,
        by_index: Mapping[int, Turn],
        target: int,
        read_at: datetime,
        prior: _PassTurns | None = None,
    ) -> None:
        """Keep the newest turns a pass committed (through ``target``) for the next pass;
        ``read_at``: when the oldest-read of them was read from the archive; ``prior``: the
        previous pass's turns this pass used (their sizes are not counted again)."""
        kept = {i: t for i, t in by_index.items() if target - TURN_CACHE_TURNS < i <= target}
        if prior is None:
            sizes = {i: _chars(t) for i, t in kept.items()}
        else:
            held, held_sizes = prior.turns, prior.sizes
            sizes = {i: held_sizes[i] if held.get(i) is t else _chars(t) for i, t in kept.items()}
        chars = sum(sizes.values())
        self._drop_pass_turns(session_id)
        if chars > TURN_CACHE_CHARS:
            return
        self._pass_turns[session_id] = _PassTurns(version, read_at, kept, sizes, chars)
        self._pass_turn_chars += chars
        while (
            len(self._pass_turns) > RECORD_CACHE_SESSIONS
            or self._pass_turn_chars > TURN_CACHE_CHARS
        ):
            _, dropped = self._pass_turns.popitem(last=False)
            self._pass_turn_chars -= dropped.chars

    def _drop_pass_turns(self, session_id: str) -> _PassTurns | None:
        held = self._pass_turns.pop(session_id, None)
        if held is not None:
            self._pass_turn_chars -= held.chars
        return held

    def _earlier_turns(
        self, session_id: str, summary_rec: SessionRecord | None, start: int, done: int
    ) -> tuple[list[Turn], datetime] | None:
        """Turns ``start..done`` as this process's last pass had them, and when they were
        read, if they are all held and still valid (:class:`_PassTurns`: at most
        :data:`TURN_CACHE_AGE` since read); None: read them."""
        held = self._drop_pass_turns(session_id)  # one use: the pass keeps its own
        if (
            held is None
            or summary_rec is None
            or held.summary_version != summary_rec.version
            or self.clock.now() - held.read_at > TURN_CACHE_AGE
        ):
            return None
        kept = held.turns
        try:
            turns = [kept[i] for i in range(start, done + 1)]
        except KeyError:  # one of them is not held
            return None
        return turns, held.read_at

    async def _records_of(
        self, session_id: str, kinds: Sequence[str]
    ) -> list[SessionRecord | None]:
        """The session's records of ``kinds``: as this process last saw them, reading (at
        once) only those it does not hold."""
        held = self._records.get(session_id)
        if held is not None:
            self._records.move_to_end(session_id)
        missing = [k for k in kinds if held is None or k not in held]
        if missing:
            read = await asyncio.gather(*(self.durable.get_record(session_id, k) for k in missing))
            held = self._keep(session_id, dict(zip(missing, read, strict=True)))
        assert held is not None
        return [held[k] for k in kinds]

    def _keep(
        self, session_id: str, records: Mapping[str, SessionRecord | None]
    ) -> dict[str, SessionRecord | None]:
        """Remember records as just read or written (bounded: :data:`RECORD_CACHE_SESSIONS`)."""
        held = self._records.setdefault(session_id, {})
        held.update(records)
        self._records.move_to_end(session_id)
        while len(self._records) > RECORD_CACHE_SESSIONS:
            self._records.popitem(last=False)
        return held

    async def redacted(self, session_id: str, index: int) -> bool:
        """Turn ``index`` was redacted: if the summaries or structured memory already cover
        it, reset them (empty, watermarks at -1) so that nothing derived from the turn's
        content stays, and the next pass rebuilds them from the archive, which now holds
        the redacted turn. Turns that have expired from the archive since cannot be
        summarized again: privacy wins over completeness. Returns whether it reset.

        When they do not cover it yet, both records are still rewritten as they are: a pass
        that read the turn before the redaction then fails its compare-and-set and reads
        the archive again, instead of committing the turn's content.

        Raises:
            ConflictError: a pass kept committing in between; redact again.
            BackendError: the durable tier failed; redact again.
        """
        for attempt in range(CAS_ATTEMPTS):
            summary_rec, structured_rec, marks_rec = await asyncio.gather(
                self.durable.get_record(session_id, SUMMARY_RECORD),
                self.durable.get_record(session_id, STRUCTURED_RECORD),
                self.durable.get_record(session_id, WATERMARKS_RECORD),
            )
            marks = _marks(summary_rec, marks_rec)
            reset = index <= max(
                marks.summarized_through,
                marks.extracted_through,
                summarized_through(_tiers(summary_rec)),
                _structured(structured_rec).through_index,
            )
            cleared = Watermarks(
                passes=marks.passes, compression=marks.compression, updated_at=self.clock.now()
            )
            empty_summary: dict[str, JsonValue] = {
                "schema": 1,
                "through_index": -1,
                "job": "redacted",
                "tiers": [],
                WATERMARKS_RECORD: cleared.model_dump(mode="json"),
            }
            empty_structured: dict[str, JsonValue] = StructuredMemory().model_dump(mode="json")
            expires_at = self.record_expiry()
            try:
                # Summary first: a crash after it leaves the structured memory to the next
                # redaction or pass, never the summary text.
                for kind, rec, empty in (
                    (SUMMARY_RECORD, summary_rec, empty_summary),
                    (STRUCTURED_RECORD, structured_rec, empty_structured),
                ):
                    await self.durable.put_record(
                        session_id,
                        kind,
                        empty if reset or rec is None else dict(rec.data),
                        expected_version=rec.version if rec else 0,
                        expires_at=expires_at,
                    )
                if reset and marks_rec is not None:  # the old layout's record, reset too
                    await self.durable.put_record(
                        session_id,
                        WATERMARKS_RECORD,
                        cleared.model_dump(mode="json"),
                        expected_version=marks_rec.version if marks_rec else 0,
                        expires_at=expires_at,
                    )
            except ConflictError:
                await pause(attempt)
                continue
            self.forget(session_id)
            if reset and self.recall is not None:
                await self._reset_lines(
                    session_id, self.recall.lines(_tiers(summary_rec), _structured(structured_rec))
                )
            return reset
        raise ConflictError(
            f"the summaries of session {session_id!r} kept changing while a redaction reset "
            "them; redact the turn again"
        )

    def _count(self, quality: PassQuality, before: Compression, after: Compression) -> None:
        stats = self.stats
        stats.committed += 1
        stats.validation_retries += bool(quality.retried_tiers)
        stats.verbatim_appends += bool(quality.appended)
        stats.compression_changes += before != after
        stats.last_quality = quality
        stats.last_compression = after
        if quality.fact_preservation_first is not None:
            stats.preservation_sum += quality.fact_preservation_first
            stats.preservation_passes += 1
        if quality.entity_drift is not None:
            stats.drift_sum += quality.entity_drift
            stats.drift_passes += 1


def _tiers(record: SessionRecord | None) -> tuple[SummaryText, ...]:
    if record is None:
        return ()
    raw = record.data.get("tiers")
    if not isinstance(raw, list):
        return ()
    return tuple(SummaryText.model_validate(t) for t in raw)


def _structured(record: SessionRecord | None) -> StructuredMemory:
    return StructuredMemory() if record is None else StructuredMemory.model_validate(record.data)


def _watermarks(record: SessionRecord | None) -> Watermarks:
    return Watermarks() if record is None else Watermarks.model_validate(record.data)


def _marks(summary: SessionRecord | None, marks: SessionRecord | None) -> Watermarks:
    """The session's watermarks: those the summary record carries (a pass writes them with
    it), else the ``watermarks`` record (the layout before, still read: records written
    then, or by a process of an older version, which writes the summary without them)."""
    if summary is not None:
        raw = summary.data.get(WATERMARKS_RECORD)
        if isinstance(raw, dict):
            return Watermarks.model_validate(raw)
    return _watermarks(marks)


def _claim(rec: SessionRecord | None) -> tuple[list[str], UtcDatetime | None]:
    """The ``summary_lines`` record's keys and renewal time (nothing claimed: absent)."""
    if rec is None or not isinstance(rec.data, dict):
        return [], None
    keys = rec.data.get("keys")
    claimed = [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
    return claimed, _renewed(rec)


def _renewed(rec: SessionRecord | None) -> UtcDatetime | None:
    """The ``summary_lines`` record's renewal time (None: absent, or never renewed)."""
    if rec is None or not isinstance(rec.data, dict):
        return None
    raw = rec.data.get("renewed_at")
    try:
        return datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
