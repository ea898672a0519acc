"""Review of session 16 (R2): PatternPolicy's edge. ``ignored`` is documented as compared
case-folded, but only the topic was folded: ``ignored={"Berserk"}`` ignored nothing. And a
huge ``days`` was accepted, then every roll-up raised OverflowError from ``timedelta``.
All but the lower-case word (a guard) fail on 5d94d0d."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiermem.errors import ValidationError
from tiermem.models import MemoryRecord, Provenance
from tiermem.summaries.patterns import PatternPolicy, session_topics

START = datetime(2030, 1, 1, 9, tzinfo=UTC)


def _summary(facts: dict[str, str]) -> MemoryRecord:
    return MemoryRecord(
        memory_id="m-0",
        user_id="u",
        memory_type="interaction_summary",
        content="Session 0",
        created_at=START,
        metadata={"topics": list(facts.values()), "facts": facts},
        provenance=Provenance(source="handoff", session_id="s-0"),
    )


@pytest.mark.parametrize("word", ["Berserk", "BERSERK", "berserk"])
def test_an_ignored_word_is_ignored_whatever_its_case(word: str) -> None:
    policy = PatternPolicy(ignored=frozenset({word}))
    assert session_topics(_summary({"series": "Berserk"}), policy) == {}
    assert set(session_topics(_summary({"series": "Vagabond"}), policy)) == {"series:vagabond"}


def test_a_window_too_long_or_bad_ignored_words_are_refused() -> None:
    with pytest.raises(ValidationError, match="days"):
        PatternPolicy(days=10**9)
    with pytest.raises(ValidationError, match="ignored"):
        PatternPolicy(ignored="manga")  # type: ignore[arg-type]
    assert PatternPolicy(days=3_650).window.days == 3_650
