"""Earlier sessions' summaries as recall sources: one search document per summary line and
per structured-memory item, written when a summary pass commits and checked against the
session's records whenever recall meets one.

Why: a session's raw turns are kept 24 hours, its ``summary`` and ``structured`` records
30 days (:mod:`tiermem.summaries.jobs`). Once the turns have expired, the summary lines
are all that is left of what the user said in that session; per-turn recall searches them
like turns.

**One document per line.** A tier's text is split into lines (the offline engine writes one
sentence per line, ``- [12] User: My budget is ¥8,000.``, with the turn that said it; an
LLM's prose is split into sentences, with no turn index). A line is short, so BM25 scores
it like a turn and the context places it for a few tokens; a whole tier would match
everything and cost hundreds. Structured memory gives one document per current fact
(``budget: ¥8,000``) and per decision, goal and unresolved item, each with its turn.

**Provenance.** A recalled line has ``Provenance(source="summary" | "structured",
session_id, turn_indexes=(i,) when the line names its turn, memory_ids=(summary id,))``,
the summary id naming the record version and tier (``s1:summary:v3:recent``), as the
session's own summary sections do.

**Never stale.** A line's doc id is its session, source, turn and text
(:func:`~tiermem.longterm.recall.summary_doc_id` with a digest), so a line that a later
pass rewrote, dropped as superseded ("budget ¥5,000" after "actually ¥8,000") or a
redaction reset has no document any more once the lines are next written (at most every
few hours, and at handoff: :meth:`SummaryJobs.refresh_lines
<tiermem.summaries.jobs.SummaryJobs.refresh_lines>`; the session's ``summary_lines`` record
names every document the index may hold, so a redaction removes them all). And the index is never
trusted alone: :meth:`SummaryRecall.resolve` returns only lines the session's current
records still hold, so a document left behind (a crash between the record and the index
write, two passes racing) is dropped and removed from the index by recall.

**Expiry.** Documents expire with the records (``record_retention`` from the commit).

**Warm-up.** An index warmed per user from the durable store (``WarmingIndex``, DynamoDB
without Redis) loads the summary lines of the user's newest sessions with
:meth:`SummaryRecall.loader` (:meth:`SummaryJobs.index_for_recall` adds it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from tiermem.longterm.index import IndexedDoc, SearchIndex
from tiermem.longterm.recall import ResolvedDoc, parse_summary_doc_id, summary_doc_id
from tiermem.longterm.recall_dates import turn_date_terms
from tiermem.models import Provenance, Turn
from tiermem.summaries.models import StructuredMemory, SummaryText

__all__ = [
    "CurrentSummary",
    "SummaryLine",
    "SummaryRecall",
    "summary_docs",
    "summary_lines",
]

logger = logging.getLogger(__name__)

LineSource = Literal["summary", "structured"]

_INDEXED = re.compile(r"^- \[(?P<index>\d+)\] (?:(?P<who>[^:\[\]]{1,80}): )?(?P<text>.+)$")
_LINE_START = re.compile(r"\s+(?=- \[\d+\] )")
"""Where a line starts inside a tier kept from expired turns (its lines joined by spaces)."""
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")
_MIN_CHARS = 3


@dataclass(frozen=True, slots=True)
class SummaryLine:
    """One recallable line of a session's summary or structured memory."""

    key: str
    """The doc id's key: what the line is (source, turn, text) as a digest."""
    source: LineSource
    text: str
    """As recall shows it (``User: I picked up Monster volume 4 yesterday.``)."""
    search_text: str
    """As the index holds it (without the speaker label)."""
    turn_index: int | None
    label: str
    """The tier (``recent``, ``middle``, ``ancient``) or ``structured``."""
    created_at: datetime | None = None
    """When the pass that wrote it ran (the tier's time)."""


@dataclass(frozen=True, slots=True)
class CurrentSummary:
    """A session's records as recall checks them: the tiers and structured memory now
    stored, and their record versions (for the summary id)."""

    tiers: tuple[SummaryText, ...] = ()
    structured: StructuredMemory | None = None
    summary_version: int = 0
    structured_version: int = 0
    structured_at: datetime | None = None
    expires_at: datetime | None = None
    """The summary record's expiry (its documents expire with it)."""


