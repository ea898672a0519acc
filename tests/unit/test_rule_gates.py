"""The cheap gates in front of the turn path's rules never change what the rules find.

Date mentions skip a pattern when a literal it needs is absent, and a phrase index runs only
the groups whose first word is a word of the text. Each is checked here against the
ungated scan (every pattern, every group) on generated text made of the words the rules
look for, so a gate that drops a real match fails.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.longterm import recall_dates
from tiermem.policies.importance import DEFAULT_IMPORTANCE_RULES as RULES
from tiermem.policies.phrases import PhraseIndex, TextView, _leftmost_longest

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)

DATE_WORDS = [
    "the", "day", "before", "yesterday", "today", "tonight", "this", "morning", "afternoon",
    "evening", "tomorrow", "two", "3", "days", "weeks", "months", "ago", "last", "on", "past",
    "monday", "friday", "sunday", "week", "next", "month", "march", "9th", "9", "of", "in",
    "jan.", "sept", "2024-03-01", "12", "an", "a", "may", "mar", "dec", "31st", "december",
    "2026-02-30", "Yesterday", "TODAY", "ORD-12", "４２", "2024年",
]  # fmt: skip


def _ungated_mentions(text: str) -> list[tuple[str, object, str, bool]]:
    """find_date_mentions without its gates: every pattern scans the text."""
    lowered = text.casefold()
    taken: list[tuple[int, int]] = []
    found = []
    for kind, pattern in recall_dates._PATTERNS:
        for match in pattern.finditer(lowered):
            start, end = match.span()
            if any(start < e and s < end for s, e in taken):
                continue
            mention = recall_dates._resolve(kind, match, NOW.date())
            if mention is not None:
                taken.append((start, end))
                found.append((start, mention))
    ordered = [mention for _, mention in sorted(found, key=lambda pair: pair[0])]
    return [(m.phrase, m.day, m.precision, m.relative) for m in ordered]


def _texts(words: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(words), min_size=1, max_size=12).flatmap(
        lambda picked: st.sampled_from([" ", "", "-", "\n", ", "]).map(lambda sep: sep.join(picked))
    )


def test_every_date_pattern_has_a_gate() -> None:
    """Every pattern can be opened by the gates (none is gated out for good)."""
    text = (
        "2026-03-09, the day before yesterday, yesterday, today, tomorrow, 2 days ago, "
        "2 weeks ago, 2 months ago, last monday, last week, this week, next week, "
        "last month, march 9, 9th of march, in march"
    )
    opened = {kind for kind, _, _ in recall_dates._scans(text)}
    assert {kind for kind, _ in recall_dates._PATTERNS} == opened


@settings(max_examples=400, deadline=None)
@given(_texts(DATE_WORDS))
def test_date_gates_find_what_every_pattern_finds(text: str) -> None:
    found = recall_dates.find_date_mentions(text, NOW)
    assert [(m.phrase, m.day, m.precision, m.relative) for m in found] == _ungated_mentions(text)


CUE_LISTS = (
    RULES.preference_cues,
    RULES.correction_cues,
    RULES.recommendation_cues,
    RULES.acknowledgement_cues + RULES.greeting_cues,
    ("Berserk", "ベルセルク", "One Piece", "Final Fantasy", "Dr. Stone", "86", "dark fantasy"),
)
OTHER_WORDS = (
    "OK",
    "ok-ok",
    "i's",
    "Book",
    "this",
    "好きです",
    "が",
    "青年",
    "ÀÉ",
    "’",
    "'",
    "!",
    "42",
)
PHRASE_WORDS = sorted(
    {word for cues in CUE_LISTS for cue in cues for word in cue.split()} | set(OTHER_WORDS)
)


def _ungated_find(index: PhraseIndex, view: TextView) -> list[tuple[int, int, str]]:
    """PhraseIndex.find with every group's pattern run on the text."""
    patterns = [index._pattern(first) for first in index._groups]
    text = view.folded
    return [(s, e, " ".join(text[s:e].split())) for s, e in _leftmost_longest(patterns, text)]


INDEXES = [PhraseIndex(cues) for cues in CUE_LISTS]


@settings(max_examples=400, deadline=None)
@given(_texts(PHRASE_WORDS))
def test_phrase_candidates_find_what_every_group_finds(text: str) -> None:
    for index in INDEXES:
        view = TextView(text)
        assert index.find(view) == _ungated_find(index, view)
        assert index.search(view) == bool(_ungated_find(index, view))


ENTITY_WORDS = ("vol", "42", "42巻", "¥1,200", "a@b.co", "978-4-08-851234-1")


@settings(max_examples=300, deadline=None)
@given(_texts(DATE_WORDS + PHRASE_WORDS + list(ENTITY_WORDS)))
def test_entity_rule_gates_find_what_every_rule_finds(text: str) -> None:
    extractor = RuleEntityExtractor({"Berserk": "Berserk", "Final Fantasy": "Final Fantasy"})
    ungated = RuleEntityExtractor({"Berserk": "Berserk", "Final Fantasy": "Final Fantasy"})
    ungated._folded_gates = ungated._normal_gates = ()
    ungated._folded_ascii_gates = ungated._normal_ascii_gates = ()
    ungated._plan = tuple((rule, None) for rule, _ in ungated._plan)
    ungated._ungated = tuple(rule for rule, _ in ungated._plan)
    assert extractor.find(text) == ungated.find(text)
