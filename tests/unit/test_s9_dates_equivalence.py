"""Date mentions found by the cheaper gating (session 9, issue #8) equal the old ones.

``find_date_mentions`` used to rule a text in with one regex search for any date word and
then one search per gate; it now rules patterns in with substring tests. Only which
patterns are scanned may change, never what they find: the reference below is the old
gating and scan loop, copied verbatim, run with the module's own patterns and resolution
(unchanged by that work). Compared on the bench turns, the seeded test conversations,
thousands of random texts built from date words, and hypothesis.
"""

from __future__ import annotations

import random
import re
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm import recall_dates
from tiermem.longterm.recall_dates import (
    DateMention,
    find_date_mentions,
    query_date_terms,
    turn_date_terms,
)
from tiermem.testing.conversations import Domain, generate_conversation

# --- reference: the gating and scan loop before session 9 ---------------------------------
_MONTHS = recall_dates._MONTHS
_MONTH_STEMS = tuple(month[:3] for month in _MONTHS)
_GATES: dict[str, tuple[str, ...]] = {
    "iso": ("-",),
    "before_yesterday": ("yesterday",),
    "yesterday": ("yesterday",),
    "today": ("today", "tonight", "this "),
    "tomorrow": ("tomorrow",),
    "days_ago": (" ago",),
    "weeks_ago": (" ago",),
    "months_ago": (" ago",),
    "last_weekday": ("day",),
    "last_week": ("week",),
    "this_week": ("week",),
    "next_week": ("week",),
    "last_month": ("month",),
    "month_day": _MONTH_STEMS,
    "day_month": _MONTH_STEMS,
    "in_month": _MONTH_STEMS,
}
_GATE_LIST = list(dict.fromkeys(_GATES.values()))
_GATE_REGEXES = tuple(re.compile("|".join(map(re.escape, gate))) for gate in _GATE_LIST)
_GATED_PATTERNS = tuple(
    (kind, pattern, _GATE_LIST.index(_GATES[kind])) for kind, pattern in recall_dates._PATTERNS
)
_ANY_GATE = re.compile("|".join(map(re.escape, dict.fromkeys(s for g in _GATE_LIST for s in g))))


def reference_find(text: str, anchor: date | datetime) -> list[DateMention]:
    lowered = text.casefold()
    if _ANY_GATE.search(lowered) is None:
        return []
    day = anchor.date() if isinstance(anchor, datetime) else anchor
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, DateMention]] = []
    gates = [gate.search(lowered) is not None for gate in _GATE_REGEXES]
    for kind, pattern, gate in _GATED_PATTERNS:
        if not gates[gate]:
            continue
        for match in pattern.finditer(lowered):
            start, end = match.span()
            if any(start < e and s < end for s, e in taken):
                continue
            mention = recall_dates._resolve(kind, match, day)
            if mention is not None:
                taken.append((start, end))
                found.append((start, mention))
    return [mention for _, mention in sorted(found, key=lambda pair: pair[0])]


def reference_turn_terms(text: str, at: datetime) -> list[str]:
    terms = list(recall_dates._day_week_month(at.date()))
    for mention in reference_find(text, at):
        terms.extend(recall_dates._terms(mention, widen=True))
    return list(dict.fromkeys(terms))


def reference_query_terms(query: str, now: datetime) -> list[str]:
    terms: list[str] = []
    for mention in reference_find(query, now):
        terms.extend(recall_dates._terms(mention, widen=False))
    return list(dict.fromkeys(terms))