SummaryReader = Callable[[str, bool], Awaitable[CurrentSummary]]
"""``async (session_id, with_structured) -> CurrentSummary`` (structured memory read only
when asked)."""


def _key(source: LineSource, turn_index: int | None, text: str) -> str:
    raw = f"v1\x1f{source}\x1f{turn_index}\x1f{' '.join(text.casefold().split())}"
    return ("l" if source == "summary" else "f") + hashlib.sha256(raw.encode()).hexdigest()[:20]


def _tier_pieces(text: str) -> list[str]:
    pieces: list[str] = []
    for raw in text.splitlines():
        for piece in _LINE_START.split(raw.strip()):
            if _INDEXED.match(piece) or piece.startswith("Also: "):
                pieces.append(piece)
            else:  # prose (an LLM's summary): one piece per sentence
                pieces.extend(_SENTENCE_END.split(piece))
    return [p.strip() for p in pieces if len(p.strip()) >= _MIN_CHARS]


def summary_lines(
    tiers: Sequence[SummaryText], structured: StructuredMemory | None = None
) -> list[SummaryLine]:
    """The recallable lines of a session's tiers (and structured memory, if given), each
    once (a line two tiers share is the older tier's). Pure."""
    out: dict[str, SummaryLine] = {}
    for tier in tiers:
        for piece in _tier_pieces(tier.text):
            match = _INDEXED.match(piece)
            index: int | None = None
            shown = search = piece
            if match is not None:
                index = int(match["index"])
                search = match["text"]
                shown = f"{match['who']}: {search}" if match["who"] else search
            elif piece.startswith("Also: "):
                search = shown = piece.removeprefix("Also: ")
            key = _key("summary", index, search)
            out.setdefault(
                key,
                SummaryLine(key, "summary", shown, search, index, tier.tier.value, tier.created_at),
            )
    if structured is not None:
        slots = [*structured.entities.items(), *structured.facts.items()]
        items = [(f"{slot}: {fact.value}", fact.turn_index) for slot, fact in slots]
        for label, group in (
            ("decision", structured.decisions),
            ("goal", structured.goals),
            ("unresolved", structured.unresolved),
        ):
            items.extend((f"{label}: {item.text}", item.turn_index) for item in group)
        for text, index in items:
            key = _key("structured", index, text)
            out.setdefault(key, SummaryLine(key, "structured", text, text, index, "structured"))
    return list(out.values())


def summary_docs(
    user_id: str,
    session_id: str,
    lines: Sequence[SummaryLine],
    *,
    said_at: Mapping[int, datetime],
    default_at: datetime,
    expires_at: datetime | None,
) -> list[IndexedDoc]:
    """The index documents of ``lines``. A line is dated by its turn's timestamp when
    ``said_at`` knows it (the turns the pass read), else by ``default_at`` (the pass's
    time), and tagged with date terms like a turn (its day, week, month and the dates it
    mentions, relative ones resolved against that date)."""
    docs = []
    for line in lines:
        at = said_at.get(line.turn_index) if line.turn_index is not None else None
        at = at or line.created_at or default_at
        docs.append(
            IndexedDoc(
                user_id=user_id,
                doc_id=summary_doc_id(session_id, line.key),
                kind="chunk",
                text=line.search_text,
                created_at=at,
                tags=tuple(turn_date_terms(line.search_text, at)),
                expires_at=expires_at,
            )
        )
    return docs


@dataclass(slots=True)
class SummaryRecallCounters:
    indexed: int = 0
    removed: int = 0
    failures: int = 0
    """Index writes that failed (logged); the summaries were committed all the same."""


