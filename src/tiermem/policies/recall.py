"""Recall scoring: how a candidate's relevance, age, importance and use make one score.

Pure: values in, values out. :class:`~tiermem.longterm.recall.Recaller` gathers the
signals of each candidate (BM25 from the index, cosine from the embeddings, age, importance
and access count from the record) and this module ranks them::

    score = w_bm25       · bm25 / max bm25                                  (0..1)
          + w_embedding  · (cos - min cos) / (max cos - min cos)            (0..1)
          + w_recency    · 0.5 ^ (age / half_life)                          (1 now, ½ at half-life)
          + w_importance · importance                                       (0..1)
          + w_access     · min(1, ln(1 + accesses) / ln(1 + saturation))

where max and min are taken over the candidates of the recall (after the relevance
filter below). Both relevance signals are normalised within the candidate set because
their raw scales mean nothing to each other: BM25 grows with the query's length and rare
words, and a sentence model's cosines sit in a narrow band (all-MiniLM-L6-v2: about 0.0-0.3
for unrelated text, 0.4-0.8 for related). Min-max normalisation of the cosine, the convex
combination studied by Bruch et al. (2023, "An Analysis of Fusion Functions for Hybrid
Retrieval"), lets the best semantic match weigh as much as the best lexical one; without it
a paraphrase that shares no word loses to any weak keyword match. When all candidates have
the same cosine, it counts fully if positive. Without an embedder the part is 0.

Defaults (:class:`RecallPolicy`): bm25 0.45, embedding 0.45, recency 0.10 with a 30-day
half-life, importance 0.10, access 0.05 saturating at 50 accesses. Relevance carries
0.9 of the 1.15 total, so an old, important memory that matches the query beats a fresh,
unrelated one; among equally relevant memories the recent, important and often-used ones
come first. (On the fixture in ``tests/recall/data``, 0.15 for recency and importance
cost 0.03 of recall@5 with embeddings; see ``docs/recall.md``.)

A candidate with a query must be relevant: it matched at least one query term (bm25 > 0)
or its raw cosine is at least ``min_cosine``. Without query terms (an empty query, or only
stopwords) and without an embedding, nothing is relevant by text, and ranking falls back to
recency, importance and use: the "what do I know about this user" case.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal, TypeVar

from tiermem.errors import ValidationError

__all__ = [
    "RRF_K",
    "RecallPolicy",
    "RecallScore",
    "RecallSignals",
    "access_boost",
    "diversify",
    "is_relevant",
    "normalized_cosine",
    "rank_candidates",
    "recency_decay",
    "rrf_fuse",
    "score_candidate",
    "token_overlap",
]

K = TypeVar("K", bound=Hashable)

RRF_K = 60
"""The rank constant of reciprocal rank fusion (Cormack et al., 2009): large enough that
the first few ranks of each list weigh about the same."""


@dataclass(frozen=True, slots=True)
class RecallPolicy:
    """The weights and thresholds of recall scoring (see the module docstring)."""

    bm25_weight: float = 0.45
    embedding_weight: float = 0.45
    recency_weight: float = 0.10
    importance_weight: float = 0.10
    access_weight: float = 0.05
    recency_half_life: timedelta = timedelta(days=30)
    access_saturation: int = 50
    """Accesses at which the access part reaches its full weight (log-scaled below)."""
    min_cosine: float = 0.25
    """Cosine a candidate without a matching term needs to count as relevant."""
    min_score: float = 0.0
    """Hits scoring below this are dropped."""
    fusion: Literal["convex", "rrf"] = "convex"
    """How BM25 and the embedding combine: ``convex`` (min-max normalised scores, weighted)
    or ``rrf`` (each part is the candidate's reciprocal rank in its list, ``1 / (RRF_K +
    rank)``, scaled so the first rank gives 1; see :func:`rrf_fuse`)."""
    min_candidates: int = 50
    candidates_per_hit: int = 5
    """Candidates read per source: max(min_candidates, candidates_per_hit · k)."""

    def __post_init__(self) -> None:
        weights = {
            "bm25_weight": self.bm25_weight,
            "embedding_weight": self.embedding_weight,
            "recency_weight": self.recency_weight,
            "importance_weight": self.importance_weight,
            "access_weight": self.access_weight,
        }
        for name, value in weights.items():
            if not math.isfinite(value) or value < 0:
                raise ValidationError(f"RecallPolicy.{name} must be a finite number >= 0")
        if not any(weights.values()):
            raise ValidationError("RecallPolicy needs at least one positive weight")
        if self.recency_half_life <= timedelta(0):
            raise ValidationError("RecallPolicy.recency_half_life must be positive")
        if self.access_saturation < 1:
            raise ValidationError("RecallPolicy.access_saturation must be at least 1")
        if not -1.0 <= self.min_cosine <= 1.0:
            raise ValidationError("RecallPolicy.min_cosine must be in [-1, 1]")
        if self.fusion not in ("convex", "rrf"):
            raise ValidationError(f"RecallPolicy.fusion is 'convex' or 'rrf', not {self.fusion!r}")
        if self.min_candidates < 1 or self.candidates_per_hit < 1:
            raise ValidationError(
                "RecallPolicy.min_candidates and candidates_per_hit must be at least 1"
            )

    def candidate_count(self, k: int) -> int:
        """How many candidates each source (BM25, vectors, recent) contributes for top ``k``."""
        return max(self.min_candidates, self.candidates_per_hit * k)


@dataclass(frozen=True, slots=True)
class RecallSignals:
    """What is known about one candidate. ``None``: the signal does not exist for it."""

    bm25: float = 0.0
    """Raw BM25 from the index (0: no query term matched)."""
    cosine: float | None = None
    """Cosine between the query's and the candidate's embeddings, if both exist."""
    age: timedelta | None = None
    """Now minus the candidate's creation; None when unknown (no recency part)."""
    importance: float = 0.5
    access_count: int = 0


