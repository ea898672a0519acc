"""The recall-quality fixture (``data/manga_recall.json``) and recall@k over it.

Shared by ``test_quality.py`` (a floor for BM25 alone) and ``bench/recall.py --quality``
(BM25 versus embeddings, reported, not asserted).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tiermem.clock import FakeClock
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import Recaller, memory_doc
from tiermem.models import MemoryRecord
from tiermem.store.backends.memory import MemoryDurableStore

FIXTURE = Path(__file__).parent / "data" / "manga_recall.json"


@dataclass(frozen=True)
class Query:
    query_id: str
    category: str
    text: str
    relevant: tuple[str, ...]


@dataclass(frozen=True)
class Fixture:
    user_id: str
    now: datetime
    memories: tuple[MemoryRecord, ...]
    queries: tuple[Query, ...]


@dataclass
class QualityReport:
    k: int
    overall: float
    by_category: dict[str, float]
    per_query: dict[str, float] = field(default_factory=dict)
    misses: dict[str, list[str]] = field(default_factory=dict)


def load_fixture(path: Path = FIXTURE) -> Fixture:
    raw = json.loads(path.read_text(encoding="utf-8"))
    user_id = raw["user_id"]
    return Fixture(
        user_id=user_id,
        now=datetime.fromisoformat(raw["now"]),
        memories=tuple(
            MemoryRecord.model_validate({**m, "user_id": user_id}) for m in raw["memories"]
        ),
        queries=tuple(
            Query(q["query_id"], q["category"], q["text"], tuple(q["relevant"]))
            for q in raw["queries"]
        ),
    )


async def build_recaller(
    fixture: Fixture,
    *,
    embedder: Embedder | None = None,
    index: SearchIndex | None = None,
) -> Recaller:
    """The fixture's memories in an in-memory store and ``index`` (in-process by default);
    with an embedder, every memory carries its embedding, as the write path stores it."""
    clock = FakeClock(fixture.now)
    store = MemoryDurableStore(clock=clock)
    index = index or InProcessIndex()
    records: Sequence[MemoryRecord] = fixture.memories
    if embedder is not None:
        vectors = await embedder.embed([m.content for m in records])
        records = [
            m.model_copy(update={"embedding": tuple(v), "embedding_model": embedder.model_id})
            for m, v in zip(records, vectors, strict=True)
        ]
    for record in records:
        await store.put_memory(record)
    await index.upsert([memory_doc(r) for r in records])
    return Recaller(store, index, clock=clock, embedder=embedder)


async def recall_at_k(recaller: Recaller, fixture: Fixture, *, k: int = 5) -> QualityReport:
    """Mean over queries of |relevant ∩ top k| / |relevant|, overall and per category."""
    per_query: dict[str, float] = {}
    misses: dict[str, list[str]] = {}
    for query in fixture.queries:
        hits = await recaller.recall(fixture.user_id, query.text, k=k)
        found = {h.doc_id for h in hits}
        per_query[query.query_id] = len(found & set(query.relevant)) / len(query.relevant)
        missed = [r for r in query.relevant if r not in found]
        if missed:
            misses[query.query_id] = missed
    categories: dict[str, list[float]] = {}
    for query in fixture.queries:
        categories.setdefault(query.category, []).append(per_query[query.query_id])
    return QualityReport(
        k=k,
        overall=sum(per_query.values()) / len(per_query),
        by_category={c: sum(v) / len(v) for c, v in sorted(categories.items())},
        per_query=per_query,
        misses=misses,
    )