# --- inputs ---------------------------------------------------------------------------------
_ANCHORS = (
    datetime(2026, 3, 10, 12, 0, tzinfo=UTC),
    datetime(2026, 1, 2, 23, 59, tzinfo=UTC),
    datetime(2025, 12, 31, 0, 1, tzinfo=UTC),
    datetime(2024, 2, 29, 8, 0, tzinfo=UTC),
)
_WORDS = (
    *_MONTHS,
    *(m[:3] for m in _MONTHS),
    "sept", "Sept.", "MARCH", "Mar.", "May", "mayday", "marching", "decimal", "junk",
    *recall_dates._WEEKDAYS, "Monday", "days", "day", "week", "weeks", "month", "months",
    "weekday", "weekend", "mondays",
    "yesterday", "the day before yesterday", "today", "tonight", "tomorrow", "todays",
    "this morning", "this afternoon", "this evening", "this past", "this", "this week",
    "last", "last week", "last month", "next week", "next", "on", "in", "of", "the", "ago",
    "days ago", "day ago", "weeks ago", "week ago", "months ago", "month ago", "2 days ago",
    "chicago", "agony", "a", "an", "one", "two", "three", "twelve", "eleven", "ten",
    "1", "2", "9", "12", "31", "32", "42", "99", "2026", "12345", "1st", "2nd", "3rd", "9th",
    "21st", "30th", "-", "--", "/", "ORD-12345", "150-0001", "2026-03-09", "2026-02-30",
    "1999-12-31", "2026-3-9", "12:30", "09:15pm", "3/9", "2026/03/09",
    "２０２６-０３-０９", "９", "１２日", "3月9日", "2026年3月9日", "三月", "月曜日", "昨日",
    "明日", "先週", "来週", "年", "月", "日", "ſ", "K", "İ", "ß", "ﬀ",
    "Hello!", "ok", "thanks", "please", "ships", "order", "Berserk", "vol",
)  # fmt: skip
_SEPARATORS = (" ", " ", " ", "", "-", ". ", ", ", "/", "\n", "  ", "(", ")", "!", "\t")
# Not in ``_random_text``'s draws (kept as they were): spaces other than " " (the patterns
# and gates say " "), full-width forms and characters that casefold to ASCII letters.
_MORE_PIECES = (
    "\u00a0",
    "\u3000",
    "－",
    "ＴＯＤＡＹ",
    "ｌａｓｔ ｗｅｅｋ",
    "\u212a",
    "ﬅ",
    "\u0130",
)


def _random_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 14)):
        word = rng.choice(_WORDS)
        if rng.random() < 0.15:
            word = word.upper() if rng.random() < 0.5 else word.title()
        parts.append(word)
        parts.append(rng.choice(_SEPARATORS))
    return "".join(parts)


def _bench_messages() -> list[str]:
    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        from workload import MESSAGES
    finally:
        sys.path.remove(str(bench))
    return list(MESSAGES)


def _assert_same(text: str, at: datetime) -> None:
    assert find_date_mentions(text, at) == reference_find(text, at), text
    assert find_date_mentions(text, at.date()) == reference_find(text, at.date()), text
    assert turn_date_terms(text, at) == reference_turn_terms(text, at), text
    assert query_date_terms(text, at) == reference_query_terms(text, at), text


# --- tests ----------------------------------------------------------------------------------
def test_bench_messages_find_the_same_mentions() -> None:
    messages = _bench_messages()
    assert any(reference_find(m, _ANCHORS[0]) for m in messages)  # "ships tomorrow"
    for message in messages:
        for at in _ANCHORS:
            _assert_same(message, at)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("domain", ["manga", "assistant"])
def test_conversations_find_the_same_mentions(seed: int, domain: Domain) -> None:
    conversation = generate_conversation(seed, turns=300, domain=domain)
    for turn in conversation.turns:
        _assert_same(turn.text, turn.timestamp)


def test_random_date_texts_find_the_same_mentions() -> None:
    rng = random.Random(20260309)
    found = 0
    for _ in range(6000):
        text = _random_text(rng)
        at = rng.choice(_ANCHORS) + timedelta(days=rng.randint(0, 400))
        expected = reference_find(text, at)
        found += len(expected)
        assert find_date_mentions(text, at) == expected, text
        assert turn_date_terms(text, at) == reference_turn_terms(text, at), text
    assert found > 1000  # the texts exercise the patterns, not only the gate


def test_every_pattern_is_exercised_by_the_random_texts() -> None:
    """The random texts reach every pattern kind (else the comparison proves little)."""
    rng = random.Random(7)
    seen: set[str] = set()
    at = _ANCHORS[0]
    for _ in range(6000):
        lowered = _random_text(rng).casefold()
        for kind, pattern in recall_dates._PATTERNS:
            if kind not in seen and any(
                recall_dates._resolve(kind, m, at.date()) for m in pattern.finditer(lowered)
            ):
                seen.add(kind)
    assert seen == {kind for kind, _ in recall_dates._PATTERNS}


_word_texts = st.lists(
    st.one_of(
        st.sampled_from(_WORDS),
        st.sampled_from(_SEPARATORS + _MORE_PIECES),
        st.text(max_size=4),
    ),
    max_size=16,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(_word_texts, st.text(max_size=40)), offset=st.integers(0, 1500))
def test_hypothesis_texts_find_the_same_mentions(text: str, offset: int) -> None:
    at = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(days=offset)
    _assert_same(text, at)