@dataclass(frozen=True, slots=True)
class RecallScore:
    score: float
    components: dict[str, float]
    """The weighted parts: bm25, embedding, recency, importance, access."""


def recency_decay(age: timedelta, half_life: timedelta) -> float:
    """``0.5 ** (age / half_life)``: 1 for now (or the future), 0.5 at one half-life."""
    if age <= timedelta(0):
        return 1.0
    return float(0.5 ** (age / half_life))


def access_boost(access_count: int, saturation: int) -> float:
    """``ln(1 + count) / ln(1 + saturation)``, capped at 1: the first uses count most."""
    if access_count <= 0:
        return 0.0
    return min(1.0, math.log1p(access_count) / math.log1p(saturation))


def is_relevant(policy: RecallPolicy, signals: RecallSignals) -> bool:
    """Whether a candidate answers the query: a matched term, or a close enough embedding."""
    return signals.bm25 > 0.0 or (
        signals.cosine is not None and signals.cosine >= policy.min_cosine
    )


def normalized_cosine(cosine: float | None, low: float, high: float) -> float:
    """``cosine`` min-max normalised to the candidates' range [low, high]; see the module."""
    if cosine is None:
        return 0.0
    if high > low:
        return min(1.0, max(0.0, (cosine - low) / (high - low)))
    return 1.0 if cosine > 0.0 else 0.0


def score_candidate(
    policy: RecallPolicy,
    signals: RecallSignals,
    *,
    max_bm25: float,
    cosine_range: tuple[float, float] = (0.0, 1.0),
) -> RecallScore:
    """The score of one candidate; ``max_bm25`` is the largest BM25 among the candidates,
    ``cosine_range`` the smallest and largest cosine among those that have one."""
    bm25 = signals.bm25 / max_bm25 if max_bm25 > 0.0 else 0.0
    cosine = normalized_cosine(signals.cosine, *cosine_range)
    recency = (
        recency_decay(signals.age, policy.recency_half_life) if signals.age is not None else 0.0
    )
    components = {
        "bm25": policy.bm25_weight * bm25,
        "embedding": policy.embedding_weight * cosine,
        "recency": policy.recency_weight * recency,
        "importance": policy.importance_weight * min(1.0, max(0.0, signals.importance)),
        "access": policy.access_weight
        * access_boost(signals.access_count, policy.access_saturation),
    }
    return RecallScore(score=math.fsum(components.values()), components=components)


def rank_candidates(
    policy: RecallPolicy,
    candidates: Iterable[tuple[K, RecallSignals]],
    *,
    k: int,
    require_relevance: bool,
) -> list[tuple[K, RecallScore]]:
    """The best ``k`` candidates, best first; ties keep the order of ``candidates``.

    With ``require_relevance`` (a query with terms, or an embedded query), candidates that
    are not :func:`is_relevant` are dropped first. Then the score is computed with BM25
    normalised by the largest BM25 left and the cosine by the range of those left, and hits
    under ``min_score`` are dropped.
    """
    if k < 1:
        raise ValidationError(f"k must be at least 1, got {k}")
    kept = [
        (key, signals)
        for key, signals in candidates
        if not require_relevance or is_relevant(policy, signals)
    ]
    if policy.fusion == "rrf" and any(signals.cosine is not None for _, signals in kept):
        kept = _reciprocal_ranks(kept)
        max_bm25, cosine_range = 1.0, (0.0, 1.0)
    else:
        max_bm25 = max((signals.bm25 for _, signals in kept), default=0.0)
        cosines = [signals.cosine for _, signals in kept if signals.cosine is not None]
        cosine_range = (min(cosines), max(cosines)) if cosines else (0.0, 1.0)
    scored = [
        (key, score_candidate(policy, signals, max_bm25=max_bm25, cosine_range=cosine_range))
        for key, signals in kept
    ]
    scored = [(key, score) for key, score in scored if score.score >= policy.min_score]
    order = sorted(range(len(scored)), key=lambda i: (-scored[i][1].score, i))
    return [scored[i] for i in order[:k]]


