"""Per-turn recall for the context window: the hits :meth:`Session.context` places before
the hot turns.

On top of :meth:`Recaller.recall <tiermem.longterm.recall.Recaller.recall>` (BM25, and
embeddings when configured), for a query asked now in a session:

1. **Query expansion**: dates the query mentions ("two days ago", "last week", "March 9")
   become the index's date terms (:mod:`tiermem.longterm.recall_dates`), resolved against
   now; configured aliases add their expansions ("AoT" → "Attack on Titan").
2. **Hot window out first**: turns of this session already in the hot window are dropped
   before the top ``k`` is taken, so they never use a recall slot.
3. **Second hop** (multi-hop questions; off by default, see ``docs/recall.md``): names in
   the best first-hop hits that the query did not say ("my nephew" → a hit "my nephew
   Kenji …" → "Kenji") are searched again with the query, and both rankings are fused by
   reciprocal rank (:func:`rrf_fuse`).
4. **De-duplication**: a memory and the turn it was extracted from (its provenance) are one
   fact: the better-ranked one stays. A summary line (or structured item) and its source
   turn are one too: the turn stays, with the better of the two scores (it brings its
   neighbour and its exact date); two summary-derived hits of one turn are one.
5. **Diversity** (:func:`diversify`): at most ``per_session`` hits of one session while
   others wait, and no near-duplicate text.
6. **Neighbours**: each turn hit brings the turn that completes its exchange (a user turn
   the assistant's answer after it, an assistant turn the question before it), marked
   ``neighbour_of``: the context places them only when every hit fits. They were read with
   the candidates (one ``get_turns`` per run of nearby candidate turns of a session), so
   this step reads nothing.

**Earlier sessions' summaries** (``policy.summaries``, on when the recaller has a summary
resolver, :mod:`tiermem.summaries.recall_docs`): their lines and structured items are
searched with the turns, so a session whose raw turns have expired (24 h) is still found
through its summary (30 days). The asking session's own summary lines are left out: its
summaries are in the context already.

Reads only; nothing is written to the history or the store.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tiermem.errors import ValidationError
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind
from tiermem.longterm.recall import SUMMARY_SOURCES, Recaller, turn_doc_id
from tiermem.longterm.recall_dates import query_date_terms
from tiermem.longterm.text import STOPWORDS, query_terms, tokenize
from tiermem.models import Turn
from tiermem.policies.recall import diversify, rrf_fuse

__all__ = [
    "ContextRecallPolicy",
    "expand_query",
    "hop_names",
    "is_summary_hit",
    "recall_for_context",
]

_NAME = re.compile(r"(?<![\w])([A-Z][a-z]{2,})\b")


@dataclass(frozen=True, slots=True)
class ContextRecallPolicy:
    """How per-turn recall picks its hits (see the module docstring)."""

    k: int = 8
    """Hits returned (neighbours come on top); the budget decides how many are placed."""
    candidates: int = 12
    """Hits considered before de-duplication and diversity (plus up to as many again for
    hot-window turns the search may return): each candidate turn is one store read. 8, 16
    and 30 measured the same on the fixture (``docs/recall.md``)."""
    per_session: int = 3
    max_overlap: float = 0.8
    second_hop: bool = False
    """Off by default: it measured no gain on the fixture and costs a second search."""
    hop_names: int = 3
    neighbours: bool = True
    dates: bool = True
    """Resolve the query's dates into the index's date terms."""
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Casefolded query word or phrase → what to add to the query when it appears."""
    summaries: bool = True
    """Search earlier sessions' summary lines and structured items too (when the recaller
    can resolve them)."""

    def __post_init__(self) -> None:
        if self.k < 1 or self.candidates < self.k or self.per_session < 1 or self.hop_names < 0:
            raise ValidationError(
                "ContextRecallPolicy needs k >= 1, candidates >= k, per_session >= 1 and "
                "hop_names >= 0"
            )


def expand_query(
    query: str, now: datetime, aliases: Mapping[str, Sequence[str]], *, dates: bool = True
) -> str:
    """The query with its resolved date terms (unless ``dates`` is off) and alias
    expansions appended."""
    lowered = query.casefold()
    extra = list(query_date_terms(query, now)) if dates else []
    for alias, expansions in aliases.items():
        if re.search(rf"(?<!\w){re.escape(alias.casefold())}(?!\w)", lowered):
            extra.extend(expansions)
    return f"{query} {' '.join(extra)}" if extra else query


def hop_names(query: str, hits: Sequence[RecallHit], limit: int) -> list[str]:
    """Capitalised names in ``hits`` (best first) that the query does not contain: the
    bridge entities of a multi-hop question. The first word of a text is skipped (it is
    capitalised by position, not by being a name)."""
    if limit < 1:
        return []
    said = set(query_terms(query))
    names: dict[str, None] = {}
    for hit in hits:
        for match in _NAME.finditer(hit.text):
            if match.start() == 0:
                continue
            word = match.group(1)
            terms = tokenize(word)
            if not terms or terms[0] in STOPWORDS or terms[0] in said:
                continue
            names.setdefault(word, None)
            if len(names) >= limit:
                return list(names)
    return list(names)


def is_summary_hit(hit: RecallHit) -> bool:
    """A line of a session summary or an item of structured memory."""
    return hit.kind == "chunk" and hit.provenance.source in SUMMARY_SOURCES


