"""Which planted facts an assembled context keeps, and whether it presents a superseded
value as current: the check of issue #10's acceptance, shared by
``tests/context/test_planted_facts.py`` and ``bench/context_facts.py``.

The measures are :mod:`tiermem.summaries.quality`'s, applied to a rendered
:class:`~tiermem.context.ContextWindow` rather than to a summary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tiermem.context import ContextWindow, render_anthropic
from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.summaries.quality import FactTruth, fact_preservation, stale_facts

__all__ = ["HISTORY_KINDS", "STATE_KINDS", "FactCheck", "check_facts"]

STATE_KINDS = ("profile", "summary", "structured_memory", "entities")
"""Items that present the session's state; turns and recall hits present its history."""
HISTORY_KINDS = ("turn", "recall", "current")


@dataclass(frozen=True, slots=True)
class FactCheck:
    """What a rendered context did with the planted facts."""

    lost: tuple[str, ...]
    """Slots whose latest value the rendered context does not state."""
    stale: tuple[str, ...]
    """Slots whose superseded value the context presents as current."""


def check_facts(
    window: ContextWindow,
    facts: Sequence[FactTruth],
    entities: RuleEntityExtractor | None = None,
) -> FactCheck:
    """Latest values in the rendered request (Anthropic Messages); no superseded value
    presented as current.

    State items (summaries, structured memory, profile, entities) must not state an old
    value without the latest (:func:`~tiermem.summaries.quality.stale_facts`). Turns and
    recalled turns are history: an old value there is what the user said then, so it is
    stale only when the last statement (by turn index) of any value of the slot states an
    old one. Summary lines that quote a turn with its index (``- [256] User: ...``, the
    offline engine's lines) are dated statements too: a recalled "[turn 176] my budget is
    ¥6,000" followed by a summary's "[256] actually it is ¥3,000" tells the history with
    its correction. ``entities`` (with the title catalogue) lets a series be found by any
    of its names.
    """
    rendered = json.dumps(render_anthropic(window), ensure_ascii=False)
    lost = tuple(
        f.slot for f in facts if fact_preservation([f], rendered, extractor=entities) < 1.0
    )
    state = "\n".join(i.text for i in window.items if i.kind in STATE_KINDS)
    stale = set(stale_facts(facts, state, extractor=entities))
    history = _history(window)
    for fact in facts:
        if not fact.superseded:
            continue
        last_old = last_new = -1
        for position, text in enumerate(history):
            if stale_facts([fact], text, extractor=entities):
                last_old = position
            elif fact_preservation([fact], text, extractor=entities) == 1.0:
                last_new = position
        if last_old > last_new:
            stale.add(fact.slot)
    return FactCheck(lost=lost, stale=tuple(sorted(stale)))


_QUOTED_TURN = re.compile(r"^\s*-\s*\[(\d+)\]\s")


def _history(window: ContextWindow) -> list[str]:
    """The window's dated statements, oldest first: turns, recalled turns and the current
    message by their provenance, summary lines by the turn index they quote."""
    dated: list[tuple[int, str]] = [
        (i.provenance.turn_indexes[-1] if i.provenance.turn_indexes else 1 << 30, i.text)
        for i in window.items
        if i.kind in HISTORY_KINDS
    ]
    for item in window.items:
        if item.kind != "summary":
            continue
        for line in item.text.splitlines():
            if match := _QUOTED_TURN.match(line):
                dated.append((int(match.group(1)), line))
    return [text for _, text in sorted(dated, key=lambda d: d[0])]