# -- fusion and diversity (per-turn recall for the context) ------------------------------------


def _reciprocal_ranks(
    candidates: list[tuple[K, RecallSignals]],
) -> list[tuple[K, RecallSignals]]:
    """The candidates with BM25 and cosine replaced by their reciprocal rank in each list
    (``(RRF_K + 1) / (RRF_K + rank)``: 1 for the first, about 0.5 at rank 61); 0 (no
    cosine: None) for a candidate absent from a list."""
    by_bm25 = sorted(
        (i for i, (_, s) in enumerate(candidates) if s.bm25 > 0),
        key=lambda i: -candidates[i][1].bm25,
    )
    by_cosine = sorted(
        (i for i, (_, s) in enumerate(candidates) if s.cosine is not None),
        key=lambda i: -(candidates[i][1].cosine or 0.0),
    )
    bm25_rank = {i: r for r, i in enumerate(by_bm25, start=1)}
    cosine_rank = {i: r for r, i in enumerate(by_cosine, start=1)}
    out = []
    for i, (key, signals) in enumerate(candidates):
        bm25 = (RRF_K + 1) / (RRF_K + bm25_rank[i]) if i in bm25_rank else 0.0
        cos = (RRF_K + 1) / (RRF_K + cosine_rank[i]) if i in cosine_rank else None
        out.append((key, replace(signals, bm25=bm25, cosine=cos)))
    return out


def rrf_fuse(rankings: Sequence[Sequence[K]], *, k: int = RRF_K) -> list[tuple[K, float]]:
    """Reciprocal rank fusion: ``score(d) = Σ 1 / (k + rank of d in each list)`` (rank from
    1), best first; ties keep first-seen order. Rank-based, so lists with unrelated score
    scales (BM25, cosine, a second hop) fuse without normalising.

    Raises:
        ValidationError: ``k`` < 1.
    """
    if k < 1:
        raise ValidationError(f"the RRF constant must be at least 1, got {k}")
    scores: dict[K, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(dict.fromkeys(ranking), start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    items = list(scores.items())
    return sorted(items, key=lambda item: -item[1])  # stable: ties keep first-seen order


def token_overlap(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard overlap of two term sets (0 when both are empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def diversify(
    items: Iterable[tuple[K, Hashable, frozenset[str]]],
    *,
    limit: int,
    per_group: int,
    max_overlap: float = 0.8,
) -> list[K]:
    """Pick up to ``limit`` of ``items`` (best first: ``(key, group, terms)``, read lazily
    and only until ``limit`` are picked) with at most
    ``per_group`` from one group (a session) and none whose terms overlap an already
    picked item's by more than ``max_overlap`` (a near duplicate says nothing new).

    Items passed over for their group come back, in order, if fewer than ``limit`` were
    picked: the cap spreads hits over sessions, it does not leave room empty. Near
    duplicates never come back.

    Raises:
        ValidationError: ``limit`` or ``per_group`` < 1, ``max_overlap`` outside [0, 1].
    """
    if limit < 1 or per_group < 1:
        raise ValidationError("diversify needs limit >= 1 and per_group >= 1")
    if not 0.0 <= max_overlap <= 1.0:
        raise ValidationError(f"max_overlap must be in [0, 1], got {max_overlap}")
    picked: list[tuple[K, frozenset[str]]] = []
    deferred: list[tuple[K, frozenset[str]]] = []
    counts: dict[Hashable, int] = {}

    def novel(terms: frozenset[str]) -> bool:
        return all(token_overlap(terms, other) <= max_overlap for _, other in picked)

    for key, group, terms in items:
        if len(picked) >= limit:
            break
        if not novel(terms):
            continue
        if counts.get(group, 0) >= per_group:
            deferred.append((key, terms))
            continue
        counts[group] = counts.get(group, 0) + 1
        picked.append((key, terms))
    for key, terms in deferred:
        if len(picked) >= limit:
            break
        if novel(terms):
            picked.append((key, terms))
    return [key for key, _ in picked]
