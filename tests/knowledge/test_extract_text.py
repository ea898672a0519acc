"""Format detection, text extraction from real files, and chunking."""

from __future__ import annotations

import importlib.util
import io
import itertools
import re
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.knowledge.files import make_docx, make_pdf
from tiermem.errors import ValidationError
from tiermem.longterm.extract_text import TextChunk, chunk_text, extract_text, infer_format
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()

needs_pypdf = pytest.mark.skipif(
    importlib.util.find_spec("pypdf") is None,
    reason="PDF tests need the documents extra: pip install 'tiermem[documents]'",
)
needs_docx = pytest.mark.skipif(
    importlib.util.find_spec("docx") is None,
    reason="DOCX tests need the documents extra: pip install 'tiermem[documents]'",
)

ENGLISH = [
    "The return window for manga volumes is thirty days from delivery.",
    "Damaged items are replaced free of charge (photos help us process claims).",
    "Digital editions cannot be returned once they have been downloaded.",
]
JAPANESE = [
    "ベルセルクの最新刊は在庫があります。",
    "配送は通常二日から三日かかります！",
    "返品は到着後三十日以内に受け付けます？",
]


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("notes.txt", "txt"),
        ("README.md", "md"),
        ("Guide.MARKDOWN", "md"),
        ("policy.PDF", "pdf"),
        ("返品ポリシー.docx", "docx"),
        ("archive.tar.pdf", "pdf"),
    ],
)
def test_format_comes_from_the_extension(name: str, expected: str) -> None:
    assert infer_format(name) == expected


def test_explicit_format_wins_over_the_name() -> None:
    assert infer_format("upload.bin", "pdf") == "pdf"


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        ("old.doc", "save it as .docx"),
        ("slides.pptx", "export it as PDF"),
        ("program.exe", "format= one of"),
        ("no_extension", "format= one of"),
        (".hidden", "format= one of"),
    ],
)
def test_unsupported_names_are_rejected_with_advice(name: str, advice: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(advice)):
        infer_format(name)


def test_unsupported_explicit_format_is_rejected() -> None:
    with pytest.raises(ValidationError, match="not supported"):
        infer_format("a.txt", "html")


# ---------------------------------------------------------------- plain text


def test_utf8_text_keeps_its_content_and_drops_bom_and_crlf() -> None:
    data = "\ufeffLine one\r\n\r\n日本語の行\r\n".encode()
    extracted = extract_text(data, "txt", name="a.txt")
    assert extracted.text == "Line one\n\n日本語の行\n"
    assert extracted.pages is None
    assert extracted.pages_of(0, 5) is None


def test_text_that_is_not_utf8_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"not UTF-8.*re-save it as UTF-8"):
        extract_text("シフトJISの文".encode("shift_jis"), "txt", name="sjis.txt")


def test_binary_given_as_text_is_rejected() -> None:
    with pytest.raises(ValidationError, match="NUL bytes"):
        extract_text(b"abc\x00def", "md", name="a.md")
    with pytest.raises(ValidationError, match="looks like a PDF"):
        extract_text(b"%PDF-1.7 ...", "txt", name="a.txt")


@pytest.mark.parametrize("data", [b"", b"   \n\t\n"])
def test_empty_text_is_rejected(data: bytes) -> None:
    with pytest.raises(ValidationError, match=r"empty|no text"):
        extract_text(data, "txt", name="blank.txt")


# ---------------------------------------------------------------- PDF


@needs_pypdf
def test_pdf_text_is_extracted_page_by_page_in_english_and_japanese() -> None:
    data = make_pdf([ENGLISH, JAPANESE])
    extracted = extract_text(data, "pdf", name="policy.pdf")
    assert extracted.pages == 2
    first, second = extracted.text.split("\n\n")
    assert first.splitlines() == ENGLISH
    assert second.splitlines() == JAPANESE
    assert extracted.page_starts == (0, len(first) + 2)
    japanese_at = extracted.text.index("ベルセルク")
    assert extracted.pages_of(0, 10) == (1, 1)
    assert extracted.pages_of(japanese_at, japanese_at + 5) == (2, 2)
    assert extracted.pages_of(5, japanese_at + 5) == (1, 2)


