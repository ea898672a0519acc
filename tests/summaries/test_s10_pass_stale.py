"""Session 10: the stale-row rule (``_drop_stale``) walks no slot range for rows that state
no slot and looks a row's body up once; it keeps exactly the rows it kept before. The rule
as it was is kept here (the reference) and compared on random rows: slot statements,
corrections with wrong values, mentions of old values, tool lines without a body."""

from __future__ import annotations

import random

from tiermem.summaries._candidates import (
    _IDX,
    _SLOTS_AT,
    _WRONG,
    _body,
    _drop_stale,
    _mentions_of,
    _Row,
)
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import value_key
from tiermem.tokens import TiktokenCounter


def ref_drop_stale(rows: list[_Row]) -> list[int]:
    """``_drop_stale`` before session 10 (1a87939)."""
    latest: dict[str, int] = {}
    current: dict[str, tuple[str, str]] = {}
    stating = [(row[_IDX], at) for at, row in enumerate(rows) if row[_SLOTS_AT]]
    stating.sort()
    for _, at in stating:
        slots = rows[at][_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            latest[slots[pos]] = at
            current[slots[pos]] = (slots[pos + 1], slots[pos + 2])
    stale: dict[str, str] = {}
    wrongs = False
    for row in rows:
        slots = row[_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            if slots[pos + 1] != current[slots[pos]][0]:
                stale[slots[pos + 2]] = slots[pos]
        if row[_WRONG]:
            wrongs = True
            for wrong in row[_WRONG]:
                stale.setdefault(wrong, "")
    if not stating and not wrongs:
        return list(range(len(rows)))
    current_keys = {key for key, _ in current.values()}
    stale = {
        value: slot
        for value, slot in stale.items()
        if value_key(value, slot=slot or None) not in current_keys
    }
    mentions = _mentions_of(stale, current) if stale else None
    kept = []
    for at, row in enumerate(rows):
        slots = row[_SLOTS_AT]
        if slots:
            stated = range(0, len(slots), 3)
            if any(slots[pos + 1] != current[slots[pos]][0] for pos in stated):
                continue
            if any(latest[slots[pos]] == at for pos in stated):
                kept.append(at)
            continue
        if not row[_WRONG] and mentions and mentions.said_in(_body(row)):
            continue
        kept.append(at)
    return kept


SAID = [
    "My budget is ¥5,000.", "Actually my budget is ¥8,000, not ¥5,000.", "My budget is ¥9,000.",
    "Options under ¥5,000 are here.", "Options under ¥8,000 and ¥5,000.", "I'm reading Berserk.",
    "Make it Blame! instead.", "Berserk vol 42 is in stock.", "My postcode is 150-0001.",
    "My postcode is 160-0022, not 150-0001.", "ok thanks", "I prefer seinen.",
    "Do you have Blame! vol 3?", "Your order ORD-12345 ships tomorrow.",
    "Shipping to 150-0001 costs ¥500.", "My budget is ¥8,000 and my postcode is 160-0022.",
]  # fmt: skip


def test_stale_rows_kept_as_before_on_random_rows() -> None:
    rng = random.Random(10)
    summarizer = ExtractiveSummarizer(TiktokenCounter())
    for _ in range(600):
        rows: list[_Row] = []
        for index in range(rng.randint(0, 20)):
            text = rng.choice(SAID)
            if rng.random() < 0.15:  # a tool result's line: no body kept, read from the line
                rows.append((index, f"- [{index}] Result of search: {text}", 0.5, (), (), None,
                             None, None))  # fmt: skip
                continue
            role, who = rng.choice([("user", "User"), ("assistant", "Assistant")])
            fields = summarizer._read_lines(index, role, who, text)
            rows += [fields[at : at + 8] for at in range(0, len(fields), 8)]  # type: ignore[misc]
        rng.shuffle(rows)
        assert _drop_stale(rows) == ref_drop_stale(rows)


def test_the_random_rows_exercise_every_branch() -> None:
    """The rows above do drop stale statements and stale mentions (the test can fail)."""
    summarizer = ExtractiveSummarizer(TiktokenCounter())
    rows: list[_Row] = []
    for index, text in enumerate(
        [
            "My budget is ¥5,000.",
            "Options under ¥5,000 are here.",
            "Actually my budget is ¥8,000, not ¥5,000.",
            "ok thanks",
        ]
    ):
        fields = summarizer._read_lines(index, "user", "User", text)
        rows += [fields[at : at + 8] for at in range(0, len(fields), 8)]  # type: ignore[misc]
    kept = _drop_stale(rows)
    assert kept == ref_drop_stale(rows)
    assert len(kept) < len(rows)
