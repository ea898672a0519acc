"""Real, small PDF and DOCX files made in the tests (no fixtures on disk, no network).

:func:`make_pdf` writes a PDF by hand: one page per list of lines, ASCII lines in the
standard Helvetica font, other lines in a Type0 (Identity-H) font whose ToUnicode CMap maps
each glyph id back to its character — the way real PDFs carry Japanese text, and what
pypdf reads to extract it. The cross-reference table holds real byte offsets, so the file
is valid, not just tolerated.

:func:`make_docx` uses python-docx itself to write the document.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

_CMAP_HEADER = (
    "/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n"
    "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def\n"
    "/CMapName /Adobe-Identity-UCS def\n/CMapType 2 def\n"
    "1 begincodespacerange\n<0000> <FFFF>\nendcodespacerange\n"
)
_CMAP_FOOTER = "endcmap\nCMapName currentdict /defineresource pop\nend\nend\n"


def _pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def make_pdf(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF with one page per item of ``pages``, each a list of text lines."""
    glyphs: dict[str, int] = {}
    for lines in pages:
        for line in lines:
            if not line.isascii():
                for ch in line:
                    glyphs.setdefault(ch, len(glyphs) + 1)

    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    def stream(data: bytes, extra: str = "") -> bytes:
        return f"<< /Length {len(data)}{extra} >>\nstream\n".encode() + data + b"\nendstream"

    catalog = add(b"")  # filled in below, once the page tree's number is known
    pages_obj = add(b"")
    helvetica = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    entries = [f"<{cid:04X}> <{ord(ch):04X}>" for ch, cid in glyphs.items()]
    blocks = "".join(
        f"{len(part)} beginbfchar\n" + "\n".join(part) + "\nendbfchar\n"
        for part in (entries[i : i + 100] for i in range(0, len(entries), 100))
    )
    to_unicode = add(stream((_CMAP_HEADER + blocks + _CMAP_FOOTER).encode()))
    descriptor = add(
        b"<< /Type /FontDescriptor /FontName /TestCJK /Flags 4 /FontBBox [0 -120 1000 880] "
        b"/ItalicAngle 0 /Ascent 880 /Descent -120 /CapHeight 700 /StemV 80 >>"
    )
    cid_font = add(
        f"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /TestCJK /CIDSystemInfo "
        f"<< /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> "
        f"/FontDescriptor {descriptor} 0 R /DW 1000 /CIDToGIDMap /Identity >>".encode()
    )
    cjk = add(
        f"<< /Type /Font /Subtype /Type0 /BaseFont /TestCJK /Encoding /Identity-H "
        f"/DescendantFonts [{cid_font} 0 R] /ToUnicode {to_unicode} 0 R >>".encode()
    )
    page_ids = []
    for lines in pages:
        ops = ["BT", "72 760 Td"]
        for n, line in enumerate(lines):
            if n:
                ops.append("0 -18 Td")
            if line.isascii():
                ops.append(f"/F1 12 Tf {_pdf_string(line)} Tj")
            else:
                hexed = "".join(f"{glyphs[ch]:04X}" for ch in line)
                ops.append(f"/F2 12 Tf <{hexed}> Tj")
        ops.append("ET")
        content = add(stream("\n".join(ops).encode()))
        page_ids.append(
            add(
                f"<< /Type /Page /Parent {pages_obj} 0 R /MediaBox [0 0 612 792] "
                f"/Resources << /Font << /F1 {helvetica} 0 R /F2 {cjk} 0 R >> >> "
                f"/Contents {content} 0 R >>".encode()
            )
        )
    kids = " ".join(f"{p} 0 R" for p in page_ids)
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {pages_obj} 0 R >>".encode()
    objects[pages_obj - 1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()

    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root {catalog} 0 R >>\n"
        f"startxref\n{xref}\n%%EOF\n".encode()
    )
    return out.getvalue()


def make_docx(
    paragraphs: Sequence[str],
    *,
    heading: str | None = None,
    table: Sequence[Sequence[str]] | None = None,
    after_table: Sequence[str] = (),
) -> bytes:
    """A DOCX written by python-docx: heading, paragraphs, a table, more paragraphs."""
    import docx

    document = docx.Document()
    if heading:
        document.add_heading(heading, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    for text in after_table:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
