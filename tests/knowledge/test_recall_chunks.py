"""Knowledge chunks through recall: the Recaller finds chunks in the index and resolves them
with :meth:`KnowledgeBase.resolve_chunks`, so hits carry the chunk's text and provenance."""

from __future__ import annotations

import pytest

from tests.knowledge.support import POLICY, USER, WordHashEmbedder, knowledge
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.knowledge import parse_chunk_doc_id
from tiermem.longterm.recall import Recaller
from tiermem.store.contract import DurableStore
from tiermem.testing import FakeClock


@pytest.mark.parametrize("with_embeddings", [False, True], ids=["bm25", "hybrid"])
async def test_recall_returns_chunks_with_their_document_as_provenance(
    durable: DurableStore,
    clock: FakeClock,
    with_embeddings: bool,
) -> None:
    index = InProcessIndex()
    embedder = WordHashEmbedder() if with_embeddings else None
    kb = knowledge(durable, index, clock, embedder=embedder)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    recaller = Recaller(durable, index, clock=clock, embedder=embedder)
    recaller.register_resolver("chunk", kb.resolve_chunks)

    hits = await recaller.recall(USER, "Osaka warehouse shipping", k=3, scope=("chunk",))

    assert hits
    best = hits[0]
    assert best.kind == "chunk"
    assert "Osaka warehouse" in best.text
    assert best.provenance.source == "document"
    assert best.provenance.memory_ids == (doc.document_id,)
    parsed = parse_chunk_doc_id(best.doc_id)
    assert parsed is not None
    assert parsed[0] == doc.document_id
    chunks = await kb.get_chunks(USER, doc.document_id)
    assert chunks[parsed[1]].text == best.text

    await kb.delete_document(USER, doc.document_id)
    assert await recaller.recall(USER, "Osaka warehouse shipping", k=3, scope=("chunk",)) == []
