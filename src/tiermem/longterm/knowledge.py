"""Knowledge documents: a user's uploaded files, cut into chunks that recall can find.

:class:`KnowledgeBase` owns the life of a document: upload (extract text, chunk, embed,
store, index), listing, reading its chunks back, deletion, and resolving recalled chunk ids
to their text and provenance.

Storage, in the durable tier's long-term memory records of two internal types (types that
start with ``_`` are never recalled as memories, see
:func:`tiermem.longterm.types.is_internal_type`)::

    user partition
    ├── _document  memory_id <document_id>
    │              content: the file name; metadata: name, format, chunk_count, tokens,
    │              size_bytes, sha256, pages, embedding_model
    └── _chunk     memory_id <document_id>#<n>      (n = 0, 1, ... chunk_count - 1)
                   content: the chunk's text; metadata: document_id, chunk, name, tokens,
                   start, end, pages; embedding and embedding_model when embedded;
                   provenance: source "document", memory_ids (<document_id>,)

Each chunk is also in the :class:`~tiermem.longterm.index.SearchIndex` as an
``IndexedDoc(kind="chunk", doc_id="<document_id>#<n>")``, with its embedding when an
embedder is configured. Recall finds chunks through the index and turns their ids back
into text with :meth:`KnowledgeBase.resolve_chunks`; a recalled chunk's provenance names
its document in ``memory_ids`` and its chunk number is the part of ``doc_id`` after ``#``.

Writes are ordered so that a document is listed only once it is complete: chunks, then
index entries, then the ``_document`` record. If any write fails, what was written is
removed (best effort, logged) and the error is raised. Deletion goes the other way (index,
chunks, then the record), so a deletion that fails half-way can be retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import Field

from tiermem.clock import Clock, IdFactory
from tiermem.errors import (
    BackendError,
    NotFoundError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.extract_text import (
    MAX_DOCUMENT_BYTES,
    MAX_PDF_PAGES,
    DocumentFormat,
    ExtractedText,
    TextChunk,
    chunk_text,
    extract_text,
    infer_format,
)
from tiermem.longterm.index import IndexedDoc, SearchIndex
from tiermem.models import FrozenModel, MemoryRecord, Provenance, UtcDatetime
from tiermem.store.contract import DurableStore
from tiermem.store.keys import validate_id
from tiermem.tokens import TiktokenCounter, TokenCounter

__all__ = [
    "CHUNK_TYPE",
    "DOCUMENT_TYPE",
    "ChunkResolution",
    "KnowledgeBase",
    "KnowledgeChunk",
    "KnowledgeDocument",
    "chunk_doc_id",
    "parse_chunk_doc_id",
]

logger = logging.getLogger(__name__)

DOCUMENT_TYPE = "_document"
CHUNK_TYPE = "_chunk"
PROVENANCE_SOURCE = "document"

_WRITE_CONCURRENCY = 16
"""Durable writes in flight at once while storing or deleting chunks."""
_INDEX_BATCH = 256
_EMBED_BATCH = 64
_LOADER_LIMIT = 1_000_000

T = TypeVar("T")

ChunkResolution = tuple[str, Provenance]
"""What :meth:`KnowledgeBase.resolve_chunks` gives for a chunk: its text and provenance."""


def chunk_doc_id(document_id: str, chunk: int) -> str:
    """The id of a chunk in the index and the durable tier: ``<document_id>#<chunk>``."""
    return f"{document_id}#{chunk}"


def parse_chunk_doc_id(doc_id: str) -> tuple[str, int] | None:
    """``(document_id, chunk)`` from a chunk's doc id, or None if it is not one."""
    document_id, sep, number = doc_id.rpartition("#")
    if not sep or not document_id or not number.isdigit():
        return None
    return document_id, int(number)


class KnowledgeDocument(FrozenModel):
    """An uploaded document, as listed."""

    document_id: str
    user_id: str
    name: str
    format: DocumentFormat
    chunk_count: int
    tokens: int
    """Tokens (cl100k) of the extracted text, counted chunk by chunk without overlaps."""
    size_bytes: int
    sha256: str
    """Of the uploaded bytes: tells a re-upload of the same file."""
    pages: int | None = None
    """Pages of a PDF; None for other formats."""
    tags: tuple[str, ...] = ()
    created_at: UtcDatetime
    embedding_model: str | None = None
    """The model that embedded the chunks; None when they were not embedded."""