@needs_pypdf
def test_the_hand_written_pdf_is_valid_for_a_strict_reader() -> None:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(make_pdf([ENGLISH, JAPANESE])), strict=True)
    assert len(reader.pages) == 2


@needs_pypdf
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog", "could not be read as a PDF"),
        (make_pdf([ENGLISH])[:200], "could not be read as a PDF"),
        (b"GIF89a not a pdf at all", "not a PDF"),
    ],
    ids=["garbage-after-header", "truncated", "no-header"],
)
def test_corrupt_pdfs_are_rejected(data: bytes, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        extract_text(data, "pdf", name="broken.pdf")


@needs_pypdf
def test_pdf_without_text_is_rejected_with_ocr_advice() -> None:
    with pytest.raises(ValidationError, match="OCR"):
        extract_text(make_pdf([[], []]), "pdf", name="scan.pdf")


@needs_pypdf
def test_pdf_over_the_page_limit_is_rejected() -> None:
    with pytest.raises(ValidationError, match="3 pages; the limit is 2"):
        extract_text(make_pdf([["a"], ["b"], ["c"]]), "pdf", name="long.pdf", max_pages=2)


@needs_pypdf
def test_encrypted_pdf_is_rejected() -> None:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf([ENGLISH]))))
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    with pytest.raises(ValidationError, match="encrypted"):
        extract_text(out.getvalue(), "pdf", name="locked.pdf")


# ---------------------------------------------------------------- DOCX


@needs_docx
def test_docx_paragraphs_and_tables_come_out_in_document_order() -> None:
    data = make_docx(
        [ENGLISH[0], JAPANESE[0]],
        heading="Returns",
        table=[["Item", "Days"], ["Manga", "30"]],
        after_table=[JAPANESE[1]],
    )
    text = extract_text(data, "docx", name="policy.docx").text
    assert text.split("\n\n") == [
        "Returns",
        ENGLISH[0],
        JAPANESE[0],
        "Item | Days\nManga | 30",
        JAPANESE[1],
    ]


@needs_docx
def test_empty_docx_is_rejected() -> None:
    with pytest.raises(ValidationError, match="no text"):
        extract_text(make_docx([]), "docx", name="empty.docx")


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, body in files.items():
            archive.writestr(name, body)
    return out.getvalue()