def _source_turns(hit: RecallHit) -> set[str]:
    provenance = hit.provenance
    if (hit.kind != "memory" and not is_summary_hit(hit)) or provenance.session_id is None:
        return set()
    return {turn_doc_id(provenance.session_id, i) for i in provenance.turn_indexes}


def _dedupe(ordered: Sequence[RecallHit]) -> list[RecallHit]:
    """One hit per fact (step 4 of the module docstring), best first. Of the hits that
    come from one turn, the raw turn is kept over a summary line, a summary line (the
    sentence as said) over a structured item (a slot's value), at the best rank among
    them; a memory and its turn keep the better-ranked."""
    fuller: dict[str, str] = {}
    """Turn doc id → the hit standing for it that a summary-derived hit defers to."""
    for hit in ordered:
        if hit.kind == "turn":
            fuller[hit.doc_id] = hit.doc_id
    for hit in ordered:
        if is_summary_hit(hit) and hit.provenance.source == "summary":
            for doc_id in _source_turns(hit):
                fuller.setdefault(doc_id, hit.doc_id)
    kept: list[tuple[int, RecallHit]] = []
    seen_turns: set[str] = set()
    covered: set[str] = set()
    """Turns a kept memory came from: the memory stands for them."""
    lines: set[str] = set()
    """Turns a kept summary line came from."""
    promoted: dict[str, tuple[int, float]] = {}
    """Hit → (rank, score) of a better-ranked summary hit that deferred to it."""
    for rank, hit in enumerate(ordered):
        if hit.kind == "turn" and hit.doc_id in covered:
            continue
        sources = _source_turns(hit)
        if is_summary_hit(hit):
            targets = {fuller[s] for s in sources if s in fuller} - {hit.doc_id}
            if targets:  # a fuller hit of its turn is there: it stays, at the better rank
                for doc_id in targets:
                    best = promoted.get(doc_id)
                    if best is None or rank < best[0]:
                        promoted[doc_id] = (rank, hit.score)
                continue
            if sources & (lines | covered):
                continue
            lines |= sources
        elif sources & (seen_turns | lines):
            continue
        if hit.kind == "memory":
            covered |= sources
        if hit.kind == "turn":
            seen_turns.add(hit.doc_id)
        kept.append((rank, hit))
    out: list[tuple[int, RecallHit]] = []
    for rank, hit in kept:
        better = promoted.get(hit.doc_id)
        if better is not None and better[0] < rank:
            hit = hit.model_copy(update={"score": max(hit.score, better[1])})
            rank = better[0]
        out.append((rank, hit))
    out.sort(key=lambda pair: pair[0])
    return [hit for _, hit in out]


async def recall_for_context(
    recaller: Recaller,
    user_id: str,
    query: str,
    *,
    now: datetime,
    scope: Collection[DocKind] = ("memory", "turn"),
    session_id: str | None = None,
    hot_indexes: Collection[int] = (),
    policy: ContextRecallPolicy | None = None,
) -> list[RecallHit]:
    """The hits for ``query`` asked now in ``session_id`` (whose turns ``hot_indexes`` are
    in the hot window), best first, then their neighbours (see the module docstring).

    Raises:
        ValidationError: bad ids or scope (from :meth:`Recaller.recall`).
        BackendError: the index or the durable store failed.
    """
    policy = policy or ContextRecallPolicy()
    hot = {turn_doc_id(session_id, i) for i in hot_indexes} if session_id is not None else set()

    def fresh(hits: Sequence[RecallHit]) -> list[RecallHit]:
        # The asking session's summary is in the context already, as its own sections.
        return [
            h
            for h in hits
            if not (h.kind == "turn" and h.doc_id in hot)
            and not (is_summary_hit(h) and session_id is not None and h.session_id == session_id)
        ]

    expanded = expand_query(query, now, policy.aliases, dates=policy.dates)
    limit = min(100, policy.candidates + min(len(hot), policy.candidates))
    # Candidate turns are read with their neighbours, so step 6 reads nothing more.
    read: dict[str, Turn | None] = {}
    first = fresh(
        await recaller.recall(
            user_id,
            expanded,
            k=limit,
            scope=scope,
            candidates=limit,
            turns_read=read,
            summaries=policy.summaries,
            embed_missing=False,  # turns and memories were embedded when indexed
        )
    )
    by_id = {h.doc_id: h for h in first}
    rankings = [[h.doc_id for h in first]]
    if policy.second_hop and first:
        names = hop_names(query, first[:3], policy.hop_names)
        if names:
            second = fresh(
                await recaller.recall(
                    user_id,
                    f"{expanded} {' '.join(names)}",
                    k=limit,
                    scope=scope,
                    candidates=limit,
                    turns_read=read,
                    summaries=policy.summaries,
                    embed_missing=False,
                )
            )
            for h in second:
                by_id.setdefault(h.doc_id, h)
            rankings.append([h.doc_id for h in second])
    ordered = [by_id[doc_id] for doc_id, _ in rrf_fuse(rankings)]

    kept = _dedupe(ordered)
    by_id.update((h.doc_id, h) for h in kept)

    picked_ids = diversify(
        ((h.doc_id, h.session_id or h.kind, frozenset(tokenize(h.text))) for h in kept),
        limit=policy.k,
        per_group=policy.per_session,
        max_overlap=policy.max_overlap,
    )
    picked = [by_id[doc_id] for doc_id in picked_ids]
    if not policy.neighbours:
        return picked
    taken = {h.doc_id for h in picked} | hot
    neighbours = await recaller.neighbour_turns(picked, exclude=taken, known=read)
    return picked + neighbours