class SummaryRecall:
    """Keeps a user's index in step with the summaries of their sessions, and resolves the
    documents for recall (see the module docstring).

    ``write`` indexes documents (default ``index.upsert``; the service passes
    :meth:`LongTermMemory.index_docs`, which embeds them first when the index holds
    vectors). ``read`` reads a session's current records. ``structured``: index structured
    memory's items too.
    """

    def __init__(
        self,
        index: SearchIndex,
        read: SummaryReader,
        *,
        write: Callable[[list[IndexedDoc]], Awaitable[None]] | None = None,
        structured: bool = True,
    ) -> None:
        self.index = index
        self._read = read
        self._write = write or index.upsert
        self.structured = structured
        self.counters = SummaryRecallCounters()

    def lines(
        self, tiers: Sequence[SummaryText], structured: StructuredMemory | None
    ) -> list[SummaryLine]:
        return summary_lines(tiers, structured if self.structured else None)

    async def replace(
        self,
        user_id: str,
        session_id: str,
        *,
        claimed: Collection[str],
        lines: Sequence[SummaryLine],
        turns: Mapping[int, Turn],
        at: datetime,
        expires_at: datetime | None,
    ) -> None:
        """Index ``lines`` (all of them: their expiry is renewed with the records') and
        remove the documents of the ``claimed`` keys they no longer have.

        Raises:
            BackendError: the index failed (the caller logs and counts it).
        """
        said_at = {i: t.timestamp for i, t in turns.items()}
        docs = summary_docs(
            user_id, session_id, lines, said_at=said_at, default_at=at, expires_at=expires_at
        )
        if docs:
            await self._write(docs)
        kept = {line.key for line in lines}
        await self.remove_keys(user_id, session_id, [k for k in claimed if k not in kept])
        self.counters.indexed += len(docs)

    async def remove_keys(self, user_id: str, session_id: str, keys: Collection[str]) -> None:
        """Remove the documents of the session's summary lines ``keys``.

        Raises:
            BackendError: the index failed.
        """
        if keys:
            await self.index.remove(user_id, [summary_doc_id(session_id, k) for k in keys])
            self.counters.removed += len(keys)

    def loader(
        self,
        list_sessions: Callable[[str], Awaitable[Sequence[str]]],
        *,
        concurrency: int = 4,
    ) -> Callable[[str], Awaitable[list[IndexedDoc]]]:
        """A ``WarmingIndex`` loader of the summary lines of the sessions
        ``list_sessions(user_id)`` names (the newest, bounded by the caller): one or two
        record reads per session, at most ``concurrency`` at once. Lines are dated by their
        tier's time (the turns may be gone)."""
        gate = asyncio.Semaphore(concurrency)

        async def one(user_id: str, session_id: str) -> list[IndexedDoc]:
            async with gate:
                found = await self._read(session_id, self.structured)
            lines = self.lines(found.tiers, found.structured)
            default = found.structured_at or max((t.created_at for t in found.tiers), default=None)
            if not lines or default is None:
                return []
            return summary_docs(
                user_id, session_id, lines, said_at={}, default_at=default,
                expires_at=found.expires_at,
            )  # fmt: skip

        async def load(user_id: str) -> list[IndexedDoc]:
            sessions = await list_sessions(user_id)
            loaded = await asyncio.gather(*(one(user_id, s) for s in sessions))
            return [doc for docs in loaded for doc in docs]

        return load

    async def resolve(self, user_id: str, doc_ids: Collection[str]) -> dict[str, ResolvedDoc]:
        """The recall :data:`~tiermem.longterm.recall.Resolver` of summary documents: text,
        provenance and date of each line the session's current records still hold (one
        read of the ``summary`` record per session, plus ``structured`` when an item of it
        is asked for). Other ids are left out: recall drops and unindexes them."""
        by_session: dict[str, set[str]] = {}
        for doc_id in doc_ids:
            parsed = parse_summary_doc_id(doc_id)
            if parsed is not None:
                by_session.setdefault(parsed[0], set()).add(parsed[1])
        sessions = list(by_session)
        current = await asyncio.gather(
            *(self._read(s, any(k.startswith("f") for k in by_session[s])) for s in sessions)
        )
        out: dict[str, ResolvedDoc] = {}
        for session_id, found in zip(sessions, current, strict=True):
            wanted = by_session[session_id]
            for line in summary_lines(found.tiers, found.structured):
                if line.key not in wanted:
                    continue
                if line.source == "summary":
                    summary_id = f"{session_id}:summary:v{found.summary_version}:{line.label}"
                    at = line.created_at
                else:
                    summary_id = f"{session_id}:structured:v{found.structured_version}"
                    at = found.structured_at
                out[summary_doc_id(session_id, line.key)] = ResolvedDoc(
                    text=line.text,
                    provenance=Provenance(
                        source=line.source,
                        session_id=session_id,
                        turn_indexes=() if line.turn_index is None else (line.turn_index,),
                        memory_ids=(summary_id,),
                    ),
                    created_at=at,
                )
        return out
