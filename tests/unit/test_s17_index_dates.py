"""A turn's date tags, found behind the term gate (session 17, issue #8), equal the old ones.

``turn_docs`` given the turn's own term counts (``owned_terms``, as the session gives them)
no longer searches an ASCII text for date mentions when none of its terms is a date word
and it has no hyphen; and a turn's date terms are resolved without building
``DateMention`` objects. Neither may change a document: the references below are the old
``turn_docs``, ``turn_date_terms``, ``find_date_mentions`` and ``_resolve``, copied
verbatim, compared with the new code on generated text full of date words, near misses
(plurals, underscores, glued words, capitals) and punctuation.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.longterm import recall_dates
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.recall import _plain_terms, turn_docs
from tiermem.longterm.recall_dates import (
    DateMention,
    find_date_mentions,
    turn_date_tags,
    turn_date_terms,
)
from tiermem.longterm.text import count_terms, text_term_counts, tokenize
from tiermem.models import REDACTED_TEXT, TextBlock, Turn
from tiermem.policies.turn_text import TurnText
from tiermem.store.codec import check_aware

# --- reference: the code before session 17 ---------------------------------------------------


def reference_resolve(kind: str, match: re.Match[str], anchor: date) -> DateMention | None:
    rd = recall_dates
    phrase = match.group(0)
    shift = rd._DAY_SHIFTS.get(kind)
    if shift is not None:  # the kinds without groups
        return DateMention(phrase, anchor + shift, "day", True)
    groups = match.groups()
    if kind == "iso":
        found = rd._dated(int(groups[0]), int(groups[1]), int(groups[2]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind == "days_ago":
        return DateMention(phrase, anchor - timedelta(days=rd._number(groups[0])), "day", True)
    if kind == "weeks_ago":
        back = anchor - timedelta(weeks=rd._number(groups[0]))
        return DateMention(phrase, back - timedelta(days=back.weekday()), "week", True)
    if kind == "months_ago":
        return DateMention(phrase, rd._month_back(anchor, rd._number(groups[0])), "month", True)
    if kind == "last_weekday":
        target = rd._WEEKDAYS.index(groups[0])
        days_back = (anchor.weekday() - target) % 7 or 7
        return DateMention(phrase, anchor - timedelta(days=days_back), "day", True)
    if kind in ("last_week", "this_week", "next_week"):
        day = anchor + rd._WEEK_SHIFTS[kind]
        return DateMention(phrase, day - timedelta(days=day.weekday()), "week", True)
    if kind == "last_month":
        return DateMention(phrase, rd._month_back(anchor, 1), "month", True)
    if kind == "month_day":
        found = rd._past(anchor, rd._month(groups[0]), int(groups[1]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind == "day_month":
        found = rd._past(anchor, rd._month(groups[1]), int(groups[0]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind == "in_month":
        month = rd._month(groups[0])
        year = anchor.year if month <= anchor.month else anchor.year - 1
        return DateMention(phrase, date(year, month, 1), "month", False)
    return None


def reference_find(text: str, anchor: date | datetime) -> list[DateMention]:
    lowered = text.casefold()
    if not lowered.isascii() and recall_dates._ANY_DATE_WORD.search(lowered) is None:
        return []
    scans = recall_dates._scans(lowered)
    if not scans:
        return []
    day = anchor.date() if isinstance(anchor, datetime) else anchor
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, DateMention]] = []
    for kind, pattern, first in scans:
        for match in pattern.finditer(lowered, first):
            start, end = match.span()
            if taken and any(start < e and s < end for s, e in taken):
                continue
            mention = reference_resolve(kind, match, day)
            if mention is not None:
                taken.append((start, end))
                found.append((start, mention))
    if len(found) == 1:
        return [found[0][1]]
    found.sort(key=itemgetter(0))
    return [mention for _, mention in found]


def reference_terms(mention: DateMention, *, widen: bool) -> list[str]:
    rd = recall_dates
    if mention.precision == "day":
        if widen:
            return list(rd._day_week_month(mention.day))
        return [rd.day_term(mention.day)]
    if mention.precision == "week":
        return [rd.week_term(mention.day)] + ([rd.month_term(mention.day)] if widen else [])
    return [rd.month_term(mention.day)]


def reference_turn_date_terms(text: str, at: datetime) -> list[str]:
    terms = list(recall_dates._day_week_month(at.date()))
    mentions = reference_find(text, at)
    if not mentions:
        return terms
    for mention in mentions:
        terms.extend(reference_terms(mention, widen=True))
    return list(dict.fromkeys(terms))


def reference_turn_docs(
    user_id: str,
    session_id: str,
    turns: Sequence[Turn],
    *,
    expires_at: datetime | None = None,
    terms: Sequence[Mapping[str, int] | None] | None = None,
    owned_terms: bool = False,
) -> list[IndexedDoc]:
    """``turn_docs`` before session 17, without embeddings (the session passes none)."""
    plain_ids = type(user_id) is str and type(session_id) is str
    check_aware(expires_at, what="expires_at")
    expires_utc = None if expires_at is None else expires_at.astimezone(UTC)
    docs = []
    trusted_doc = IndexedDoc.trusted
    for i, turn in enumerate(turns):
        content = turn.content
        text = content[0].text if len(content) == 1 and type(content[0]) is TextBlock else turn.text
        if turn.redacted or not text or text.isspace() or text == REDACTED_TEXT:
            continue
        given = terms[i] if terms is not None else None
        dates = tuple(reference_turn_date_terms(text, turn.timestamp))
        counted: dict[str, int] | None = None
        checked = True
        if given is not None:
            if owned_terms and type(given) is dict:
                counted = given
            else:
                counted = dict(given)
                checked = _plain_terms(counted)
            count_terms(counted, dates)
        values: dict[str, object] = {
            "user_id": user_id,
            "doc_id": f"{session_id}#{turn.index}",
            "kind": "turn",
            "text": text,
            "created_at": turn.timestamp,
            "embedding": None,
            "tags": dates,
            "expires_at": expires_utc,
            "terms": counted,
        }
        trusted = plain_ids and checked
        docs.append(trusted_doc(values) if trusted else IndexedDoc(**values))
    return docs


# --- inputs ----------------------------------------------------------------------------------

_DATE_WORDS = sorted(recall_dates._DATE_TERMS)
_NEAR = (
    "days", "weeks", "months", "mondays", "Sundays", "todays", "yesterdays", "agony",
    "chicago", "weekday", "weekend", "monthly", "mayday", "marching", "decimal", "junk",
    "augment", "Octopus", "novel", "sep_", "_may", "may_", "week_2", "ago_", "x_today",
    "TODAY", "Tomorrow", "MARCH", "Mar.", "Sept.", "SEPT", "mornings", "evenings",
    "this", "past", "last", "next", "the day before", "on", "in", "of", "the", "a", "an",
    "two", "twelve", "1st", "2nd", "3rd", "9th", "21st", "31", "32", "9", "12", "2026",
    "12345", "-", "--", "ORD-12345", "2026-03-09", "2026-02-30", "1999-12-31", "3/9",
    "12:30", "Hello!", "ok", "thanks", "I prefer", "seinen", "Berserk", "vol", "42",
    "ships", "order", "ſept", "Ｍａｒｃｈ", "９", "好きな", "明日", "Straße", "ﬀ",
)  # fmt: skip
_PHRASES = (
    "the day before yesterday", "this morning", "this afternoon", "this evening",
    "tonight", "2 days ago", "one day ago", "three weeks ago", "a week ago", "a month ago",
    "12 months ago", "last monday", "on Friday", "this past sunday", "last week",
    "this week", "next week", "last month", "March 9", "mar. 9th", "Sept 21st",
    "9th of march", "1 may", "31 dec", "in March", "in sept.", "in may", "2026-03-09",
)  # fmt: skip
_FRAMES = (("", ""), ("I ordered it ", "."), ("(", ")"), ("Shipped: ", "!"), ("ok ", " thanks"))
_SEPARATORS = (" ", " ", " ", ", ", ". ", "\n", "", "_", "/", "(", ")", "'", '"', "!", "?")
_ANCHORS = (
    datetime(2026, 3, 10, 12, 0, tzinfo=UTC),
    datetime(2026, 1, 2, 23, 59, tzinfo=UTC),
    datetime(2025, 12, 31, 0, 1, tzinfo=UTC),
    datetime(2024, 2, 29, 8, 0, tzinfo=UTC),
)
_PIECES = (*_DATE_WORDS, *(w.capitalize() for w in _DATE_WORDS), *_NEAR, *_PHRASES, *_PHRASES)


def _random_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 12)):
        parts.append(rng.choice(_PIECES))
        parts.append(rng.choice(_SEPARATORS))
    return "".join(parts)


def _turn(index: int, text: str, at: datetime) -> Turn:
    return Turn(
        index=index, role="user", content=(TextBlock(text=text),), timestamp=at, token_count=1
    )


def _both(texts: list[str], at: datetime) -> tuple[list[IndexedDoc], list[IndexedDoc]]:
    turns = [_turn(i, text, at) for i, text in enumerate(texts)]
    expires = at + timedelta(days=30)
    old = reference_turn_docs(
        "u1",
        "s1",
        turns,
        expires_at=expires,
        terms=[text_term_counts(TurnText.of(t)) for t in texts],
        owned_terms=True,
    )
    new = turn_docs(
        "u1",
        "s1",
        turns,
        expires_at=expires,
        terms=[text_term_counts(TurnText.of(t)) for t in texts],
        owned_terms=True,
    )
    return old, new


def _assert_same(old: list[IndexedDoc], new: list[IndexedDoc]) -> None:
    assert new == old
    for before, after in zip(old, new, strict=True):
        assert after.tags == before.tags
        assert list((after.terms or {}).items()) == list((before.terms or {}).items())


# --- tests -----------------------------------------------------------------------------------


def test_every_gate_word_is_its_own_index_term() -> None:
    """The gate compares index terms: a gate word that is a stopword or whose plural the
    tokenizer folds would never be found, and its dates would be lost."""
    for word in recall_dates._DATE_TERMS:
        assert tokenize(word) == [word], word


def test_the_gate_skips_plain_turns_and_opens_for_dated_ones() -> None:
    at = _ANCHORS[0]
    own = recall_dates._day_week_month(at.date())
    plain = "I prefer seinen, nothing with horror please."
    assert turn_date_tags(plain, at, text_term_counts(TurnText.of(plain))) == own
    dated = "Your order ships tomorrow."
    tags = turn_date_tags(dated, at, text_term_counts(TurnText.of(dated)))
    assert tags == tuple(reference_turn_date_terms(dated, at))
    assert recall_dates.day_term(date(2026, 3, 11)) in tags


def test_each_date_phrase_alone_builds_the_old_documents() -> None:
    """One date phrase in a plain sentence: its gate word is the turn's only one."""
    texts = [f"{lead}{phrase}{tail}" for phrase in _PHRASES for lead, tail in _FRAMES]
    for at in _ANCHORS:
        old, new = _both(texts, at)
        _assert_same(old, new)
        assert all(reference_find(text, at) for text in texts)  # each mentions a date


