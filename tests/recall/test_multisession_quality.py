"""Quality regression on a slice of the multi-session recall fixture: per-turn recall must
put every evidence turn in the context for clearly more questions than BM25 over raw
turns, by the same harness (``bench/recall_quality.py`` runs the whole fixture)."""

from __future__ import annotations

from tiermem.testing.recall_fixture import generate_recall_fixture
from tiermem.testing.recall_harness import evaluate_recall_quality

MARGIN = 0.10
"""Points over BM25 at 2k the engine must keep (the full fixture measures about 20)."""


async def test_engine_beats_bm25_and_the_last_n_window_on_a_fixture_slice() -> None:
    conversations = generate_recall_fixture(3, seed=100)
    report = await evaluate_recall_quality(conversations, budgets=(2048,))
    assert report.questions == sum(len(c.questions) for c in conversations)
    engine, bm25, last_n = (report.share(m, 2048) for m in ("engine", "bm25", "last_n"))
    assert engine >= bm25 + MARGIN, report.to_json()
    assert engine > last_n, report.to_json()


def test_fixture_is_deterministic_dated_and_evidence_is_outside_the_hot_window() -> None:
    one, again = generate_recall_fixture(2), generate_recall_fixture(2)
    assert [c.to_json() for c in one] == [c.to_json() for c in again]
    for conv in one:
        dates = [s.started_at for s in conv.sessions]
        assert dates == sorted(dates)
        assert len(set(d.date() for d in dates)) == len(dates)
        assert sum(len(s.turns) for s in conv.sessions) >= 300
        current = conv.current
        for q in conv.questions:
            assert 1 <= len(q.evidence) <= 3
            for session_id, index in q.evidence:
                if session_id == current.session_id:
                    assert index < len(current.turns) - 20
        assert {q.kind for q in conv.questions} >= {"multi_hop", "temporal", "paraphrase"}
