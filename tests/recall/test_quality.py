"""Recall quality on the hand-written fixture: a floor for BM25 alone, on every index.

The floors sit below what is measured (overall 0.72, lexical 0.98, Japanese 1.0 in-process;
the indexes score identically), so a change that breaks tokenization, scoring or candidate
gathering fails here. ``bench/recall.py --quality`` reports BM25 against embeddings.
"""

from __future__ import annotations

from tests.recall.quality import build_recaller, load_fixture, recall_at_k
from tiermem.longterm.index import SearchIndex


async def test_bm25_recall_at_5_floor(index: SearchIndex) -> None:
    fixture = load_fixture()
    assert len(fixture.memories) == 200
    assert len(fixture.queries) == 40
    report = await recall_at_k(await build_recaller(fixture, index=index), fixture, k=5)
    assert report.overall >= 0.65, report.misses
    assert report.by_category["lexical"] >= 0.9, report.misses
    assert report.by_category["japanese"] >= 0.75, report.misses
    # Paraphrases share no word with their answers: BM25 alone finds none of them today
    # (0.0); that is what embeddings are for, so no floor is asserted here and a better
    # lexical matcher is free to improve it.
