"""The candidate lines of the offline summarizer (:mod:`tiermem.summaries.offline`): how a
line is laid out as a row, what it scores, and which rows a summary drops as stale. Pure:
values in, values out; the summarizer builds, keeps and ranks the rows.
"""

from __future__ import annotations

import re
import threading
from typing import Final

from tiermem.summaries.structured import (
    ProbeSet,
    SaidIn,
    SentenceReading,
    ValueProbe,
    value_key,
    value_probe,
)

_LINE = re.compile(r"^- \[(?P<index>\d+)\] (?P<who>[^:]{1,80}): (?P<text>.*)$")
_SLOT_LINE = re.compile(r"^(?P<slot>[a-z][a-z0-9_]*(?::[a-z0-9_]+)*): (?P<value>\S.*)$")
"""A carried "slot: value" line (how closed-loop validation states a lost slot)."""
_UNINDEXED = -1

# Scores: what a line carries. A user's slot statement is what validation checks and what
# a later turn most often needs ("what was my budget?").
_SLOT = 10.0
_MEMORY = 6.0
_ITEM = 5.0
_CARRIED_UNINDEXED = 5.0
_ENTITY = 4.0
_NUMBER = 2.0
_TOOL_CALL = 1.0
_TOPIC = 0.2
_RECENCY = 2.0
_ROLE_WEIGHT = {"user": 1.0, "assistant": 0.5, "tool": 0.25}

_Slots = tuple[str, ...]
"""``slot, value key, value as written`` in turn, flat, for each slot a line states (user
statements only), one per slot, the last statement of a slot in a sentence winning, in the
order of the slots' first statements."""


_Row = tuple[int, str, float, _Slots, tuple[str, ...], str | None, int | None, int | None]
"""One candidate line: ``index, line, score, slots, wrong, body, cost, joined`` -- its
turn index (-1 for a carried line without one: an LLM's or validation's line), the line,
what it carries (:func:`_score`, before recency), the slots it states, the values it says
are wrong, what was said without the ``- [i] Who:`` prefix (None: not known yet), the
tokens of the line and one for its newline (what the budget counts) and the exact tokens
of the line with its newline (what the summary's count adds up:
:meth:`~tiermem.summaries._line_tokens.LineTokens._joined_tokens`); None: not known yet,
looked up. A candidate's order is its position among a summary's candidates. A tuple, not
an object: a pass ranks a few hundred lines, most of them kept from earlier passes as they
are (:meth:`~tiermem.summaries.offline.ExtractiveSummarizer._carried`) or as one slice of
a kept text block."""
# Positions of a _Row's fields (Final: mypy reads each as its literal, so a row's field
# has its own type).
_IDX: Final = 0
_LINE_AT: Final = 1
_SCORE: Final = 2
_SLOTS_AT: Final = 3
_WRONG: Final = 4
_BODY: Final = 5
_COST: Final = 6
_JOINED: Final = 7

_LineFields = tuple[int | str | float | tuple[str, ...] | None, ...]
"""The candidate lines of one text block of one turn, as every pass would make them again
(kept per summarizer: :data:`~tiermem.summaries.offline.TURN_CACHE`): for each line,
flat, the seven fields of its :data:`_Row` (the line's tokens are counted once, with its
reading, not looked up by every pass's budget), so that each line is one slice.
Flat, of strings, numbers and tuples of strings only, because the garbage collector stops
tracking such a tuple only once it tracks none of its items, and one level of tuples per
collection (outermost last): so a kept text block leaves nothing tracked after a young and
a middle collection, and adds nothing to full collections (dataclasses with a dict of
slots stayed tracked, about five objects a line)."""
_FIELDS = 8
"""Fields per line in :data:`_LineFields`."""


def _merge(readings: list[SentenceReading]) -> SentenceReading | None:
    """One carried line is one sentence; a line the sentence splitter cuts in two ("vol.
    3" is not cut, "e.g." may be) is read as the first reading with the others' slots."""
    if not readings:
        return None
    if len(readings) == 1:
        return readings[0]
    first = readings[0]
    return SentenceReading(
        text=first.text,
        named=first.named,
        memorable=first.memorable,
        has_number=first.has_number,
        slots=tuple(s for r in readings for s in r.slots),
        wrong=tuple(w for r in readings for w in r.wrong),
        switch=any(r.switch for r in readings),
        about_user=all(r.about_user for r in readings),
        decision=any(r.decision for r in readings),
        goal=any(r.goal for r in readings),
        unresolved=any(r.unresolved for r in readings),
    )


def _slot_keys(reading: SentenceReading | None) -> _Slots:
    if reading is None or not reading.slots:
        return ()
    keys = {s.slot: (value_key(s.value, slot=s.slot), s.value) for s in reading.slots}
    return tuple(field for slot, (key, written) in keys.items() for field in (slot, key, written))


def _score(reading: SentenceReading, weight: float) -> float:
    """What a sentence carries (0: nothing worth a line), before recency."""
    if reading.slots and weight >= 1.0:
        carried = _SLOT
    elif reading.memorable:
        carried = _MEMORY
    elif reading.decision or reading.goal or reading.unresolved:
        carried = _ITEM
    elif reading.named:
        carried = _ENTITY
    elif reading.has_number:
        carried = _NUMBER
    else:
        return 0.0
    if not reading.about_user:
        carried /= 4  # a quoted email or someone else's order: context, rarely needed
    return carried * weight