def test_bench_turns_and_seeded_random_texts_build_the_old_documents() -> None:
    bench = [
        "Hello!",
        "I prefer seinen, nothing with horror please.",
        "Do you have Berserk vol 42 in stock?",
        "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
        "Your order ORD-12345 ships tomorrow.",
        "ok thanks",
    ]
    for at in _ANCHORS:
        _assert_same(*_both(bench, at))
    rng = random.Random(17)
    dated = 0
    for n in range(3000):
        at = _ANCHORS[n % len(_ANCHORS)]
        texts = [_random_text(rng) for _ in range(3)]
        old, new = _both(texts, at)
        _assert_same(old, new)
        dated += sum(len(doc.tags) > 3 for doc in old)
        for text in texts:
            assert turn_date_terms(text, at) == reference_turn_date_terms(text, at), text
            assert find_date_mentions(text, at) == reference_find(text, at), text
    assert dated > 2000  # the texts mention dates, not only the gate's plain turns


_word_texts = st.lists(
    st.one_of(
        st.sampled_from(_PIECES),
        st.sampled_from(_SEPARATORS),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 -_.,", max_size=6),
    ),
    min_size=1,
    max_size=16,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.lists(_word_texts, min_size=1, max_size=3), st.sampled_from(_ANCHORS))
