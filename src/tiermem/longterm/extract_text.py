"""From an uploaded file to token-bounded chunks: format detection, text extraction, chunking.

Extraction (``pip install 'tiermem[documents]'`` for PDF and DOCX):

* ``txt`` / ``md`` — UTF-8 (a BOM is dropped); bytes that are not UTF-8, or hold NUL bytes,
  are rejected rather than guessed at.
* ``pdf`` — pypdf, page by page; page numbers are kept so a chunk can say where it came
  from. Encrypted PDFs (other than ones with an empty password) and PDFs without a text
  layer (scans) are rejected with advice.
* ``docx`` — python-docx, paragraphs and tables in document order; a table row becomes
  one line with cells separated by `` | ``. The archive's unpacked size is checked first,
  so a zip bomb is refused before it is parsed.

Every problem with the input raises :class:`~tiermem.errors.ValidationError`. The parsers
are third-party code facing untrusted bytes and raise many exception types on malformed
files; each parser call is one boundary where any exception is mapped to a ValidationError
that names the file.

Chunking (:func:`chunk_text`) cuts text into pieces of at most ``chunk_tokens`` tokens
(cl100k), preferring a paragraph break, then a sentence end (``.!?`` followed by a space,
or Japanese ``。！？`` with any closing bracket), then a space, and only then a character.
Consecutive chunks overlap by up to ``overlap_tokens`` tokens of whole sentences, so a
fact that straddles a cut is whole in at least one chunk. A chunk's text is an exact slice
of the extracted text (``text[start:end]``), never re-joined.
"""

from __future__ import annotations

import bisect
import io
import re
import unicodedata
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tiermem.errors import ValidationError
from tiermem.tokens import TokenCounter

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_PDF_PAGES",
    "DocumentFormat",
    "ExtractedText",
    "TextChunk",
    "chunk_text",
    "extract_text",
    "infer_format",
]

DocumentFormat = Literal["txt", "md", "pdf", "docx"]
_FORMATS: dict[str, DocumentFormat] = {"txt": "txt", "md": "md", "pdf": "pdf", "docx": "docx"}
FORMATS: tuple[str, ...] = get_args(DocumentFormat)

MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
"""Default largest upload. A 20 MB PDF is hundreds of pages; larger files should be split."""
MAX_PDF_PAGES = 2_000
"""Default most pages of a PDF."""
MAX_DOCX_UNPACKED_BYTES = 256 * 1024 * 1024
"""Most bytes a DOCX may unpack to: its parts are zip-compressed, and parsing a part reads
it whole into memory."""

_EXTENSIONS: dict[str, DocumentFormat] = {
    ".txt": "txt",
    ".text": "txt",
    ".md": "md",
    ".markdown": "md",
    ".pdf": "pdf",
    ".docx": "docx",
}
_ADVICE_BY_EXTENSION = {
    ".doc": "legacy Word .doc is not supported: save it as .docx",
    ".rtf": "RTF is not supported: save it as .docx or .txt",
    ".odt": "OpenDocument is not supported: save it as .docx",
    ".pptx": "PowerPoint is not supported: export it as PDF",
    ".html": "HTML is not supported: save the page as text or PDF",
}
_PDF_MAGIC = b"%PDF-"
_ZIP_MAGIC = b"PK\x03\x04"


# ------------------------------------------------------------------------- formats


