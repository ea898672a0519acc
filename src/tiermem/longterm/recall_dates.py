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
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Literal

__all__ = [
    "DateMention",
    "day_term",
    "find_date_mentions",
    "month_term",
    "query_date_terms",
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
# Literal text without which a pattern cannot match (it needs one of them). Most turns
# mention no date: a handful of substring searches rule out most of the patterns' scans of
# every indexed turn. Every month name and abbreviation holds its first three letters.
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
    "last_weekday": ("day",),  # every weekday's name
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
    (kind, pattern, _GATE_LIST.index(_GATES[kind])) for kind, pattern in _PATTERNS
)
# Every gate's strings at once: a text that holds none of them opens no gate (one search
# rules out a dateless turn, the usual one).
_ANY_GATE = re.compile("|".join(map(re.escape, dict.fromkeys(s for g in _GATE_LIST for s in g))))


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


def _resolve(kind: str, match: re.Match[str], anchor: date) -> DateMention | None:
    phrase = match.group(0)
    groups = match.groups()
    if kind == "iso":
        found = _dated(int(groups[0]), int(groups[1]), int(groups[2]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind in ("before_yesterday", "yesterday", "today", "tomorrow"):
        shift = {"before_yesterday": -2, "yesterday": -1, "today": 0, "tomorrow": 1}[kind]
        return DateMention(phrase, anchor + timedelta(days=shift), "day", True)
    if kind == "days_ago":
        return DateMention(phrase, anchor - timedelta(days=_number(groups[0])), "day", True)
    if kind == "weeks_ago":
        back = anchor - timedelta(weeks=_number(groups[0]))
        return DateMention(phrase, back - timedelta(days=back.weekday()), "week", True)
    if kind == "months_ago":
        return DateMention(phrase, _month_back(anchor, _number(groups[0])), "month", True)
    if kind == "last_weekday":
        target = _WEEKDAYS.index(groups[0])
        days_back = (anchor.weekday() - target) % 7 or 7
        return DateMention(phrase, anchor - timedelta(days=days_back), "day", True)
    if kind in ("last_week", "this_week", "next_week"):
        shift = {"last_week": -7, "this_week": 0, "next_week": 7}[kind]
        day = anchor + timedelta(days=shift)
        return DateMention(phrase, day - timedelta(days=day.weekday()), "week", True)
    if kind == "last_month":
        return DateMention(phrase, _month_back(anchor, 1), "month", True)
    if kind == "month_day":
        found = _past(anchor, _month(groups[0]), int(groups[1]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind == "day_month":
        found = _past(anchor, _month(groups[1]), int(groups[0]))
        return None if found is None else DateMention(phrase, found, "day", False)
    if kind == "in_month":
        month = _month(groups[0])
        year = anchor.year if month <= anchor.month else anchor.year - 1
        return DateMention(phrase, date(year, month, 1), "month", False)
    return None  # pragma: no cover - every pattern kind is handled above


def find_date_mentions(text: str, anchor: date | datetime) -> list[DateMention]:
    """The dates ``text`` mentions, resolved against ``anchor`` (the day it was said), in
    order of appearance; overlapping phrases count once (the longest pattern first)."""
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
            mention = _resolve(kind, match, day)
            if mention is not None:
                taken.append((start, end))
                found.append((start, mention))
    return [mention for _, mention in sorted(found, key=lambda pair: pair[0])]


@lru_cache(maxsize=256)
def _day_week_month(day: date) -> tuple[str, str, str]:
    """The day, week and month terms of ``day`` (a turn's own date repeats turn after turn:
    formatting them costs more than the rest of an ordinary turn's date terms)."""
    return day_term(day), week_term(day), month_term(day)


def _terms(mention: DateMention, *, widen: bool) -> list[str]:
    if mention.precision == "day":
        if widen:
            return list(_day_week_month(mention.day))
        return [day_term(mention.day)]
    if mention.precision == "week":
        return [week_term(mention.day)] + ([month_term(mention.day)] if widen else [])
    return [month_term(mention.day)]


def turn_date_terms(text: str, at: datetime) -> list[str]:
    """Index terms of a turn said at ``at``: its own day, week and month, and those of the
    dates it mentions (relative ones resolved against ``at``). Distinct, in order."""
    terms = list(_day_week_month(at.date()))
    mentions = find_date_mentions(text, at)
    if not mentions:
        return terms  # the day, week and month terms differ by their prefixes
    for mention in mentions:
        terms.extend(_terms(mention, widen=True))
    return list(dict.fromkeys(terms))


def query_date_terms(query: str, now: datetime) -> list[str]:
    """Index terms of the dates a query mentions, resolved against ``now``, at the
    precision asked (a day's term for "yesterday", a week's for "last week")."""
    terms: list[str] = []
    for mention in find_date_mentions(query, now):
        terms.extend(_terms(mention, widen=False))
    return list(dict.fromkeys(terms))
