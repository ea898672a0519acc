"""The per-turn recall block of a context window: which hits fit, and how they read.

Pure. Hits are chosen best first within the room left (a hit too large for what is left is
skipped, a smaller one after it may still fit); the turn that completes a chosen hit's
exchange (``RecallHit.neighbour_of``) follows it at once for the :data:`LEAD_NEIGHBOURS`
best hits, and for the others only after every hit has had its chance.
The chosen items are then laid out: memories and knowledge chunks first, by score, then
the turns by **dated session**: one header per earlier session ("Session s1 — Tuesday
2026-03-10:") with its turns in order, oldest session first. A turn's relative dates are
shown resolved against the day it was said ("yesterday → 2026-03-09"), so "when did …"
questions can be answered from the block. Lines of an earlier session's summary and items
of its structured memory (kept 30 days, after its raw turns have expired) go under the same
dated header, marked ``[summary, turn 12]`` / ``[structured, turn 12]``, in turn order with
the session's turns, with provenance tier ``session``, the summary id and the turn. Every
item keeps its own provenance (session id and turn index, memory id, summary id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from tiermem.context.models import ItemProvenance, SourceTier
from tiermem.context.truncate import message_tokens
from tiermem.longterm.recall_dates import find_date_mentions
from tiermem.models import TextBlock, ToolResultBlock
from tiermem.tokens import TokenCounter

if TYPE_CHECKING:
    from tiermem.longterm.hits import RecallHit

__all__ = ["MAX_RECALL_CHARS", "RECALL_HEADER", "RecallItem", "plan_recall_block"]

RECALL_HEADER = "Recalled for this message (from earlier turns and memories, not said now):"
MAX_RECALL_CHARS = 600
"""A recalled item longer than this is cut (with "…") so one hit cannot crowd out the rest."""

LEAD_NEIGHBOURS = 3
"""The best hits whose neighbours are placed right after them; the neighbours of the
others only once every hit has been offered."""

_HIT_TIERS: dict[str, SourceTier] = {"turn": "archive", "memory": "longterm", "chunk": "knowledge"}
_SUMMARY_SOURCES = frozenset({"summary", "structured"})
"""``Provenance.source`` of summary lines (``tiermem.longterm.recall.SUMMARY_SOURCES``)."""


@dataclass(frozen=True, slots=True)
class RecallItem:
    """One placed recall item: its text (headers included), tokens and provenance."""

    text: str
    tokens: int
    provenance: ItemProvenance
    name: str


def _clip(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_RECALL_CHARS:
        text = text[: MAX_RECALL_CHARS - 1].rstrip() + "…"
    return text


def _is_summary(hit: RecallHit) -> bool:
    return hit.kind == "chunk" and hit.provenance.source in _SUMMARY_SOURCES


def _when(hit: RecallHit) -> datetime | None:
    return hit.turn.timestamp if hit.turn is not None else hit.created_at


def _session_key(hit: RecallHit) -> str | None:
    if hit.kind == "turn" and hit.turn is not None:
        return hit.session_id
    if _is_summary(hit) and hit.session_id is not None and hit.created_at is not None:
        return hit.session_id
    return None


def _session_header(session_id: str | None, day: datetime) -> str:
    return f"Session {session_id} — {day:%A} {day.date().isoformat()}:"


def _turn_of(hit: RecallHit) -> int:
    if hit.turn is not None:
        return hit.turn.index
    indexes = hit.provenance.turn_indexes
    return indexes[0] if indexes else 1 << 62


def hit_line(hit: RecallHit, *, in_session: bool) -> str:
    """One hit as a line; under a session header a turn line omits the session and date."""
    text = _clip(hit.text)
    if hit.kind == "turn" and hit.turn is not None:
        turn = hit.turn
        resolved = [
            f"{m.phrase} → {m.day.isoformat()}"
            for m in find_date_mentions(hit.text, turn.timestamp)
            if m.relative and m.precision == "day"
        ]
        dates = f" ({'; '.join(resolved)})" if resolved else ""
        day = turn.timestamp.date().isoformat()
        who: str = turn.role
        if any(type(block) is ToolResultBlock for block in turn.content):
            # Seed 000's anti-pattern: a stored tool result read back as today's data
            # (stock, prices). Said as what it is, and as of when.
            who = "tool result"
            dates += f" (data as of {day}; fetch it again before relying on it)"
        if in_session:
            return f"- [{who}, turn {turn.index}] {text}{dates}"
        where = f"session {hit.session_id}, " if hit.session_id else ""
        return f"- [{who}, {where}turn {turn.index}, {day}] {text}{dates}"
    if hit.kind == "memory" and hit.memory is not None:
        return f"- [{hit.memory.memory_type}, {hit.memory.created_at.date().isoformat()}] {text}"
    if _is_summary(hit):
        indexes = hit.provenance.turn_indexes
        where = f", turn {indexes[0]}" if indexes else ""
        dates = ""
        if hit.created_at is not None:
            resolved = [
                f"{m.phrase} → {m.day.isoformat()}"
                for m in find_date_mentions(hit.text, hit.created_at)
                if m.relative and m.precision == "day"
            ]
            dates = f" ({'; '.join(resolved)})" if resolved else ""
        if in_session:
            return f"- [{hit.provenance.source}{where}] {text}{dates}"
        return f"- [{hit.provenance.source}, session {hit.session_id}{where}] {text}{dates}"
    return f"- [{hit.kind}] {text}"


def hit_provenance(hit: RecallHit) -> ItemProvenance:
    if _is_summary(hit):
        ids = hit.provenance.memory_ids
        return ItemProvenance(
            tier="session",
            session_id=hit.session_id or hit.provenance.session_id,
            turn_indexes=hit.provenance.turn_indexes,
            summary_id=ids[0] if ids else None,
        )
    tier: SourceTier = _HIT_TIERS[hit.kind]
    session_id = hit.session_id or hit.provenance.session_id
    indexes = hit.provenance.turn_indexes
    if hit.turn is not None:
        indexes = (hit.turn.index,)
    memory_ids = (hit.doc_id,) if hit.kind == "memory" else hit.provenance.memory_ids
    return ItemProvenance(
        tier=tier,
        session_id=session_id,
        turn_indexes=tuple(indexes),
        memory_ids=tuple(memory_ids),
    )


def _layout(chosen: Sequence[RecallHit], counter: TokenCounter) -> list[RecallItem]:
    sessions: dict[str, list[RecallHit]] = {}
    others: list[RecallHit] = []
    for hit in chosen:
        key = _session_key(hit)
        if key is None:
            others.append(hit)
        else:
            sessions.setdefault(key, []).append(hit)
    groups = sorted(
        ((min(w for h in hits if (w := _when(h)) is not None), hits) for hits in sessions.values()),
        key=lambda pair: pair[0],
    )
    items = [_item(hit_line(hit, in_session=False), hit, counter) for hit in others]
    for day, group in groups:
        group.sort(key=lambda h: (_turn_of(h), h.kind != "turn"))
        for i, hit in enumerate(group):
            line = hit_line(hit, in_session=True)
            header = _session_header(hit.session_id, day)
            items.append(_item(f"{header}\n{line}" if i == 0 else line, hit, counter))
    if items:
        first = items[0]
        items[0] = _item(f"{RECALL_HEADER}\n{first.text}", None, counter, like=first)
    return items


def _item(
    text: str, hit: RecallHit | None, counter: TokenCounter, *, like: RecallItem | None = None
) -> RecallItem:
    tokens = message_tokens((TextBlock(text=text),), counter)
    if like is not None:
        return RecallItem(text, tokens, like.provenance, like.name)
    assert hit is not None
    return RecallItem(text, tokens, hit_provenance(hit), hit.kind)


def plan_recall_block(
    hits: Sequence[RecallHit], room: int, counter: TokenCounter
) -> tuple[list[RecallItem], int]:
    """The recall items that fit in ``room`` tokens, laid out (see the module docstring),
    and how many of ``hits`` (neighbours not counted) were left out.

    ``hits`` are already filtered (nothing in the hot window or the profile, no repeats).
    The items' tokens never add up to more than ``room``.
    """
    primaries = sorted((h for h in hits if h.neighbour_of is None), key=lambda h: -h.score)
    neighbours = [h for h in hits if h.neighbour_of is not None]
    header_cost = message_tokens((TextBlock(text=RECALL_HEADER),), counter)
    chosen: list[RecallHit] = []
    sessions: set[str] = set()
    used = 0

    def cost(hit: RecallHit) -> int:
        key = _session_key(hit)
        line = hit_line(hit, in_session=key is not None)
        when = _when(hit)
        if key is not None and key not in sessions and when is not None:
            line = f"{_session_header(key, when)}\n{line}"
        return message_tokens((TextBlock(text=line),), counter) + (0 if chosen else header_cost)

    def offer(hit: RecallHit) -> bool:
        nonlocal used
        needed = cost(hit)
        if used + needed > room:
            return False
        chosen.append(hit)
        used += needed
        key = _session_key(hit)
        if key is not None:
            sessions.add(key)
        return True

    by_hit: dict[str, list[RecallHit]] = {}
    for hit in neighbours:
        by_hit.setdefault(hit.neighbour_of or "", []).append(hit)
    placed = 0
    kept_ids: set[str] = set()

    def offer_neighbours(of: str) -> None:
        for neighbour in by_hit.pop(of, []):
            if neighbour.doc_id not in kept_ids and offer(neighbour):
                kept_ids.add(neighbour.doc_id)

    for rank, hit in enumerate(primaries):
        if hit.doc_id in kept_ids or not offer(hit):
            continue
        placed += 1
        kept_ids.add(hit.doc_id)
        if rank < LEAD_NEIGHBOURS:
            offer_neighbours(hit.doc_id)
    for hit in primaries:
        if hit.doc_id in kept_ids:
            offer_neighbours(hit.doc_id)
    items = _layout(chosen, counter)
    # Costs were counted line by line; the laid-out texts can tokenize a little
    # differently, so drop the last chosen until the real total fits.
    while items and sum(i.tokens for i in items) > room:
        dropped = chosen.pop()
        if dropped.neighbour_of is None:
            placed -= 1
        items = _layout(chosen, counter)
    return items, len(primaries) - placed
