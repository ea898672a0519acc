"""KnowledgeBase end to end: upload real files, list, read chunks, recall-resolve, delete.

Durable backends: every one (see ``conftest.py``: memory, SQLite, Redis, Redis Cluster,
DynamoDB). The index is the recall module's :class:`InProcessIndex`, the reference index.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.knowledge.files import make_docx, make_pdf
from tests.knowledge.support import (
    OTHER,
    POLICY,
    USER,
    FailingEmbedder,
    FailingIndex,
    SequentialIds,
    WordHashEmbedder,
    knowledge,
)
from tiermem.errors import (
    BackendError,
    NotFoundError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.knowledge import (
    CHUNK_TYPE,
    DOCUMENT_TYPE,
    KnowledgeBase,
    parse_chunk_doc_id,
)
from tiermem.longterm.types import is_internal_type
from tiermem.models import MemoryRecord
from tiermem.store.contract import DurableStore
from tiermem.testing import FakeClock
from tiermem.tokens import TiktokenCounter

needs_pypdf = pytest.mark.skipif(
    importlib.util.find_spec("pypdf") is None,
    reason="PDF tests need the documents extra: pip install 'tiermem[documents]'",
)
needs_docx = pytest.mark.skipif(
    importlib.util.find_spec("docx") is None,
    reason="DOCX tests need the documents extra: pip install 'tiermem[documents]'",
)


async def all_records(durable: DurableStore, user_id: str) -> list[MemoryRecord]:
    return await durable.query_memories(user_id, limit=10_000, include_expired=True)


async def assert_nothing_written(durable: DurableStore, index: InProcessIndex) -> None:
    assert await all_records(durable, USER) == []
    assert index.document_count(USER) == 0


# ---------------------------------------------------------------- upload and read


async def test_text_upload_is_chunked_stored_indexed_and_listed(
    durable: DurableStore, clock: FakeClock
) -> None:
    index = InProcessIndex()
    kb = knowledge(durable, index, clock)
    doc = await kb.add_document(USER, "policy.md", POLICY.encode(), tags=("shop",))

    assert doc.document_id == "doc0001"
    assert (doc.name, doc.format, doc.user_id, doc.tags) == ("policy.md", "md", USER, ("shop",))
    assert doc.created_at == clock.now()
    assert doc.size_bytes == len(POLICY.encode())
    assert doc.chunk_count > 3
    assert doc.pages is None
    assert doc.embedding_model is None
    assert await kb.list_documents(USER) == [doc]
    assert await kb.get_document(USER, doc.document_id) == doc

    chunks = await kb.get_chunks(USER, doc.document_id)
    assert [c.chunk for c in chunks] == list(range(doc.chunk_count))
    assert all(c.text == POLICY[c.start : c.end] for c in chunks)
    assert all(c.tokens <= 60 for c in chunks)
    assert {c.doc_id for c in chunks} == {f"doc0001#{n}" for n in range(doc.chunk_count)}
    assert index.document_count(USER) == doc.chunk_count

    hits = await index.search(USER, "Osaka warehouse", kinds=["chunk"], limit=3)
    assert hits
    assert all(h.kind == "chunk" for h in hits)
    resolved = await kb.resolve_chunks(USER, [h.doc_id for h in hits])
    assert all("Osaka" in text for text, _ in resolved.values())


async def test_tokens_count_the_text_once_despite_overlaps(
    durable: DurableStore, clock: FakeClock
) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    chunks = await kb.get_chunks(USER, doc.document_id)
    assert sum(c.tokens for c in chunks) > doc.tokens  # the overlaps are counted once
    whole = TiktokenCounter().count(POLICY)
    assert abs(doc.tokens - whole) <= doc.chunk_count * 2


async def test_documents_and_chunks_are_internal_records(
    durable: DurableStore, clock: FakeClock
) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    records = await all_records(durable, USER)
    assert {r.memory_type for r in records} == {DOCUMENT_TYPE, CHUNK_TYPE}
    assert all(is_internal_type(r.memory_type) for r in records)
    chunk_records = [r for r in records if r.memory_type == CHUNK_TYPE]
    assert len(chunk_records) == doc.chunk_count
    for record in chunk_records:
        assert record.provenance.source == "document"
        assert record.provenance.memory_ids == (doc.document_id,)
        assert record.metadata["document_id"] == doc.document_id
        assert parse_chunk_doc_id(record.memory_id) == (doc.document_id, record.metadata["chunk"])


@needs_pypdf
async def test_pdf_chunks_know_their_pages(durable: DurableStore, clock: FakeClock) -> None:
    pages = [
        [f"Page one line {i}: the store opens at nine." for i in range(10)],
        [f"二ページ目の{i}行目：配送は大阪倉庫から行います。" for i in range(10)],
        [f"Page three line {i}: gift wrapping is free." for i in range(10)],
    ]
    kb = knowledge(durable, InProcessIndex(), clock)
    doc = await kb.add_document(USER, "handbook.pdf", make_pdf(pages))
    assert (doc.format, doc.pages) == ("pdf", 3)
    chunks = await kb.get_chunks(USER, doc.document_id)
    assert chunks[0].pages == (1, 1)
    assert chunks[-1].pages == (3, 3)
    japanese = [c for c in chunks if "大阪倉庫" in c.text]
    assert japanese
    assert all(c.pages is not None and 2 in range(c.pages[0], c.pages[1] + 1) for c in japanese)
    assert [p for c in chunks if c.pages for p in c.pages] == sorted(
        p for c in chunks if c.pages for p in c.pages
    )


@needs_docx
async def test_japanese_docx_is_searchable_and_resolves_to_its_chunk(
    durable: DurableStore, clock: FakeClock
) -> None:
    paragraphs = [f"第{i}条：ベルセルクの最新刊は在庫があります。" for i in range(20)] + [
        "返品は到着後三十日以内に受け付けます。"
    ]
    index = InProcessIndex()
    kb = knowledge(durable, index, clock)
    doc = await kb.add_document(USER, "ポリシー.docx", make_docx(paragraphs, heading="規約"))
    assert doc.format == "docx"
    hits = await index.search(USER, "返品", kinds=["chunk"], limit=1)
    assert len(hits) == 1
    resolved = await kb.resolve_chunks(USER, [hits[0].doc_id])
    text, provenance = resolved[hits[0].doc_id]
    assert "返品は到着後三十日以内に受け付けます。" in text
    assert provenance.source == "document"
    assert provenance.memory_ids == (doc.document_id,)


async def test_resolve_skips_foreign_unknown_and_malformed_ids(
    durable: DurableStore, clock: FakeClock
) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    first = f"{doc.document_id}#0"
    asked = [first, first, f"{doc.document_id}#999", "no-hash", "doc#x", doc.document_id]
    resolved = await kb.resolve_chunks(USER, asked)
    assert list(resolved) == [first]
    assert await kb.resolve_chunks(OTHER, [first]) == {}


async def test_users_see_only_their_own_documents(durable: DurableStore, clock: FakeClock) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    assert await kb.list_documents(OTHER) == []
    with pytest.raises(NotFoundError):
        await kb.get_chunks(OTHER, doc.document_id)
    assert await kb.delete_document(OTHER, doc.document_id) is False
    assert await kb.list_documents(USER) == [doc]


async def test_documents_are_listed_newest_first(durable: DurableStore, clock: FakeClock) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    first = await kb.add_document(USER, "a.txt", b"First document.")
    clock.advance(60)
    second = await kb.add_document(USER, "b.txt", b"Second document.")
    assert [d.document_id for d in await kb.list_documents(USER)] == [
        second.document_id,
        first.document_id,
    ]
    assert [d.document_id for d in await kb.list_documents(USER, limit=1)] == [second.document_id]


async def test_unknown_document_is_not_found(durable: DurableStore, clock: FakeClock) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    with pytest.raises(NotFoundError, match="list_documents"):
        await kb.get_chunks(USER, "missing")
    with pytest.raises(NotFoundError):
        await kb.get_document(USER, "missing")


# ---------------------------------------------------------------- embeddings


async def test_chunks_are_embedded_stored_and_vector_searchable(
    durable: DurableStore, clock: FakeClock
) -> None:
    index = InProcessIndex()
    embedder = WordHashEmbedder()
    kb = knowledge(durable, index, clock, embedder=embedder)
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    assert doc.embedding_model == "word-hash-64"
    chunks = await kb.get_chunks(USER, doc.document_id)
    assert all(c.embedding is not None and len(c.embedding) == 64 for c in chunks)
    assert sum(len(call) for call in embedder.calls) == doc.chunk_count

    [query] = await embedder.embed(["e-books cannot be refunded after download"])
    hits = await index.vector_search(USER, query, kinds=["chunk"], limit=1)
    text, _ = (await kb.resolve_chunks(USER, [hits[0].doc_id]))[hits[0].doc_id]
    assert "e-books" in text


async def test_a_failing_embedder_writes_nothing(durable: DurableStore, clock: FakeClock) -> None:
    index = InProcessIndex()
    kb = knowledge(durable, index, clock, embedder=FailingEmbedder())
    with pytest.raises(BackendError, match="overloaded") as caught:
        await kb.add_document(USER, "policy.txt", POLICY.encode())
    assert caught.value.retryable
    await assert_nothing_written(durable, index)


@pytest.mark.parametrize("ok_upserts", [0, 1])
async def test_a_failing_index_rolls_the_upload_back(
    durable: DurableStore, clock: FakeClock, ok_upserts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiermem.longterm.knowledge as module

    # Several upserts, so the failure can come after one of them succeeded.
    monkeypatch.setattr(module, "_INDEX_BATCH", 4)
    index = FailingIndex(ok=ok_upserts)
    kb = knowledge(durable, index, clock, chunk_tokens=16, overlap_tokens=0)
    with pytest.raises(BackendError, match="index unavailable"):
        await kb.add_document(USER, "policy.txt", POLICY.encode())
    await assert_nothing_written(durable, index)
    assert await kb.list_documents(USER) == []


async def test_indexed_docs_rebuild_a_lost_index(durable: DurableStore, clock: FakeClock) -> None:
    kb = knowledge(durable, InProcessIndex(), clock, embedder=WordHashEmbedder())
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    docs = await kb.indexed_docs(USER)
    assert len(docs) == doc.chunk_count
    assert all(d.kind == "chunk" and d.embedding is not None for d in docs)
    fresh = InProcessIndex()
    await fresh.upsert(docs)
    assert await fresh.search(USER, "Osaka", kinds=["chunk"], limit=1)


# ---------------------------------------------------------------- deletion


async def test_delete_removes_the_document_its_chunks_and_index_entries(
    durable: DurableStore, clock: FakeClock
) -> None:
    index = InProcessIndex()
    kb = knowledge(durable, index, clock, embedder=WordHashEmbedder())
    keep = await kb.add_document(USER, "keep.txt", b"The Kyoto branch closes on Mondays.")
    doc = await kb.add_document(USER, "policy.txt", POLICY.encode())
    doc_ids = [f"{doc.document_id}#{n}" for n in range(doc.chunk_count)]

    assert await kb.delete_document(USER, doc.document_id) is True

    assert await kb.list_documents(USER) == [keep]
    with pytest.raises(NotFoundError):
        await kb.get_chunks(USER, doc.document_id)
    assert await kb.resolve_chunks(USER, doc_ids) == {}
    assert await index.search(USER, "Osaka warehouse", kinds=["chunk"], limit=5) == []
    assert index.document_count(USER) == keep.chunk_count
    remaining = {r.memory_id for r in await all_records(durable, USER)}
    assert remaining == {keep.document_id, f"{keep.document_id}#0"}
    assert await kb.delete_document(USER, doc.document_id) is False


async def test_delete_leaves_other_memories_alone(durable: DurableStore, clock: FakeClock) -> None:
    preference = MemoryRecord(
        memory_id="pref-1",
        user_id=USER,
        memory_type="preference",
        content="likes dark fantasy",
        created_at=clock.now(),
    )
    await durable.put_memory(preference)
    kb = knowledge(durable, InProcessIndex(), clock)
    assert await kb.delete_document(USER, "pref-1") is False
    assert await durable.get_memory(USER, "pref-1") == preference
    with pytest.raises(NotFoundError):
        await kb.get_document(USER, "pref-1")


# ---------------------------------------------------------------- bad input


BAD_UPLOADS = [
    pytest.param("tool.exe", b"MZ\x90\x00", None, "cannot tell the format", id="unknown-extension"),
    pytest.param("notes.txt", b"", None, "empty", id="empty"),
    pytest.param("notes.txt", b" \n\n \t", None, "no text", id="blank"),
    pytest.param("notes.txt", b"x" * 5000, None, "the limit is 4096", id="oversized"),
    pytest.param("notes.txt", "円".encode("euc_jp"), None, "not UTF-8", id="not-utf8"),
    pytest.param("notes.txt", b"ok", "html", "not supported", id="bad-format-argument"),
    pytest.param("bad\nname.txt", b"ok", None, "control character", id="bad-name"),
    pytest.param(
        "broken.pdf",
        b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog",
        None,
        "could not be read as a PDF",
        id="corrupt-pdf",
        marks=needs_pypdf,
    ),
    pytest.param(
        "letter.docx",
        make_pdf([["A PDF, not a Word file."]]),
        None,
        "not a DOCX",
        id="pdf-named-docx",
        marks=needs_docx,
    ),
    pytest.param("scan.pdf", make_pdf([[]]), None, "OCR", id="pdf-without-text", marks=needs_pypdf),
]


@pytest.mark.parametrize(("name", "data", "fmt", "message"), BAD_UPLOADS)
async def test_bad_uploads_are_rejected_and_write_nothing(
    durable: DurableStore, clock: FakeClock, name: str, data: bytes, fmt: Any, message: str
) -> None:
    index = InProcessIndex()
    embedder = WordHashEmbedder()
    kb = knowledge(durable, index, clock, embedder=embedder, max_bytes=4096)
    with pytest.raises(ValidationError, match=message):
        await kb.add_document(USER, name, data, format=fmt)
    assert embedder.calls == []
    await assert_nothing_written(durable, index)


async def test_bad_tags_are_rejected(durable: DurableStore, clock: FakeClock) -> None:
    kb = knowledge(durable, InProcessIndex(), clock)
    with pytest.raises(ValidationError, match="tags"):
        await kb.add_document(USER, "a.txt", b"text", tags=("ok", " "))


async def test_missing_documents_extra_is_reported_before_any_work(
    durable: DurableStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pypdf" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    kb = knowledge(durable, InProcessIndex(), clock)
    with pytest.raises(UnsupportedCapabilityError, match=r"tiermem\[documents\]"):
        await kb.add_document(USER, "a.pdf", b"%PDF-1.7")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_tokens": 8},
        {"chunk_tokens": 100, "overlap_tokens": 51},
        {"overlap_tokens": -1},
        {"max_bytes": 0},
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, int]) -> None:
    class NoStore:
        pass

    with pytest.raises(ValidationError):
        KnowledgeBase(
            NoStore(),  # type: ignore[arg-type]
            InProcessIndex(),
            clock=FakeClock(),
            ids=SequentialIds(),
            **kwargs,  # type: ignore[arg-type]
        )
