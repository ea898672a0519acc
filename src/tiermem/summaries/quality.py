"""Summary quality: what a summary kept, what it got wrong, what it cost.

Pure functions over values, fast enough to run after every summarization pass:

* :func:`lost_items` — the slots of structured memory whose value a summary's text does
  not state (closed-loop validation re-summarizes with them as ``must_keep``);
* :func:`fact_preservation` — the share of known facts whose *latest* value a summary and
  structured memory state (seed 004's "fact preservation");
* :func:`stale_facts` / stale rate — facts whose superseded value is presented as current;
* :func:`compression_ratio` — summary tokens over source tokens;
* :func:`entity_drift` — how far a summary's entities moved from the source's.

**What "states" and "presented as current" mean.** A value is stated when the text holds
it as the same entity (``"¥8,000"`` and ``"8000円"``; ``"vol 3"`` and ``"volume 3"``) or as
written, on word boundaries (:func:`~tiermem.summaries.structured.states_value`).
Structured memory states the latest value of a slot when the slot's current value is that
value. A superseded value is *presented as current* when structured memory holds it as a
slot's current value, or when a sentence of the text states it without stating the slot's
latest value in the same sentence: "Actually my budget is ¥8,000, not ¥5,000" tells the
history, "My budget is ¥5,000." presents the old value as the truth.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiermem.errors import ValidationError
from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.longterm.detect import split_sentences
from tiermem.models.turns import Entity
from tiermem.summaries.models import Fact, StructuredMemory
from tiermem.summaries.structured import same_value, states_value

__all__ = [
    "FactTruth",
    "QualityReport",
    "compression_ratio",
    "entity_drift",
    "fact_preservation",
    "lost_items",
    "measure",
    "stale_facts",
]


class FactTruth(Protocol):
    """A known fact: its slot, latest value and superseded values (oldest first), e.g.
    :class:`~tiermem.testing.conversations.PlantedFact`."""

    @property
    def slot(self) -> str: ...

    @property
    def value(self) -> str: ...

    @property
    def superseded(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class QualityReport:
    """The measures of one summary (text + structured memory) against known facts."""

    preservation: float
    """Share of facts whose latest value the text or structured memory states (1.0 with
    no facts)."""
    preserved_in_text: float
    preserved_in_structured: float
    stale_rate: float
    """Share of corrected facts with a superseded value presented as current (0.0 with no
    corrections)."""
    compression_ratio: float
    lost: tuple[str, ...]
    """Slots of the facts not preserved."""
    stale: tuple[str, ...]
    """Slots of the facts with a superseded value presented as current."""


def _slot_fact(structured: StructuredMemory, slot: str) -> Fact | None:
    return structured.entities.get(slot) or structured.facts.get(slot)


def lost_items(
    summary_text: str,
    structured: StructuredMemory,
    *,
    extractor: RuleEntityExtractor | None = None,
) -> list[str]:
    """The slots of ``structured`` (entities, then facts, in their order) whose current
    value ``summary_text`` does not state. ``extractor`` (with a title catalogue) lets a
    series be found by any of its names. Items (decisions, goals, intentions) are not
    checked: they are kept as said in structured memory, and a summary may word them
    otherwise."""
    from tiermem.summaries.validate import OPINION_PREFIX, mentions, opinion_item

    lost = []
    for slot, fact in (*structured.entities.items(), *structured.facts.items()):
        if slot.startswith(OPINION_PREFIX):
            # An opinion's value is its sentiment ("loves"), a word no summary needs to
            # write: checked by its subject, as validation checks it.
            if not mentions(summary_text, opinion_item(slot, fact.value, fact.turn_index)):
                lost.append(slot)
        elif not states_value(summary_text, fact.value, slot=slot, extractor=extractor):
            lost.append(slot)
    return lost


def _in_structured(structured: StructuredMemory, slot: str, value: str) -> bool:
    fact = _slot_fact(structured, slot)
    return fact is not None and same_value(fact.value, value, slot=slot)


def _in_text(text: str, slot: str, value: str, extractor: RuleEntityExtractor | None) -> bool:
    return states_value(text, value, slot=slot, extractor=extractor)


def fact_preservation(
    facts: Sequence[FactTruth],
    summary_text: str,
    structured: StructuredMemory | None = None,
    *,
    extractor: RuleEntityExtractor | None = None,
) -> float:
    """The share of ``facts`` whose latest value ``summary_text`` or ``structured`` states
    (1.0 for no facts)."""
    if not facts:
        return 1.0
    memory = structured or StructuredMemory()
    kept = sum(
        _in_text(summary_text, f.slot, f.value, extractor)
        or _in_structured(memory, f.slot, f.value)
        for f in facts
    )
    return kept / len(facts)


def stale_facts(
    facts: Sequence[FactTruth],
    summary_text: str,
    structured: StructuredMemory | None = None,
    *,
    extractor: RuleEntityExtractor | None = None,
) -> list[str]:
    """The slots of ``facts`` with a superseded value presented as current (see the module
    docstring): held as the slot's current value in ``structured``, or stated by a sentence
    of ``summary_text`` or an item of ``structured`` that does not state the latest
    value."""
    memory = structured or StructuredMemory()
    corrected = [f for f in facts if f.superseded]
    if not corrected:
        return []
    sentences = [s for line in summary_text.splitlines() for s in split_sentences(line)]
    sentences += [i.text for i in (*memory.decisions, *memory.goals, *memory.unresolved)]
    stale = []
    for fact in corrected:
        old_values = [v for v in fact.superseded if not same_value(v, fact.value, slot=fact.slot)]
        held = any(_in_structured(memory, fact.slot, old) for old in old_values)
        said = any(
            _in_text(sentence, fact.slot, old, extractor)
            and not _in_text(sentence, fact.slot, fact.value, extractor)
            for sentence in sentences
            for old in old_values
        )
        if held or said:
            stale.append(fact.slot)
    return stale


def compression_ratio(source_tokens: int, summary_tokens: int) -> float:
    """``summary_tokens / source_tokens``: 0.1 is a summary a tenth of its source's size.

    Raises:
        ValidationError: a negative count, or a source of 0 tokens.
    """
    if source_tokens <= 0 or summary_tokens < 0:
        raise ValidationError(
            f"token counts must be positive (source {source_tokens}, summary {summary_tokens})"
        )
    return summary_tokens / source_tokens


def entity_drift(before: Iterable[Entity], after: Iterable[Entity]) -> float:
    """How far the entities of ``after`` (a summary) moved from those of ``before`` (its
    source's active entities, or the previous summary's): the Jaccard distance of the two
    sets of ``(kind, value)``, 0.0 when they are the same, 1.0 when they share nothing.
    Lost entities and entities that appeared from nowhere both count (seed 004 keeps it
    under 10%)."""
    a = {(e.kind, e.value) for e in before}
    b = {(e.kind, e.value) for e in after}
    union = a | b
    return len(a ^ b) / len(union) if union else 0.0


def measure(
    facts: Sequence[FactTruth],
    *,
    summary_text: str,
    structured: StructuredMemory | None,
    source_tokens: int,
    summary_tokens: int,
    extractor: RuleEntityExtractor | None = None,
) -> QualityReport:
    """Every measure of one summary against ``facts`` (see the module docstring).

    Raises:
        ValidationError: as :func:`compression_ratio`.
    """
    memory = structured or StructuredMemory()
    in_text = [_in_text(summary_text, f.slot, f.value, extractor) for f in facts]
    in_memory = [_in_structured(memory, f.slot, f.value) for f in facts]
    lost = tuple(f.slot for f, t, m in zip(facts, in_text, in_memory, strict=True) if not (t or m))
    stale = tuple(stale_facts(facts, summary_text, memory, extractor=extractor))
    corrected = sum(1 for f in facts if f.superseded)
    n = len(facts)
    return QualityReport(
        preservation=(n - len(lost)) / n if n else 1.0,
        preserved_in_text=sum(in_text) / n if n else 1.0,
        preserved_in_structured=sum(in_memory) / n if n else 1.0,
        stale_rate=len(stale) / corrected if corrected else 0.0,
        compression_ratio=compression_ratio(source_tokens, summary_tokens),
        lost=lost,
        stale=stale,
    )