def test_generated_texts_build_the_old_documents(texts: list[str], at: datetime) -> None:
    _assert_same(*_both(texts, at))
    for text in texts:
        counts = text_term_counts(TurnText.of(text))
        assert turn_date_tags(text, at, counts) == tuple(reference_turn_date_terms(text, at))
        assert find_date_mentions(text, at) == reference_find(text, at)


def test_terms_not_given_away_are_not_trusted_for_the_gate() -> None:
    """Counts the caller keeps (or has none) are no proof of the text's words: the
    search runs as before."""
    at = _ANCHORS[0]
    turn = _turn(3, "ordered yesterday", at)
    (counted,) = turn_docs("u1", "s1", [turn], terms=[{"ordered": 1}])
    assert recall_dates.day_term(date(2026, 3, 9)) in counted.tags


def test_the_retention_in_any_zone_gives_the_old_documents() -> None:
    """The UTC retention the session passes is taken as it is; other zones are converted
    and checked as before."""
    at = _ANCHORS[0]
    turns = [_turn(0, "Hello!", at), _turn(1, "ships tomorrow", at)]
    jst = timezone(timedelta(hours=9))
    for expires in (None, at + timedelta(days=3), (at + timedelta(days=3)).astimezone(jst)):
        old = reference_turn_docs("u1", "s1", turns, expires_at=expires)
        new = turn_docs("u1", "s1", turns, expires_at=expires)
        _assert_same(old, new)
        for doc in new:
            assert doc.expires_at is None or doc.expires_at.tzinfo is UTC


def test_a_naive_or_foreign_retention_is_still_refused() -> None:
    turns = [_turn(0, "Hello!", _ANCHORS[0])]
    with pytest.raises(ValidationError, match="no timezone"):
        turn_docs("u1", "s1", turns, expires_at=datetime(2026, 3, 10))
    with pytest.raises(ValidationError, match="aware datetime"):
        turn_docs("u1", "s1", turns, expires_at="2026-03-10")  # type: ignore[arg-type]
