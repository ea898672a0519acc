"""Dates for episodic recall: resolve "yesterday", "last week", "two days ago", "March 9"
against a turn's (or the query's) date, and turn them into index terms.

Pure: text and a reference date in, terms out. A turn is indexed with the terms of its own
date and of the dates it mentions, resolved against the turn's timestamp *when it is
indexed* ("I bought it yesterday", said on 10 March, is indexed under 9 March). A query's
date mentions are resolved against the query's time (the service clock), so "what did I buy
two weeks ago?" looks up that day's term, and "last week" that week's.

Terms are single tokens that cannot collide with words: ``dt20260309`` (a day),
``wk2026w10`` (an ISO week), ``mo202603`` (a month). A day mention adds its day, week and
month terms to a turn, so coarser questions ("in March", "last week") still meet it; a query
uses only the terms of the precision it asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import Literal

__all__ = [
    "DateMention",
    "day_term",
    "find_date_mentions",
    "month_term",
    "query_date_terms",
    "turn_date_tags",
    "turn_date_terms",
    "week_term",
]

Precision = Literal["day", "week", "month"]

_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august",
    "september", "october", "november", "december",
)  # fmt: skip
_MONTH_ABBR = {m[:3]: i + 1 for i, m in enumerate(_MONTHS)} | {"sept": 9}
_NUM = r"(\d{1,2}|" + "|".join(_NUMBERS) + r")"
_MON = r"(" + "|".join(list(_MONTHS) + sorted(_MONTH_ABBR, key=len, reverse=True)) + r")\.?"
_ORD = r"(\d{1,2})(?:st|nd|rd|th)?"

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("iso", re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")),
    ("before_yesterday", re.compile(r"\bthe day before yesterday\b")),
    ("yesterday", re.compile(r"\byesterday\b")),
    ("today", re.compile(r"\b(today|tonight|this morning|this afternoon|this evening)\b")),
    ("tomorrow", re.compile(r"\btomorrow\b")),
    ("days_ago", re.compile(rf"\b{_NUM} days? ago\b")),
    ("weeks_ago", re.compile(rf"\b{_NUM} weeks? ago\b")),
    ("months_ago", re.compile(rf"\b{_NUM} months? ago\b")),
    ("last_weekday", re.compile(r"\b(?:last|on|this past) (" + "|".join(_WEEKDAYS) + r")\b")),
    ("last_week", re.compile(r"\blast week\b")),
    ("this_week", re.compile(r"\bthis week\b")),
    ("next_week", re.compile(r"\bnext week\b")),
    ("last_month", re.compile(r"\blast month\b")),
    ("month_day", re.compile(rf"\b{_MON} {_ORD}\b")),
    ("day_month", re.compile(rf"\b{_ORD} (?:of )?{_MON}\b")),
    ("in_month", re.compile(rf"\bin {_MON}\b")),
)
_ISO, _BEFORE_YESTERDAY, _YESTERDAY, _TODAY, _TOMORROW, _DAYS_AGO, _WEEKS_AGO, _MONTHS_AGO = (
    _PATTERNS[:8]
)
_LAST_WEEKDAY, _LAST_WEEK, _THIS_WEEK, _NEXT_WEEK, _LAST_MONTH = _PATTERNS[8:13]
_MONTH_DAY, _DAY_MONTH, _IN_MONTH = _PATTERNS[13:]
_DIGIT = re.compile(r"\d")
_MONTH_STEMS = tuple(month[:3] for month in _MONTHS)


def _has_month_stem(lowered: str) -> bool:
    """Whether ``lowered`` holds a month's first three letters (which every month name and
    abbreviation holds); a chain of ``in`` tests costs less than one regex alternation."""
    return (
        "jan" in lowered
        or "feb" in lowered
        or "mar" in lowered
        or "apr" in lowered
        or "may" in lowered
        or "jun" in lowered
        or "jul" in lowered
        or "aug" in lowered
        or "sep" in lowered
        or "oct" in lowered
        or "nov" in lowered
        or "dec" in lowered
    )


# Text one of which every pattern needs: on text beyond ASCII (Japanese, say) each ``in``
# test of ``_scans`` first widens its needle, and this one search rules most such turns out.
_ANY_DATE_WORD = re.compile(
    "|".join(("-", "day", "tonight", "tomorrow", "this", "ago", "week", "month", *_MONTH_STEMS))
)


def _scans(lowered: str) -> list[tuple[str, re.Pattern[str], int]]:
    """The patterns that can match ``lowered``, in ``_PATTERNS``' order (which settles
    overlaps), each with where its first match can start. Each pattern needs literal text
    (or digits) that a substring test finds absent in most turns: most indexed turns
    mention no date, and a few ``in`` tests cost less than one regex search for any date
    word, let alone a scan with every pattern. A pattern that starts with a literal word
    is scanned from that word's first occurrence (``\\b`` still sees the text before it);
    ``find`` runs only once ``in`` saw the word, as it parses its arguments slowly."""
    scans: list[tuple[str, re.Pattern[str], int]] = []
    # An ISO date: 4 digits, a hyphen, 2 digits ("ORD-12345" has no 4 digits before its
    # hyphen, so it opens no scan). ``isdecimal`` is what ``\\d`` matches.
    hyphen = lowered.find("-", 4) if "-" in lowered else -1
    while hyphen != -1:
        if (
            lowered[hyphen - 4 : hyphen].isdecimal()
            and lowered[hyphen + 1 : hyphen + 3].isdecimal()
        ):
            scans.append((*_ISO, hyphen - 4))
            break
        hyphen = lowered.find("-", hyphen + 1)
    day = "day" in lowered  # yesterday, today and every weekday's name hold it
    if day and "yesterday" in lowered:
        if "the day before yesterday" in lowered:
            scans.append((*_BEFORE_YESTERDAY, lowered.find("the day before yesterday")))
        scans.append((*_YESTERDAY, lowered.find("yesterday")))
    if (day and "today" in lowered) or "tonight" in lowered or "this " in lowered:
        scans.append((*_TODAY, 0))
    if "tomorrow" in lowered:
        scans.append((*_TOMORROW, lowered.find("tomorrow")))
    week = "week" in lowered
    month = "month" in lowered
    if (day or week or month) and " ago" in lowered:
        if day:
            scans.append((*_DAYS_AGO, 0))
        if week:
            scans.append((*_WEEKS_AGO, 0))
        if month:
            scans.append((*_MONTHS_AGO, 0))
    if day:
        scans.append((*_LAST_WEEKDAY, 0))
    if week:
        for phrase, pattern in (
            ("last week", _LAST_WEEK),
            ("this week", _THIS_WEEK),
            ("next week", _NEXT_WEEK),
        ):
            if phrase in lowered:
                scans.append((*pattern, lowered.find(phrase)))
    if month and "last month" in lowered:
        scans.append((*_LAST_MONTH, lowered.find("last month")))
    # A month is said with a day of the month ("March 9", "9th of March") or after "in ".
    if _has_month_stem(lowered):
        if _DIGIT.search(lowered) is not None:
            scans.append((*_MONTH_DAY, 0))
            scans.append((*_DAY_MONTH, 0))
        if "in " in lowered:
            scans.append((*_IN_MONTH, 0))
    return scans


@dataclass(frozen=True, slots=True)
class DateMention:
    """A date said in a text, resolved: ``phrase`` as written, the date it means (the first
    day of the week or month for coarser mentions), and how precise it is."""

    phrase: str
    day: date
    precision: Precision
    relative: bool
    """Whether the phrase only means something against the date it was said on."""


def day_term(day: date) -> str:
    return f"dt{day:%Y%m%d}"


def week_term(day: date) -> str:
    year, week, _ = day.isocalendar()
    return f"wk{year}w{week:02d}"


def month_term(day: date) -> str:
    return f"mo{day:%Y%m}"


def _number(text: str) -> int:
    return int(text) if text.isdigit() else _NUMBERS[text]


def _month(text: str) -> int:
    text = text.rstrip(".")
    return _MONTHS.index(text) + 1 if text in _MONTHS else _MONTH_ABBR[text]


def _dated(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _past(anchor: date, month: int, day: int) -> date | None:
    """``month``/``day`` in the anchor's year, or the year before when that is > 31 days
    ahead (people speak of the past: "on December 30" said on 2 January)."""
    found = _dated(anchor.year, month, day)
    if found is not None and found - anchor > timedelta(days=31):
        found = _dated(anchor.year - 1, month, day)
    return found


def _month_back(anchor: date, months: int) -> date:
    index = anchor.year * 12 + anchor.month - 1 - months
    return date(index // 12, index % 12 + 1, 1)


_DAY_SHIFTS = {
    "before_yesterday": timedelta(days=-2),
    "yesterday": timedelta(days=-1),
    "today": timedelta(0),
    "tomorrow": timedelta(days=1),
}
_WEEK_SHIFTS = {
    "last_week": timedelta(days=-7),
    "this_week": timedelta(0),
    "next_week": timedelta(days=7),
}


_Resolved = tuple[date, Precision, bool]
"""A mention's ``day``, ``precision`` and ``relative`` (:class:`DateMention` without its
phrase)."""


def _resolve(kind: str, match: re.Match[str], anchor: date) -> DateMention | None:
    resolved = _resolved(kind, match, anchor)
    return None if resolved is None else DateMention(match.group(0), *resolved)


def _resolved(kind: str, match: re.Match[str], anchor: date) -> _Resolved | None:
    """What ``match`` (of the pattern ``kind``) means against ``anchor``; None: no such
    date (30 February). Plain tuples: a turn's index terms need no :class:`DateMention`,
    whose frozen ``__init__`` cost more than the rest of resolving a mention."""
    shift = _DAY_SHIFTS.get(kind)
    if shift is not None:  # the kinds without groups
        return anchor + shift, "day", True
    groups = match.groups()
    if kind == "iso":
        found = _dated(int(groups[0]), int(groups[1]), int(groups[2]))
        return None if found is None else (found, "day", False)
    if kind == "days_ago":
        return anchor - timedelta(days=_number(groups[0])), "day", True
    if kind == "weeks_ago":
        back = anchor - timedelta(weeks=_number(groups[0]))
        return back - timedelta(days=back.weekday()), "week", True
    if kind == "months_ago":
        return _month_back(anchor, _number(groups[0])), "month", True
    if kind == "last_weekday":
        target = _WEEKDAYS.index(groups[0])
        days_back = (anchor.weekday() - target) % 7 or 7
        return anchor - timedelta(days=days_back), "day", True
    if kind in ("last_week", "this_week", "next_week"):
        day = anchor + _WEEK_SHIFTS[kind]
        return day - timedelta(days=day.weekday()), "week", True
    if kind == "last_month":
        return _month_back(anchor, 1), "month", True
    if kind == "month_day":
        found = _past(anchor, _month(groups[0]), int(groups[1]))
        return None if found is None else (found, "day", False)
    if kind == "day_month":
        found = _past(anchor, _month(groups[1]), int(groups[0]))
        return None if found is None else (found, "day", False)
    if kind == "in_month":
        month = _month(groups[0])
        year = anchor.year if month <= anchor.month else anchor.year - 1
        return date(year, month, 1), "month", False
    return None  # pragma: no cover - every pattern kind is handled above


def find_date_mentions(text: str, anchor: date | datetime) -> list[DateMention]:
    """The dates ``text`` mentions, resolved against ``anchor`` (the day it was said), in
    order of appearance; overlapping phrases count once (the longest pattern first)."""
    return [DateMention(match.group(0), *resolved) for match, resolved in _mentions(text, anchor)]


def _mentions(text: str, anchor: date | datetime) -> list[tuple[re.Match[str], _Resolved]]:
    """:func:`find_date_mentions`' mentions, as each pattern's match and what it means."""
    lowered = text.casefold()
    if not lowered.isascii() and _ANY_DATE_WORD.search(lowered) is None:
        return []
    scans = _scans(lowered)
    if not scans:
        return []
    day = anchor.date() if isinstance(anchor, datetime) else anchor
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, re.Match[str], _Resolved]] = []
    for kind, pattern, first in scans:
        for match in pattern.finditer(lowered, first):
            start, end = match.span()
            if taken and any(start < e and s < end for s, e in taken):
                continue
            resolved = _resolved(kind, match, day)
            if resolved is not None:
                taken.append((start, end))
                found.append((start, match, resolved))
    if len(found) == 1:
        _, match, resolved = found[0]
        return [(match, resolved)]
    found.sort(key=itemgetter(0))  # stable: overlaps were settled in pattern order
    return [(match, resolved) for _, match, resolved in found]


@lru_cache(maxsize=256)
def _day_week_month(day: date) -> tuple[str, str, str]:
    """The day, week and month terms of ``day`` (a turn's own date repeats turn after turn:
    formatting them costs more than the rest of an ordinary turn's date terms)."""
    return day_term(day), week_term(day), month_term(day)


def _terms(mention: DateMention, *, widen: bool) -> list[str]:
    return _resolved_terms(mention.day, mention.precision, widen=widen)


def _resolved_terms(day: date, precision: Precision, *, widen: bool) -> list[str]:
    if precision == "day":
        if widen:
            return list(_day_week_month(day))
        return [day_term(day)]
    if precision == "week":
        return [week_term(day)] + ([month_term(day)] if widen else [])
    return [month_term(day)]


def turn_date_terms(text: str, at: datetime) -> list[str]:
    """Index terms of a turn said at ``at``: its own day, week and month, and those of the
    dates it mentions (relative ones resolved against ``at``). Distinct, in order."""
    terms = list(_day_week_month(at.date()))
    mentions = _mentions(text, at)
    if not mentions:
        return terms  # the day, week and month terms differ by their prefixes
    for _, (day, precision, _) in mentions:
        terms.extend(_resolved_terms(day, precision, widen=True))
    return list(dict.fromkeys(terms))


# The index terms (:func:`~tiermem.longterm.text.tokenize`'s words: no stopword, no plural
# to fold) of which every pattern that can add a term needs one, as a whole word: each
# pattern's words stand between ``\b``s, so in an ASCII text they are whole words for the
# tokenizer too ("2 days ago" needs "ago", "last week" "week", "on Monday" the weekday,
# "March 9" and "in Sept." the month). An ISO date needs a hyphen instead; "today",
# "tonight" and "this morning" mean the turn's own day, whose terms every turn has.
_DATE_TERMS = frozenset(
    ("yesterday", "tomorrow", "ago", "week", "month", *_WEEKDAYS, *_MONTHS, *_MONTH_ABBR)
)


def turn_date_tags(
    text: str, at: datetime, terms: Mapping[str, int] | None = None
) -> tuple[str, ...]:
    """:func:`turn_date_terms` as a tuple (an index document's tags).

    ``terms``: the index terms of ``text`` (:func:`~tiermem.longterm.text.text_term_counts`
    of this very text), when the caller counted them: an ASCII text without a hyphen (an
    ISO date's) none of whose terms is a date word (:data:`_DATE_TERMS`) mentions no date,
    and takes the turn's own terms without a search (most turns: one set test in C where
    the search's substring tests cost ten times as much).
    """
    if (
        terms is not None
        and "-" not in text
        and text.isascii()
        and terms.keys().isdisjoint(_DATE_TERMS)
    ):
        return _day_week_month(at.date())
    return tuple(turn_date_terms(text, at))


def query_date_terms(query: str, now: datetime) -> list[str]:
    """Index terms of the dates a query mentions, resolved against ``now``, at the
    precision asked (a day's term for "yesterday", a week's for "last week")."""
    terms: list[str] = []
    for mention in find_date_mentions(query, now):
        terms.extend(_terms(mention, widen=False))
    return list(dict.fromkeys(terms))