@needs_docx
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"PK\x03\x04 this is not really a zip", "corrupt zip"),
        (_zip({"hello.txt": b"hi"}), "not a Word document"),
        (_zip({"word/document.xml": b"<not xml"}), "could not be read as a DOCX"),
        (make_pdf([ENGLISH]), "not a DOCX"),
    ],
    ids=["bad-zip", "zip-not-word", "bad-xml", "pdf-bytes"],
)
def test_corrupt_docx_is_rejected(data: bytes, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        extract_text(data, "docx", name="broken.docx")


@needs_docx
def test_docx_that_unpacks_too_large_is_refused_before_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tiermem.longterm.extract_text as module

    monkeypatch.setattr(module, "MAX_DOCX_UNPACKED_BYTES", 1000)
    data = make_docx(["x" * 5000])
    with pytest.raises(ValidationError, match="unpacks to"):
        extract_text(data, "docx", name="bomb.docx")


# ---------------------------------------------------------------- chunking


def _check_invariants(text: str, chunks: list[TextChunk], limit: int) -> None:
    assert chunks, "text with content gives at least one chunk"
    for chunk in chunks:
        assert chunk.text == text[chunk.start : chunk.end]
        assert chunk.text == chunk.text.strip()
        assert chunk.tokens == COUNTER.count(chunk.text) <= limit
    for before, after in itertools.pairwise(chunks):
        assert before.start < after.start
        assert before.end < after.end
        # Nothing between two chunks is lost but whitespace.
        assert not text[before.end : after.start].strip()
    assert not text[: chunks[0].start].strip()
    assert not text[chunks[-1].end :].strip()
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_chunks_end_at_sentence_ends_and_overlap_by_whole_sentences() -> None:
    sentences = [f"Sentence {i} says that volume {i} ships on day {i % 7}." for i in range(40)]
    text = " ".join(sentences)
    chunks = chunk_text(text, COUNTER, chunk_tokens=60, overlap_tokens=20)
    _check_invariants(text, chunks, 60)
    assert len(chunks) > 5
    starts = {text.index(s) for s in sentences}
    ends = {text.index(s) + len(s) for s in sentences}
    for before, after in itertools.pairwise(chunks):
        assert before.start in starts
        assert before.end in ends
        shared = text[after.start : before.end]
        assert shared, "consecutive chunks overlap"
        assert 0 < COUNTER.count(shared) <= 20
        assert shared in sentences or shared.split(". ")[0] + "." in sentences


def test_without_overlap_chunks_are_contiguous() -> None:
    text = " ".join(f"Fact number {i} is about shelf {i}." for i in range(50))
    chunks = chunk_text(text, COUNTER, chunk_tokens=40, overlap_tokens=0)
    _check_invariants(text, chunks, 40)
    for before, after in itertools.pairwise(chunks):
        assert after.start >= before.end


def test_japanese_sentences_split_at_japanese_punctuation() -> None:
    text = "".join(JAPANESE * 10)
    chunks = chunk_text(text, COUNTER, chunk_tokens=50, overlap_tokens=15)
    _check_invariants(text, chunks, 50)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.text[-1] in "。！？"
        assert any(chunk.text.startswith(s) for s in JAPANESE)
    assert any(chunks[i].end > chunks[i + 1].start for i in range(len(chunks) - 1))


def test_a_paragraph_break_is_preferred_to_filling_the_chunk() -> None:
    first = " ".join(f"Alpha {i} is one point." for i in range(8))
    second = " ".join(f"Beta {i} is another point." for i in range(8))
    text = f"{first}\n\n{second}"
    chunks = chunk_text(text, COUNTER, chunk_tokens=COUNTER.count(first) + 20, overlap_tokens=0)
    _check_invariants(text, chunks, COUNTER.count(first) + 20)
    assert chunks[0].text == first
    assert chunks[1].text == second


def test_an_over_long_sentence_is_cut_at_spaces_or_between_characters() -> None:
    english = " ".join(f"word{i}" for i in range(400))
    japanese = "在庫確認" * 300
    text = f"{english}\n\n{japanese}"
    chunks = chunk_text(text, COUNTER, chunk_tokens=50, overlap_tokens=10)
    _check_invariants(text, chunks, 50)
    english_chunks = [c for c in chunks if c.text.startswith("word")]
    assert len(english_chunks) > 5
    assert all(re.fullmatch(r"(word\d+ )*word\d+", c.text) for c in english_chunks)
    assert sum(1 for c in chunks if "在庫" in c.text) > 5


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_chunk_settings_are_rejected(size: int, overlap: int) -> None:
    with pytest.raises(ValidationError):
        chunk_text("text", COUNTER, chunk_tokens=size, overlap_tokens=overlap)


_WORDS = st.sampled_from(
    ["manga", "volume", "在庫", "配送", "shipping", "42", "ベルセルク", "order", "x" * 30]
)
_SENTENCE = st.builds(
    lambda words, end: " ".join(words) + end,
    st.lists(_WORDS, min_size=1, max_size=40),
    st.sampled_from([".", "!", "?", "。", "！", "", "…"]),
)
_TEXT = st.lists(
    st.tuples(_SENTENCE, st.sampled_from([" ", "\n", "\n\n", "", "  \n \n"])),
    min_size=1,
    max_size=40,
).map(lambda parts: "".join(s + sep for s, sep in parts))


@settings(max_examples=60, deadline=None)
@given(
    text=_TEXT,
    limit=st.integers(min_value=8, max_value=120),
    overlap_share=st.floats(min_value=0, max_value=0.9),
)
def test_chunking_invariants_hold_for_any_text(text: str, limit: int, overlap_share: float) -> None:
    overlap = int(limit * overlap_share)
    chunks = chunk_text(text, COUNTER, chunk_tokens=limit, overlap_tokens=overlap)
    _check_invariants(text, chunks, limit)