class KnowledgeChunk(FrozenModel):
    """One chunk of a document."""

    document_id: str
    chunk: int
    text: str
    tokens: int
    start: int
    """Offset of the chunk in the document's extracted text; ``end`` is exclusive."""
    end: int
    pages: tuple[int, int] | None = None
    """First and last PDF page the chunk covers."""
    embedding: tuple[float, ...] | None = Field(default=None, repr=False)

    @property
    def doc_id(self) -> str:
        return chunk_doc_id(self.document_id, self.chunk)


@dataclass(frozen=True, slots=True)
class _Prepared:
    extracted: ExtractedText
    chunks: list[TextChunk]
    tokens: int
    sha256: str


class KnowledgeBase:
    """Upload, list, read and delete a user's knowledge documents.

    Args:
        durable: where documents and chunks are stored.
        index: where chunks are indexed for recall.
        clock, ids: injected time and ids.
        embedder: embeds every chunk when set (hybrid recall); BM25 only when None.
        chunk_tokens: the most tokens (cl100k) a chunk holds.
        overlap_tokens: how many tokens of whole sentences consecutive chunks share.
        counter: the token counter; default :class:`~tiermem.tokens.TiktokenCounter`.
        max_bytes: the largest upload accepted.
        max_pages: the most pages of a PDF.

    Raises:
        ValidationError: a size or token setting is out of range.
    """

    def __init__(
        self,
        durable: DurableStore,
        index: SearchIndex,
        *,
        clock: Clock,
        ids: IdFactory,
        embedder: Embedder | None = None,
        chunk_tokens: int = 300,
        overlap_tokens: int = 50,
        counter: TokenCounter | None = None,
        max_bytes: int = MAX_DOCUMENT_BYTES,
        max_pages: int = MAX_PDF_PAGES,
    ) -> None:
        if chunk_tokens < 16:
            raise ValidationError(f"chunk_tokens must be >= 16, got {chunk_tokens}")
        if not 0 <= overlap_tokens <= chunk_tokens // 2:
            raise ValidationError(
                f"overlap_tokens must be in [0, chunk_tokens / 2], got {overlap_tokens} "
                f"with chunk_tokens {chunk_tokens}"
            )
        if max_bytes < 1 or max_pages < 1:
            raise ValidationError("max_bytes and max_pages must be >= 1")
        self._durable = durable
        self._index = index
        self._clock = clock
        self._ids = ids
        self._embedder = embedder
        self._chunk_tokens = chunk_tokens
        self._overlap_tokens = overlap_tokens
        self._counter = counter or TiktokenCounter()
        self._max_bytes = max_bytes
        self._max_pages = max_pages

    # -- upload ------------------------------------------------------------------------

    async def add_document(
        self,
        user_id: str,
        name: str,
        data: bytes,
        *,
        format: DocumentFormat | None = None,
        tags: Sequence[str] = (),
    ) -> KnowledgeDocument:
        """Extract the document's text, chunk, embed, store and index it.

        ``format`` defaults to the one ``name``'s extension says. Extraction and chunking
        run in a worker thread; nothing is written until the text is extracted, chunked and
        (with an embedder) embedded, so a rejected upload leaves no trace.

        Raises:
            ValidationError: a bad id, name or tag; an unsupported or wrong format; empty,
                oversized, corrupt, encrypted or text-less content.
            UnsupportedCapabilityError: PDF or DOCX without ``tiermem[documents]``.
            BackendError: the embedder, the store or the index failed; anything written
                was removed again.
        """
        validate_id(user_id, what="user_id")
        validate_id(name, what="document name")
        tags = tuple(tags)
        for tag in tags:
            if not isinstance(tag, str) or not tag.strip():
                raise ValidationError(f"tags must be non-empty strings, got {tag!r}")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValidationError(f"data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > self._max_bytes:
            raise ValidationError(
                f"{name!r} is {len(data)} bytes; the limit is {self._max_bytes}. "
                "Split the document into parts"
            )
        fmt = infer_format(name, format)
        _require_parser(fmt)
        prepared = await asyncio.to_thread(self._prepare, data, fmt, name)
        chunks = prepared.chunks
        embeddings = await self._embed([c.text for c in chunks])

        document_id = validate_id(self._ids.new_id(), what="document_id")
        now = self._clock.now()
        model = self._embedder.model_id if self._embedder is not None else None
        document = KnowledgeDocument(
            document_id=document_id,
            user_id=user_id,
            name=name,
            format=fmt,
            chunk_count=len(chunks),
            tokens=prepared.tokens,
            size_bytes=len(data),
            sha256=prepared.sha256,
            pages=prepared.extracted.pages,
            tags=tags,
            created_at=now,
            embedding_model=model,
        )
        records = [
            self._chunk_record(
                document, chunk, prepared.extracted, embeddings[chunk.index] if embeddings else None
            )
            for chunk in chunks
        ]
        try:
            await _bounded(self._durable.put_memory(r) for r in records)
            await self._index_chunks(records)
            await self._durable.put_memory(_document_record(document))
        except BaseException:
            await self._remove(user_id, document_id, len(chunks), best_effort=True)
            raise
        logger.info(
            "knowledge document %s stored for user %s: %s, %d chunks, %d tokens",
            document_id,
            user_id,
            fmt,
            len(chunks),
            document.tokens,
        )
        return document

    def _prepare(self, data: bytes, fmt: DocumentFormat, name: str) -> _Prepared:
        """The CPU-bound part of an upload, for a worker thread."""
        extracted = extract_text(data, fmt, name=name, max_pages=self._max_pages)
        chunks = chunk_text(
            extracted.text,
            self._counter,
            chunk_tokens=self._chunk_tokens,
            overlap_tokens=self._overlap_tokens,
        )
        return _Prepared(
            extracted, chunks, self._counted_tokens(chunks), hashlib.sha256(data).hexdigest()
        )

    def _counted_tokens(self, chunks: list[TextChunk]) -> int:
        # Chunk counts include the overlaps; count the text once (slices between chunk starts).
        total = 0
        for chunk, following in zip(chunks, [*chunks[1:], None], strict=True):
            if following is None or following.start >= chunk.end:
                total += chunk.tokens
            else:
                total += self._counter.count(chunk.text[: following.start - chunk.start])
        return total

    async def _embed(self, texts: list[str]) -> list[tuple[float, ...]] | None:
        if self._embedder is None:
            return None
        vectors: list[tuple[float, ...]] = []
        for start in range(0, len(texts), _EMBED_BATCH):
            batch = texts[start : start + _EMBED_BATCH]
            got = await self._embedder.embed(batch)
            if len(got) != len(batch):
                raise BackendError(
                    f"embedder {self._embedder.model_id} returned {len(got)} vectors for "
                    f"{len(batch)} chunks",
                    backend=self._embedder.model_id,
                )
            vectors.extend(tuple(v) for v in got)
        sizes = {len(v) for v in vectors}
        if len(sizes) > 1 or (
            sizes and self._embedder.dimensions and sizes != {self._embedder.dimensions}
        ):
            raise BackendError(
                f"embedder {self._embedder.model_id} returned vectors of {sorted(sizes)} "
                f"values; it declares {self._embedder.dimensions}",
                backend=self._embedder.model_id,
            )
        return vectors

    def _chunk_record(
        self,
        document: KnowledgeDocument,
        chunk: TextChunk,
        extracted: ExtractedText,
        embedding: tuple[float, ...] | None,
    ) -> MemoryRecord:
        pages = extracted.pages_of(chunk.start, chunk.end)
        return MemoryRecord(
            memory_id=chunk_doc_id(document.document_id, chunk.index),
            user_id=document.user_id,
            memory_type=CHUNK_TYPE,
            content=chunk.text,
            tags=document.tags,
            metadata={
                "document_id": document.document_id,
                "chunk": chunk.index,
                "name": document.name,
                "tokens": chunk.tokens,
                "start": chunk.start,
                "end": chunk.end,
                "pages": list(pages) if pages else None,
            },
            created_at=document.created_at,
            provenance=_provenance(document.document_id),
            embedding=embedding,
            embedding_model=document.embedding_model if embedding else None,
        )

    async def _index_chunks(self, records: list[MemoryRecord]) -> None:
        docs = [_indexed(r) for r in records]
        for start in range(0, len(docs), _INDEX_BATCH):
            await self._index.upsert(docs[start : start + _INDEX_BATCH])

    # -- reading -----------------------------------------------------------------------

    async def list_documents(self, user_id: str, *, limit: int = 100) -> list[KnowledgeDocument]:
        """The user's documents, newest first.

        Raises:
            ValidationError: a bad ``user_id`` or ``limit``.
        """
        validate_id(user_id, what="user_id")
        records = await self._durable.query_memories(
            user_id, memory_types=[DOCUMENT_TYPE], limit=limit
        )
        return [_document_from(r) for r in records]

    async def get_document(self, user_id: str, document_id: str) -> KnowledgeDocument:
        """One document.

        Raises:
            NotFoundError: the user has no such document.
        """
        return _document_from(await self._document_record(user_id, document_id))

    async def get_chunks(self, user_id: str, document_id: str) -> list[KnowledgeChunk]:
        """The document's chunks, in order.

        Raises:
            NotFoundError: the user has no such document.
        """
        document = await self.get_document(user_id, document_id)
        ids = [chunk_doc_id(document_id, n) for n in range(document.chunk_count)]
        records = await _bounded(self._durable.get_memory(user_id, i) for i in ids)
        chunks = [_chunk_from(r) for r in records if r is not None and r.memory_type == CHUNK_TYPE]
        if len(chunks) != document.chunk_count:
            logger.warning(
                "knowledge document %s of user %s lists %d chunks but %d are stored",
                document_id,
                user_id,
                document.chunk_count,
                len(chunks),
            )
        return chunks

    async def resolve_chunks(
        self, user_id: str, doc_ids: Collection[str]
    ) -> dict[str, ChunkResolution]:
        """Text and provenance of recalled chunks, by doc id (``<document_id>#<chunk>``).

        The resolver recall registers for ``kind == "chunk"``. Ids that are not chunk ids,
        or whose chunk no longer exists (the document was deleted), are left out. The
        provenance has ``source="document"`` and the document id in ``memory_ids``.

        Raises:
            ValidationError: a bad ``user_id``.
        """
        validate_id(user_id, what="user_id")
        wanted = [d for d in dict.fromkeys(doc_ids) if parse_chunk_doc_id(d) is not None]
        records = await _bounded(self._durable.get_memory(user_id, d) for d in wanted)
        return {
            doc_id: (record.content, record.provenance)
            for doc_id, record in zip(wanted, records, strict=True)
            if record is not None and record.memory_type == CHUNK_TYPE
        }

    async def indexed_docs(self, user_id: str) -> list[IndexedDoc]:
        """Every stored chunk of the user as the index holds it.

        A :data:`~tiermem.longterm.index_memory.DocLoader` for ``WarmingIndex``, and what
        to upsert to rebuild a lost index.

        Raises:
            ValidationError: a bad ``user_id``.
        """
        validate_id(user_id, what="user_id")
        records = await self._durable.query_memories(
            user_id, memory_types=[CHUNK_TYPE], limit=_LOADER_LIMIT
        )
        if len(records) == _LOADER_LIMIT:
            logger.warning(
                "user %s has at least %d knowledge chunks; only that many were loaded",
                user_id,
                _LOADER_LIMIT,
            )
        return [_indexed(r) for r in records]

    # -- deletion ----------------------------------------------------------------------

    async def delete_document(self, user_id: str, document_id: str) -> bool:
        """Delete a document, its chunks and their index entries; False if there was none.

        Raises:
            BackendError: the store or index failed; retrying completes the deletion.
        """
        try:
            document = await self.get_document(user_id, document_id)
        except NotFoundError:
            return False
        await self._remove(user_id, document_id, document.chunk_count, best_effort=False)
        logger.info("knowledge document %s of user %s deleted", document_id, user_id)
        return True

    async def _remove(
        self, user_id: str, document_id: str, chunk_count: int, *, best_effort: bool
    ) -> None:
        ids = [chunk_doc_id(document_id, n) for n in range(chunk_count)]
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("index entries", lambda: self._index.remove(user_id, ids)),
            ("chunks", lambda: _bounded(self._durable.delete_memory(user_id, i) for i in ids)),
            ("record", lambda: self._durable.delete_memory(user_id, document_id)),
        ]
        for what, step in steps:
            try:
                await step()
            except Exception:
                if not best_effort:
                    raise
                # The upload's own error is what the caller sees; this one only leaves
                # orphans that a later delete_document or purge removes.
                logger.warning(
                    "cleanup of knowledge document %s (user %s) failed to remove its %s",
                    document_id,
                    user_id,
                    what,
                    exc_info=True,
                )

    async def _document_record(self, user_id: str, document_id: str) -> MemoryRecord:
        validate_id(user_id, what="user_id")
        validate_id(document_id, what="document_id")
        record = await self._durable.get_memory(user_id, document_id)
        if record is None or record.memory_type != DOCUMENT_TYPE:
            raise NotFoundError(
                f"user {user_id!r} has no knowledge document {document_id!r}; "
                "list_documents() shows the ones there are"
            )
        return record


