"""The pure recall scoring policy, as tables of cases."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.policies.recall import (
    RecallPolicy,
    RecallSignals,
    access_boost,
    is_relevant,
    normalized_cosine,
    rank_candidates,
    recency_decay,
    score_candidate,
)

DAY = timedelta(days=1)
POLICY = RecallPolicy()


@pytest.mark.parametrize(
    ("age", "expected"),
    [(-DAY, 1.0), (0 * DAY, 1.0), (30 * DAY, 0.5), (60 * DAY, 0.25), (15 * DAY, 2**-0.5)],
)
def test_recency_halves_every_half_life(age: timedelta, expected: float) -> None:
    assert recency_decay(age, 30 * DAY) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, 0.0), (-1, 0.0), (1, math.log(2) / math.log(51)), (50, 1.0), (5000, 1.0)],
)
def test_access_boost_is_log_scaled_and_capped(count: int, expected: float) -> None:
    assert access_boost(count, 50) == pytest.approx(expected)


def test_score_is_the_documented_weighted_sum() -> None:
    signals = RecallSignals(bm25=3.0, cosine=0.8, age=30 * DAY, importance=0.9, access_count=50)
    score = score_candidate(POLICY, signals, max_bm25=6.0, cosine_range=(0.2, 1.0))
    assert score.components == pytest.approx(
        {
            "bm25": 0.45 * 0.5,
            "embedding": 0.45 * 0.75,
            "recency": 0.10 * 0.5,
            "importance": 0.10 * 0.9,
            "access": 0.05 * 1.0,
        }
    )
    assert score.score == pytest.approx(sum(score.components.values()))


@pytest.mark.parametrize(
    ("signals", "part", "expected"),
    [
        (RecallSignals(cosine=-0.4), "embedding", 0.0),  # below the range: clamped
        (RecallSignals(cosine=None), "embedding", 0.0),
        (RecallSignals(age=None), "recency", 0.0),  # unknown age: no recency part
        (RecallSignals(importance=1.7), "importance", 0.10),  # clamped
        (RecallSignals(bm25=2.0), "bm25", 0.45),  # normalised by the max
    ],
)
def test_score_edges(signals: RecallSignals, part: str, expected: float) -> None:
    assert score_candidate(POLICY, signals, max_bm25=2.0).components[part] == pytest.approx(
        expected
    )


@pytest.mark.parametrize(
    ("cosine", "low", "high", "expected"),
    [
        (0.6, 0.2, 0.6, 1.0),  # the best semantic match counts fully
        (0.4, 0.2, 0.6, 0.5),
        (0.2, 0.2, 0.6, 0.0),
        (0.3, 0.3, 0.3, 1.0),  # no spread: a positive cosine counts fully
        (-0.1, -0.1, -0.1, 0.0),
        (None, 0.0, 1.0, 0.0),
    ],
)
def test_cosines_are_min_max_normalised(
    cosine: float | None, low: float, high: float, expected: float
) -> None:
    assert normalized_cosine(cosine, low, high) == pytest.approx(expected)


def test_the_best_semantic_match_weighs_as_much_as_the_best_lexical_one() -> None:
    # "Does she enjoy scary stories?": the keyword match shares only "enjoy", the paraphrase
    # about horror shares no word; raw cosines sit in a narrow band (0.2..0.56).
    ranked = dict(
        rank_candidates(
            POLICY,
            [
                ("keyword", RecallSignals(bm25=2.1, cosine=0.20, importance=0.7)),
                ("paraphrase", RecallSignals(bm25=0.0, cosine=0.56, importance=0.9)),
                ("middling", RecallSignals(bm25=1.0, cosine=0.38, importance=0.7)),
            ],
            k=3,
            require_relevance=True,
        )
    )
    assert ranked["keyword"].components["bm25"] == pytest.approx(0.45)
    assert ranked["keyword"].components["embedding"] == pytest.approx(0.0)
    assert ranked["paraphrase"].components["embedding"] == pytest.approx(0.45)
    assert ranked["paraphrase"].score > ranked["keyword"].score  # then the priors decide


@pytest.mark.parametrize(
    ("signals", "relevant"),
    [
        (RecallSignals(bm25=0.1), True),
        (RecallSignals(cosine=0.25), True),
        (RecallSignals(cosine=0.2), False),
        (RecallSignals(importance=1.0, age=0 * DAY, access_count=999), False),
    ],
)
def test_relevance_needs_a_term_or_a_close_embedding(
    signals: RecallSignals, relevant: bool
) -> None:
    assert is_relevant(POLICY, signals) is relevant


def test_a_matching_old_memory_beats_a_fresh_unrelated_important_one() -> None:
    ranked = rank_candidates(
        POLICY,
        [
            ("fresh", RecallSignals(bm25=0.0, age=0 * DAY, importance=1.0, access_count=50)),
            ("match", RecallSignals(bm25=1.0, age=365 * DAY, importance=0.3)),
        ],
        k=5,
        require_relevance=True,
    )
    assert [key for key, _ in ranked] == ["match"]


def test_among_equal_matches_recent_important_and_used_come_first() -> None:
    base = RecallSignals(bm25=1.0, age=100 * DAY, importance=0.5)
    ranked = rank_candidates(
        POLICY,
        [
            ("plain", base),
            ("used", RecallSignals(bm25=1.0, age=100 * DAY, importance=0.5, access_count=10)),
            ("important", RecallSignals(bm25=1.0, age=100 * DAY, importance=0.9)),
            ("recent", RecallSignals(bm25=1.0, age=1 * DAY, importance=0.5)),
        ],
        k=4,
        require_relevance=True,
    )
    assert [key for key, _ in ranked] == ["recent", "important", "used", "plain"]


def test_browsing_without_a_query_ranks_by_recency_importance_and_use() -> None:
    ranked = rank_candidates(
        POLICY,
        [
            ("old", RecallSignals(age=300 * DAY, importance=0.5)),
            ("new", RecallSignals(age=1 * DAY, importance=0.5)),
        ],
        k=1,
        require_relevance=False,
    )
    assert [key for key, _ in ranked] == ["new"]


def test_min_score_drops_weak_hits_and_ties_keep_input_order() -> None:
    policy = RecallPolicy(min_score=0.3)
    ranked = rank_candidates(
        policy,
        [
            ("b", RecallSignals(bm25=1.0)),
            ("a", RecallSignals(bm25=1.0)),
            ("weak", RecallSignals(bm25=0.1)),
        ],
        k=5,
        require_relevance=True,
    )
    assert [key for key, _ in ranked] == ["b", "a"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bm25_weight": -0.1},
        {"access_weight": math.nan},
        {
            "bm25_weight": 0,
            "embedding_weight": 0,
            "recency_weight": 0,
            "importance_weight": 0,
            "access_weight": 0,
        },
        {"recency_half_life": timedelta(0)},
        {"access_saturation": 0},
        {"min_cosine": 1.5},
        {"min_candidates": 0},
    ],
)
def test_bad_policies_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RecallPolicy(**kwargs)  # type: ignore[arg-type]


def test_candidate_count() -> None:
    assert POLICY.candidate_count(5) == 50
    assert POLICY.candidate_count(20) == 100


@given(
    st.lists(
        st.tuples(
            st.floats(0, 50),
            st.floats(-1, 1),
            st.integers(0, 1000),
            st.floats(0, 1),
            st.integers(0, 100),
        ),
        max_size=30,
    ),
    st.integers(1, 10),
)
def test_ranking_is_sorted_bounded_and_within_weights(
    rows: list[tuple[float, float, int, float, int]], k: int
) -> None:
    candidates = [
        (i, RecallSignals(bm25=b, cosine=c, age=d * DAY, importance=imp, access_count=a))
        for i, (b, c, d, imp, a) in enumerate(rows)
    ]
    ranked = rank_candidates(POLICY, candidates, k=k, require_relevance=True)
    scores = [score.score for _, score in ranked]
    assert scores == sorted(scores, reverse=True)
    assert len(ranked) <= k
    assert all(0.0 <= s <= 1.15 + 1e-9 for s in scores)  # the weights sum to 1.15