def infer_format(name: str, given: str | None = None) -> DocumentFormat:
    """The document's format: ``given`` when set, else from the file name's extension.

    Raises:
        ValidationError: ``given`` is not a supported format, or the name has no
            supported extension.
    """
    if given is not None:
        if given not in FORMATS:
            raise ValidationError(
                f"format {given!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        return _FORMATS[given]
    dot = name.rfind(".")
    extension = name[dot:].lower() if dot > 0 else ""
    if extension in _EXTENSIONS:
        return _EXTENSIONS[extension]
    advice = _ADVICE_BY_EXTENSION.get(
        extension,
        "pass format= one of txt, md, pdf, docx if the content is one of them",
    )
    shown = extension or "no extension"
    raise ValidationError(
        f"cannot tell the format of {name!r} ({shown}); supported: "
        f".txt, .md, .pdf, .docx. {advice[0].upper()}{advice[1:]}"
    )


# ---------------------------------------------------------------------- extraction


@dataclass(frozen=True, slots=True)
class ExtractedText:
    """The plain text of a document, and where its pages start (PDF only)."""

    text: str
    pages: int | None = None
    """Pages of the PDF (including pages without text); None for other formats."""
    page_starts: tuple[int, ...] = ()
    """``page_starts[i]`` is the offset in ``text`` where page ``i + 1``'s text begins."""

    def pages_of(self, start: int, end: int) -> tuple[int, int] | None:
        """The first and last page (1-based) that ``text[start:end]`` covers, for PDFs."""
        if not self.page_starts:
            return None
        first = bisect.bisect_right(self.page_starts, start)
        last = bisect.bisect_right(self.page_starts, max(start, end - 1))
        return max(first, 1), max(last, 1)


def extract_text(
    data: bytes, fmt: DocumentFormat, *, name: str, max_pages: int = MAX_PDF_PAGES
) -> ExtractedText:
    """The text of a document. Blocking (CPU and parsing): call it in a worker thread.

    Raises:
        ValidationError: the bytes are empty, not of ``fmt``, corrupt, encrypted, over
            ``max_pages``, or hold no text.
    """
    if not data:
        raise ValidationError(f"{name!r} is empty (0 bytes); upload a file with text in it")
    if fmt in ("txt", "md"):
        extracted = ExtractedText(_decode_text(data, name=name))
    elif fmt == "pdf":
        extracted = _extract_pdf(data, name=name, max_pages=max_pages)
    else:
        extracted = _extract_docx(data, name=name)
    if not extracted.text.strip():
        hint = (
            " It may be a scan without a text layer: run OCR on it first." if fmt == "pdf" else ""
        )
        raise ValidationError(f"{name!r} contains no text to index.{hint}")
    return extracted


def _decode_text(data: bytes, *, name: str) -> str:
    if data.startswith(_PDF_MAGIC) or data.startswith(_ZIP_MAGIC):
        raise ValidationError(
            f"{name!r} looks like a {'PDF' if data.startswith(_PDF_MAGIC) else 'zip/DOCX'} "
            "file, not text; give it a .pdf or .docx name or pass the right format="
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"{name!r} is not UTF-8 text (invalid byte at offset {exc.start}); re-save it as UTF-8"
        ) from exc
    if "\x00" in text:
        raise ValidationError(f"{name!r} contains NUL bytes: it is binary, not text")
    return _clean(text)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _clean(text: str) -> str:
    """Unix newlines, no control characters (PDFs are full of them), NFC."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", _CONTROL.sub(" ", text))


def _extract_pdf(data: bytes, *, name: str, max_pages: int) -> ExtractedText:
    if _PDF_MAGIC not in data[:1024]:  # the header may follow up to 1 KB of junk
        raise ValidationError(f"{name!r} is not a PDF (no %PDF- header); check the file or format=")
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ValidationError(
                f"{name!r} is an encrypted PDF; remove the password and upload it again"
            )
        count = len(reader.pages)
        if count > max_pages:
            raise ValidationError(
                f"{name!r} has {count} pages; the limit is {max_pages}. Split it into parts"
            )
        page_texts = [_clean(page.extract_text() or "").strip() for page in reader.pages]
    except ValidationError:
        raise
    except Exception as exc:  # pypdf raises many types on malformed input
        raise ValidationError(
            f"{name!r} could not be read as a PDF ({type(exc).__name__}: {exc}); "
            "it may be corrupt or truncated: export it again"
        ) from exc
    parts: list[str] = []
    starts: list[int] = []
    offset = 0
    for text in page_texts:
        if parts:
            offset += 2  # the "\n\n" that joins pages
        starts.append(offset)
        parts.append(text)
        offset += len(text)
    return ExtractedText("\n\n".join(parts), pages=count, page_starts=tuple(starts))


def _extract_docx(data: bytes, *, name: str) -> ExtractedText:
    if not data.startswith(_ZIP_MAGIC):
        raise ValidationError(
            f"{name!r} is not a DOCX (not a zip archive); check the file or format="
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ValidationError(f"{name!r} is a corrupt zip archive, not a readable DOCX") from exc
    if "word/document.xml" not in {m.filename for m in members}:
        raise ValidationError(f"{name!r} is a zip archive but not a Word document")
    unpacked = sum(m.file_size for m in members)
    if unpacked > MAX_DOCX_UNPACKED_BYTES:
        raise ValidationError(
            f"{name!r} unpacks to {unpacked} bytes; the limit is {MAX_DOCX_UNPACKED_BYTES}"
        )
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
        blocks = list(_docx_blocks(document))
    except Exception as exc:  # python-docx and lxml: many types
        raise ValidationError(
            f"{name!r} could not be read as a DOCX ({type(exc).__name__}: {exc}); "
            "open it in Word and save it again"
        ) from exc
    return ExtractedText(_clean("\n\n".join(b for b in blocks if b.strip())))


def _docx_blocks(document: Any) -> Iterator[str]:
    from docx.table import Table

    for block in document.iter_inner_content():
        if isinstance(block, Table):
            rows = []
            for row in block.rows:
                cells: list[str] = []
                for cell in row.cells:
                    text = cell.text.strip()
                    # A merged cell is returned once per grid column it spans.
                    if not cells or text != cells[-1]:
                        cells.append(text)
                rows.append(" | ".join(cells))
            yield "\n".join(rows)
        else:
            yield str(block.text)


# ------------------------------------------------------------------------ chunking


@dataclass(frozen=True, slots=True)
class TextChunk:
    """One chunk: ``text == source[start:end]``, ``tokens`` its exact cl100k count."""

    index: int
    text: str
    start: int
    end: int
    tokens: int


@dataclass(frozen=True, slots=True)
class _Unit:
    start: int
    end: int
    tokens: int
    opens_paragraph: bool


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(
    r"[.!?]+[\"'”’)\]]*(?=\s)"  # Latin: punctuation, closing quotes, then whitespace
    r"|[。！？．]+[」』）】〉》”’]*"  # Japanese: no space follows a sentence
)
_SPACE = re.compile(r"\s+")
_MAX_CHARS_PER_TOKEN = 16
"""A generous bound on characters per cl100k token, to search for cuts in a window."""


def chunk_text(
    text: str, counter: TokenCounter, *, chunk_tokens: int, overlap_tokens: int
) -> list[TextChunk]:
    """Cut ``text`` into chunks of at most ``chunk_tokens`` tokens (see the module docstring).

    Blocking (CPU): call it in a worker thread for large texts.

    Raises:
        ValidationError: ``chunk_tokens`` < 1 or ``overlap_tokens`` not in [0, chunk_tokens).
    """
    if chunk_tokens < 1:
        raise ValidationError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if not 0 <= overlap_tokens < chunk_tokens:
        raise ValidationError(
            f"overlap_tokens must be in [0, chunk_tokens), got {overlap_tokens} "
            f"with chunk_tokens {chunk_tokens}"
        )
    units = _units(text, counter.count, chunk_tokens)

    def fit(i: int) -> tuple[int, int]:
        """The end unit (exclusive) and exact token count of the chunk starting at ``i``."""
        j = _fill(units, i, chunk_tokens)
        # The sum of the units' counts ignores the whitespace between them and BPE merges
        # across them; the exact count of the slice decides.
        while True:
            tokens = counter.count(text[units[i].start : units[j - 1].end])
            if tokens <= chunk_tokens or j - i == 1:
                return j, tokens
            j -= 1

    chunks: list[TextChunk] = []
    i, done = 0, 0
    while done < len(units):
        j, tokens = fit(i)
        if j <= done:
            # The overlap left no room for new text (the exact count was over the
            # estimate): start after the previous chunk instead, without overlap.
            i = done
            j, tokens = fit(i)
        start, end = units[i].start, units[j - 1].end
        chunks.append(TextChunk(len(chunks), text[start:end], start, end, tokens))
        done = j
        if done < len(units):
            i = _overlap_start(units, i, j, overlap_tokens, chunk_tokens)
    return chunks


def _fill(units: list[_Unit], i: int, limit: int) -> int:
    """The end (exclusive) of the chunk starting at unit ``i``: as many units as fit,
    cut back to a paragraph break when one falls in the second half of the chunk."""
    total = 0
    j = i
    while j < len(units) and (j == i or total + units[j].tokens <= limit):
        total += units[j].tokens
        j += 1
    if j < len(units) and not units[j].opens_paragraph:
        running = 0
        best = None
        for k in range(i, j):
            if k > i and units[k].opens_paragraph and running * 2 >= limit:
                best = k
            running += units[k].tokens
        if best is not None:
            j = best
    return j


def _overlap_start(units: list[_Unit], i: int, j: int, overlap: int, limit: int) -> int:
    """Where the chunk after ``units[i:j]`` starts: back from ``j`` by whole units worth at
    most ``overlap`` tokens, leaving room for unit ``j`` so the next chunk moves on."""
    budget = min(overlap, limit - units[j].tokens)
    k, used = j, 0
    while k - 1 > i and used + units[k - 1].tokens <= budget:
        used += units[k - 1].tokens
        k -= 1
    return k


def _units(text: str, count: Callable[[str], int], limit: int) -> list[_Unit]:
    units: list[_Unit] = []
    for p_start, p_end in _spans_between(text, _PARAGRAPH_BREAK, 0, len(text)):
        first = True
        for s_start, s_end in _sentences(text, p_start, p_end):
            tokens = count(text[s_start:s_end])
            pieces = (
                [(s_start, s_end, tokens)]
                if tokens <= limit
                else _split_long(text, s_start, s_end, count, limit)
            )
            for start, end, n in pieces:
                units.append(_Unit(start, end, n, first))
                first = False
    return units


def _spans_between(
    text: str, separator: re.Pattern[str], start: int, end: int
) -> Iterator[tuple[int, int]]:
    """The non-blank stretches of ``text[start:end]`` between matches of ``separator``,
    trimmed of surrounding whitespace."""
    pos = start
    for match in separator.finditer(text, start, end):
        yield from _trimmed(text, pos, match.start())
        pos = match.end()
    yield from _trimmed(text, pos, end)


def _trimmed(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start < end:
        yield start, end


def _sentences(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    pos = start
    for match in _SENTENCE_END.finditer(text, start, end):
        yield from _trimmed(text, pos, match.end())
        pos = match.end()
    yield from _trimmed(text, pos, end)


def _split_long(
    text: str, start: int, end: int, count: Callable[[str], int], limit: int
) -> list[tuple[int, int, int]]:
    """Cut one over-long sentence into pieces of at most ``limit`` tokens: at spaces when
    a word boundary fits, else between characters (CJK text has no spaces)."""
    pieces: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        window_end = min(end, pos + limit * _MAX_CHARS_PER_TOKEN)
        if window_end == end and (n := count(text[pos:end])) <= limit:
            pieces.append((pos, end, n))
            break
        word_cuts = [m.start() for m in _SPACE.finditer(text, pos, window_end) if m.start() > pos]
        cut = _largest_fitting(text, pos, word_cuts, count, limit)
        if cut is None:
            cut = _largest_fitting(text, pos, range(pos + 1, window_end + 1), count, limit)
        if cut is None:  # one character worth more than `limit` tokens: take it anyway
            cut = pos + 1
        piece_end = cut
        while piece_end > pos + 1 and text[piece_end - 1].isspace():
            piece_end -= 1
        pieces.append((pos, piece_end, count(text[pos:piece_end])))
        pos = cut
        while pos < end and text[pos].isspace():
            pos += 1
    return pieces


def _largest_fitting(
    text: str, pos: int, cuts: range | list[int], count: Callable[[str], int], limit: int
) -> int | None:
    """The largest cut ``c`` with ``count(text[pos:c]) <= limit``, by binary search (token
    counts grow with the prefix, near enough for a search that checks what it returns)."""
    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if count(text[pos : cuts[mid]]) <= limit:
            best = cuts[mid]
            lo = mid + 1
        else:
            hi = mid - 1
    return best