# ----------------------------------------------------------------------- records


def _provenance(document_id: str) -> Provenance:
    return Provenance(source=PROVENANCE_SOURCE, memory_ids=(document_id,))


def _indexed(record: MemoryRecord) -> IndexedDoc:
    return IndexedDoc(
        user_id=record.user_id,
        doc_id=record.memory_id,
        kind="chunk",
        text=record.content,
        created_at=record.created_at,
        embedding=record.embedding,
        tags=record.tags,
    )


def _document_record(document: KnowledgeDocument) -> MemoryRecord:
    return MemoryRecord(
        memory_id=document.document_id,
        user_id=document.user_id,
        memory_type=DOCUMENT_TYPE,
        content=document.name,
        tags=document.tags,
        metadata=document.model_dump(
            mode="json", exclude={"document_id", "user_id", "tags", "created_at"}
        ),
        created_at=document.created_at,
        provenance=Provenance(source=PROVENANCE_SOURCE),
    )


def _document_from(record: MemoryRecord) -> KnowledgeDocument:
    return KnowledgeDocument.model_validate(
        {
            **record.metadata,
            "document_id": record.memory_id,
            "user_id": record.user_id,
            "tags": record.tags,
            "created_at": record.created_at,
        }
    )


def _chunk_from(record: MemoryRecord) -> KnowledgeChunk:
    meta = record.metadata
    pages = meta.get("pages")
    return KnowledgeChunk(
        document_id=str(meta["document_id"]),
        chunk=int(meta["chunk"]),
        text=record.content,
        tokens=int(meta.get("tokens", 0)),
        start=int(meta.get("start", 0)),
        end=int(meta.get("end", 0)),
        pages=(int(pages[0]), int(pages[1]))
        if isinstance(pages, list) and len(pages) == 2
        else None,
        embedding=record.embedding,
    )


def _require_parser(fmt: DocumentFormat) -> None:
    """Fail before any work when the PDF/DOCX parser is missing."""
    module = {"pdf": "pypdf", "docx": "docx"}.get(fmt)
    if module is not None and importlib.util.find_spec(module) is None:
        raise UnsupportedCapabilityError(
            f"reading {fmt} files needs the {module} package; "
            "install it with `pip install 'tiermem[documents]'`"
        )


async def _bounded(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` (an iterable of awaitables) at most :data:`_WRITE_CONCURRENCY` at a
    time, in order. Every call of a batch finishes before an error is raised, so no write is
    still in flight when the caller cleans up."""
    results: list[T] = []
    batch: list[Awaitable[T]] = []

    async def flush() -> None:
        outcomes = await asyncio.gather(*batch, return_exceptions=True)
        batch.clear()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            results.append(outcome)

    for call in calls:
        batch.append(call)
        if len(batch) == _WRITE_CONCURRENCY:
            await flush()
    if batch:
        await flush()
    return results
