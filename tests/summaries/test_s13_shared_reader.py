"""One default entity reader per process (session 13): the structured extractor without a
title catalogue reads with :data:`~tiermem.extraction.entities.DEFAULT_READER`, the reader
validation's checks use, so the line readings a pass keeps per reader are made once where
they were made twice (once by the stale-sentence rule with the extractor's own reader, once
by the lost-fact check with a module default). A catalogue still gets a reader of its own.
"""

from __future__ import annotations

from tiermem.extraction.entities import DEFAULT_READER, RuleEntityExtractor, extract_entities
from tiermem.models.content import TextBlock
from tiermem.summaries import structured
from tiermem.summaries.structured import RuleStructuredExtractor, SaidIn


def test_an_extractor_without_a_catalogue_reads_with_the_default_reader() -> None:
    assert RuleStructuredExtractor().entities is DEFAULT_READER
    assert RuleStructuredExtractor({}).entities is DEFAULT_READER
    assert SaidIn("vol. 3").entities() == SaidIn("vol. 3", DEFAULT_READER).entities()


def test_a_catalogue_gets_its_own_reader_and_reads_its_titles() -> None:
    titled = RuleStructuredExtractor({"Berserk": "Berserk"}).entities
    assert titled is not DEFAULT_READER
    said = [(e.kind, e.value) for e in titled.extract("I'm reading Berserk now")]
    assert ("series", "Berserk") in said
    plain = [(e.kind, e.value) for e in DEFAULT_READER.extract("I'm reading Berserk now")]
    assert ("series", "Berserk") not in plain


def test_a_line_read_for_the_stale_rule_is_not_read_again_for_the_lost_fact_check() -> None:
    """The line's entities are kept per reader instance: with one instance the second
    question is answered from what the first read."""
    line = "The user bought ASIN B0CTEST123 for $42 (session 13 shared reader)."
    reads: list[RuleEntityExtractor] = []
    real = RuleEntityExtractor.extract

    def counting(self: RuleEntityExtractor, text: object) -> object:
        if text == line:
            reads.append(self)
        return real(self, text)  # type: ignore[arg-type]

    RuleEntityExtractor.extract = counting  # type: ignore[method-assign,assignment]
    try:
        reader = RuleStructuredExtractor().entities
        SaidIn(line, reader).entities()  # what the stale-sentence rule asks of a line
        structured.stated_in(line + "\nand a second line")("B0CTEST123", "asin")
    finally:
        RuleEntityExtractor.extract = real  # type: ignore[method-assign]
    assert reads == [DEFAULT_READER]  # read once, by the one reader


def test_extract_entities_defaults_to_the_shared_reader() -> None:
    blocks = (TextBlock(type="text", text="order ORD-12345 shipped"),)
    assert extract_entities(blocks) == DEFAULT_READER.extract("order ORD-12345 shipped")