def _drop_stale(rows: list[_Row]) -> list[int]:
    """The positions of the rows that stay: the latest statement of each slot stays;
    earlier statements of it, and lines that mention a superseded value without the
    current one, go (see the module docstring)."""
    # Slots are flat (slot, value key, value as written) triples: see _Slots.
    latest: dict[str, int] = {}  # slot → position of its latest statement
    current: dict[str, tuple[str, str]] = {}  # slot → (value key, value as written), latest
    stating = [(row[_IDX], at) for at, row in enumerate(rows) if row[_SLOTS_AT]]
    stating.sort()  # by turn, then order
    for _, at in stating:
        slots = rows[at][_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            latest[slots[pos]] = at
            current[slots[pos]] = (slots[pos + 1], slots[pos + 2])
    stale: dict[str, str] = {}  # value as written → its slot ("" for a correction's)
    wrongs = False
    for row in rows:
        slots = row[_SLOTS_AT]
        if slots:  # most rows state no slot: no range to walk (~15 % of this rule)
            for pos in range(0, len(slots), 3):
                if slots[pos + 1] != current[slots[pos]][0]:
                    stale[slots[pos + 2]] = slots[pos]
        if row[_WRONG]:
            wrongs = True
            for wrong in row[_WRONG]:
                stale.setdefault(wrong, "")
    if not stating and not wrongs:
        return list(range(len(rows)))  # nothing stated, nothing superseded
    current_keys = {key for key, _ in current.values()}
    stale = {
        value: slot
        for value, slot in stale.items()
        if value_key(value, slot=slot or None) not in current_keys
    }
    # The stale values (and their slots' current ones), worked out once for every line.
    mentions = _mentions_of(stale, current) if stale else None
    kept = []
    said_in = mentions.said_in if mentions else None
    for at, row in enumerate(rows):
        slots = row[_SLOTS_AT]
        if slots:
            stated = range(0, len(slots), 3)
            if any(slots[pos + 1] != current[slots[pos]][0] for pos in stated):
                continue  # it states a value that a later line replaced
            if any(latest[slots[pos]] == at for pos in stated):
                kept.append(at)
            continue  # else a later line states the same values again
        if said_in is not None and not row[_WRONG]:
            body = row[_BODY]
            if said_in(_body_of(row[_LINE_AT]) if body is None else body):
                continue
        kept.append(at)
    return kept


MENTIONS = 4_096
"""Bodies whose answer a kept set of stale values keeps (:class:`_Mentions`)."""
MENTION_CHARS = 1_000_000
"""Characters of those bodies, at most (a carried line of an LLM's summary may be long)."""
MENTION_SETS = 8
"""Sets of stale values kept (a pass has three tiers; each usually has the set it had at the
previous pass)."""


class _Mentions:
    """One set of stale values (with their slots' current values) and, per body, whether
    it names one of them without its slot's current value (:func:`_mentions_stale`): a
    pure function of the two, kept because a tier's rows are mostly the rows it ranked at
    the previous pass, under the same stale values."""

    __slots__ = ("_answers", "_chars", "_current", "_stale")

    def __init__(self, stale: dict[str, str], current: dict[str, tuple[str, str]]) -> None:
        self._stale = ProbeSet(
            [value_probe(value, slot=slot or None) for value, slot in stale.items()]
        )
        self._current = [
            value_probe(current[slot][1], slot=slot) if slot else None for slot in stale.values()
        ]
        self._answers: dict[str, bool] = {}
        self._chars = 0

    def said_in(self, body: str) -> bool:
        answer = self._answers.get(body)
        if answer is None:
            answer = _mentions_stale(body, self._stale, self._current)
            if len(self._answers) < MENTIONS and self._chars + len(body) <= MENTION_CHARS:
                self._answers[body] = answer
                self._chars += len(body)
        return answer


_MENTION_SETS: dict[tuple[tuple[str, str, str], ...], _Mentions] = {}
_MENTIONS_LOCK = threading.Lock()


def _mentions_of(stale: dict[str, str], current: dict[str, tuple[str, str]]) -> _Mentions:
    """The kept :class:`_Mentions` of ``stale`` (value as written → its slot, "" for a
    correction's) and ``current`` (slot → value key and value as written), by what its
    answers depend on: each stale value, its slot and that slot's current value as
    written, in order (the order does not change an answer)."""
    key = tuple((value, slot, current[slot][1] if slot else "") for value, slot in stale.items())
    kept = _MENTION_SETS.get(key)
    if kept is None:
        kept = _Mentions(stale, current)
        with _MENTIONS_LOCK:
            _MENTION_SETS.pop(key, None)
            _MENTION_SETS[key] = kept
            while len(_MENTION_SETS) > MENTION_SETS:
                del _MENTION_SETS[next(iter(_MENTION_SETS))]  # the oldest kept
    return kept


def _mentions_stale(body: str, stale: ProbeSet, current: list[ValueProbe | None]) -> bool:
    """``body`` names a superseded value (``stale``) and not the current value of its slot
    (``current``, in the same order; None for a correction's wrong value)."""
    said = SaidIn(body)
    for at in stale.stated_by(said):
        now = current[at]
        if now is None or not said.states(now):
            return True
    return False


def _body(row: _Row) -> str:
    body = row[_BODY]
    return _body_of(row[_LINE_AT]) if body is None else body


def _body_of(line: str) -> str:
    match = _LINE.match(line)
    return match.group("text") if match else line


def _lines_chars(fields: _LineFields) -> int:
    lines: tuple[str, ...] = fields[_LINE_AT::_FIELDS]  # type: ignore[assignment]
    return 64 + sum(map(len, lines))


def _carried_chars(row: _Row) -> int:
    return 64 + len(row[_LINE_AT])
