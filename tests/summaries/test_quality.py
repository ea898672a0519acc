"""Quality measures: lost items, preservation, stale values, compression, drift."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from tiermem.errors import ValidationError
from tiermem.models.content import TextBlock
from tiermem.models.turns import Entity, NewTurn
from tiermem.summaries.models import Fact, Item, StructuredMemory
from tiermem.summaries.quality import (
    compression_ratio,
    entity_drift,
    fact_preservation,
    lost_items,
    measure,
    stale_facts,
)
from tiermem.summaries.structured import RuleStructuredExtractor, render_structured, slot_statement

WHEN = datetime(2026, 1, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Truth:
    slot: str
    value: str
    superseded: tuple[str, ...] = ()


def memory(**slots: str) -> StructuredMemory:
    entity_kinds = {"series", "volume", "order_id", "asin", "isbn", "price"}
    entities = {
        k: Fact(slot=k, value=v, turn_index=0) for k, v in slots.items() if k in entity_kinds
    }
    facts = {
        k: Fact(slot=k, value=v, turn_index=0) for k, v in slots.items() if k not in entity_kinds
    }
    return StructuredMemory(entities=entities, facts=facts)


def test_lost_items_are_the_slots_whose_value_the_text_does_not_state() -> None:
    structured = memory(volume="42", order_id="ORD-48213", budget="¥8,000", location="Osaka")
    text = "- [3] User: Is volume 42 in stock?\n- [9] User: My budget is 8000円."
    assert lost_items(text, structured) == ["order_id", "location"]
    assert lost_items(text + "\n- order ORD-48213, Osaka", structured) == []


def test_lost_items_of_empty_memory_is_empty() -> None:
    assert lost_items("anything", StructuredMemory()) == []


def test_a_number_alone_does_not_state_a_volume() -> None:
    assert lost_items("I need 42 copies.", memory(volume="42")) == ["volume"]


def test_preservation_counts_a_fact_stated_in_text_or_structured_memory() -> None:
    facts = [Truth("budget", "¥8,000"), Truth("postcode", "150-0001"), Truth("name", "Ken")]
    assert fact_preservation(facts, "My budget is ¥8,000.") == pytest.approx(1 / 3)
    assert fact_preservation(facts, "My budget is ¥8,000.", memory(name="Ken")) == pytest.approx(
        2 / 3
    )
    assert fact_preservation([], "") == 1.0


def test_preservation_needs_the_latest_value_not_a_superseded_one() -> None:
    facts = [Truth("budget", "¥8,000", superseded=("¥5,000",))]
    assert fact_preservation(facts, "My budget is ¥5,000.", memory(budget="¥5,000")) == 0.0


def test_structured_memory_must_hold_the_value_under_its_slot() -> None:
    facts = [Truth("postcode", "150-0001")]
    assert fact_preservation(facts, "", memory(phone_number="150-0001")) == 0.0


@pytest.mark.parametrize(
    ("text", "structured", "stale"),
    [
        ("My budget is ¥5,000.", StructuredMemory(), ["budget"]),
        ("Actually, my budget is ¥8,000, not ¥5,000.", StructuredMemory(), []),
        ("My budget is ¥8,000.", memory(budget="¥5,000"), ["budget"]),
        ("My budget is ¥8,000.", memory(budget="¥8,000"), []),
        ("Nothing about money here.", StructuredMemory(), []),
        ("I had ¥15,000 last year.", StructuredMemory(), []),  # not ¥5,000
    ],
)
def test_a_superseded_value_presented_as_current_is_stale(
    text: str, structured: StructuredMemory, stale: list[str]
) -> None:
    facts = [Truth("budget", "¥8,000", superseded=("¥5,000",)), Truth("name", "Ken")]
    assert stale_facts(facts, text, structured) == stale


def test_an_item_naming_a_superseded_value_is_stale() -> None:
    facts = [Truth("language", "french", superseded=("Japanese",))]
    structured = StructuredMemory(goals=(Item(text="I want the Japanese edition.", turn_index=1),))
    assert stale_facts(facts, "", structured) == ["language"]


def test_compression_ratio() -> None:
    assert compression_ratio(1000, 50) == 0.05
    with pytest.raises(ValidationError, match="positive"):
        compression_ratio(0, 10)
    with pytest.raises(ValidationError, match="positive"):
        compression_ratio(10, -1)


@pytest.mark.parametrize(
    ("before", "after", "drift"),
    [
        ([], [], 0.0),
        ([("volume", "42")], [("volume", "42")], 0.0),
        ([("volume", "42"), ("series", "Berserk")], [("volume", "42")], 0.5),
        ([("volume", "42")], [("volume", "43")], 1.0),
        ([("volume", "42")], [("volume", "42"), ("series", "Naruto")], 0.5),
    ],
)
def test_entity_drift_is_the_jaccard_distance(
    before: list[tuple[str, str]], after: list[tuple[str, str]], drift: float
) -> None:
    a = [Entity(kind=k, value=v) for k, v in before]
    b = [Entity(kind=k, value=v) for k, v in after]
    assert entity_drift(a, b) == pytest.approx(drift)


def test_measure_reports_every_measure() -> None:
    facts = [
        Truth("budget", "¥8,000", superseded=("¥5,000",)),
        Truth("postcode", "150-0001"),
        Truth("volume", "vol 3", superseded=("vol 42",)),
        Truth("name", "Ken Sato"),
    ]
    text = "- [1] User: My budget is ¥8,000.\n- [2] Assistant: Vol 42 ships today."
    report = measure(
        facts,
        summary_text=text,
        structured=memory(postcode="150-0001", volume="3"),
        source_tokens=400,
        summary_tokens=40,
    )
    assert report.preservation == 0.75
    assert report.preserved_in_text == 0.25
    assert report.preserved_in_structured == 0.5
    assert report.lost == ("name",)
    assert report.stale == ("volume",)
    assert report.stale_rate == 0.5
    assert report.compression_ratio == 0.1


def test_rendered_memory_and_slot_statements_state_every_slot() -> None:
    # What closed-loop validation relies on: a slot stated with slot_statement (or the
    # rendered memory) is never reported lost, whatever the kind of its value.
    extractor = RuleStructuredExtractor({"Berserk": "Berserk"})
    said = [
        "Is Berserk vol 42 in stock? Is it ¥990?",
        "My order number is ORD-48213. The ASIN is B0C4X7K2PQ. The ISBN is 978-4-08-851234-1.",
        "I want the Japanese edition. My email is ken@example.com. I live in Osaka.",
        "My budget is ¥5,000. I need it delivered by 2026-03-14. My favorite genre is seinen.",
    ]
    turns = [
        NewTurn(role="user", content=(TextBlock(text=t),), timestamp=WHEN).with_index(i)
        for i, t in enumerate(said)
    ]
    structured = extractor.extract_sync(turns)
    assert len(structured.entities) == 8
    assert lost_items(render_structured(structured), structured) == []
    for slot, fact in (*structured.entities.items(), *structured.facts.items()):
        alone = StructuredMemory(facts={slot: fact})
        assert lost_items(slot_statement(slot, fact.value), alone) == [], slot


def test_an_opinion_is_lost_only_when_its_subject_is_missing() -> None:
    """Session 14: "I love seinen" is kept as preference:opinion:genre:seinen = loves;
    the bare word "loves" is not what a summary must say (validation checks the subject,
    and so does lost_items now; it counted every opinion as lost)."""
    from tiermem.summaries.models import Fact

    opinion = "preference:opinion:genre:seinen"
    structured = StructuredMemory(
        facts={opinion: Fact(slot=opinion, value="loves", turn_index=2)}, through_index=2
    )
    assert lost_items("- The user is a big fan of seinen.", structured) == []
    assert lost_items("- The user asked about prices.", structured) == [opinion]
