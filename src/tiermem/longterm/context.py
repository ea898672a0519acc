"""The user context: a compact block of what is known about a user, for a system prompt.

::

    Known about this user:
    Preferences:
    - prefers seinen  [pref, session s-1 turn 3]
    - dislikes horror  [pref, session s-2 turn 0]
    Relevant memories:
    - Correction: I meant volume 3  [fact, 2030-01-02, session s-1 turn 5]

Preferences come first (all current ones: they are short and always relevant), then what
recall finds for the query (summaries, facts, feedback…). Every line says where it came
from. The block fits the token budget (counted with cl100k, the budget shrunk by the
model's safety margin when a model is named); when it does not, the lowest-priority items
are dropped first: recalled items by ascending score, then preferences by ascending
importance, oldest first. With nothing to say, the block is one line, :data:`EMPTY_TEXT`.

A session's active entities override the profile (seed 001: "Profile says English, Redis
says Japanese (user just switched) → conversation tier wins for current session"):
:func:`override_by_entities` leaves out a preference whose key an active entity of the
session contradicts (``preferred_language: English`` while ``language: japanese`` is
active), so the model is not shown two answers with no rule between them.

:func:`render_user_context` and :func:`override_by_entities` are pure (values in, a
:class:`UserContext` out); :func:`build_user_context` fetches the values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

from tiermem.errors import ValidationError
from tiermem.longterm._detect_rules import KIND_FAVORITE_KEY
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.preferences import PREFERENCE_KEY_ALIASES
from tiermem.models import ActiveEntity, FrozenModel, MemoryRecord, Provenance
from tiermem.tokens import ModelRegistry, TokenCounter, default_registry

if TYPE_CHECKING:
    from tiermem.longterm.memory import LongTermMemory

__all__ = [
    "EMPTY_TEXT",
    "MAX_LINE_CHARS",
    "UserContext",
    "UserContextItem",
    "build_user_context",
    "describe_provenance",
    "effective_budget",
    "override_by_entities",
    "render_user_context",
]

EMPTY_TEXT = "No prior information about this user."
HEADER = "Known about this user:"
PREFERENCES_HEADER = "Preferences:"
RECALLED_HEADER = "Relevant memories:"
MAX_LINE_CHARS = 300
"""Longer memory texts are cut (with "…") so one summary cannot take the whole block."""
_LABELS = {"preference": "pref", "interaction_summary": "summary"}


class UserContextItem(FrozenModel):
    """One line of the block and where it came from."""

    memory_id: str
    memory_type: str
    section: Literal["preference", "recalled"]
    line: str
    score: float
    """Importance for a preference, the recall score for a recalled item."""
    provenance: Provenance
    preference_key: str | None = None
    """A keyed preference's (normalised) key, e.g. ``preferred_language``; else None."""
    preference_value: str | None = None
    """A keyed preference's value as set, e.g. ``English``; else None."""


class UserContext(FrozenModel):
    user_id: str
    text: str
    items: tuple[UserContextItem, ...]
    tokens: int
    """Tokens of ``text`` (cl100k); never above the (margin-adjusted) budget."""
    budget_tokens: int
    dropped: int
    """Items left out to fit the budget."""
    overridden: tuple[str, ...] = ()
    """Memory ids of preferences left out because an active entity of the session says
    otherwise (:func:`override_by_entities`)."""


def _turns(indexes: Sequence[int]) -> str:
    ordered = sorted(set(indexes))
    if len(ordered) == 1:
        return f"turn {ordered[0]}"
    if len(ordered) > 2 and ordered[-1] - ordered[0] == len(ordered) - 1:
        return f"turns {ordered[0]}-{ordered[-1]}"
    return "turns " + ", ".join(str(i) for i in ordered)


def describe_provenance(provenance: Provenance) -> str:
    """A short human-readable source: ``session s-1 turn 3``, ``from m-1``, ``explicit``."""
    if provenance.session_id is not None:
        where = f"session {provenance.session_id}"
        return f"{where} {_turns(provenance.turn_indexes)}" if provenance.turn_indexes else where
    if provenance.memory_ids:
        ids = provenance.memory_ids
        return f"from {ids[0]}" if len(ids) == 1 else f"from {len(ids)} memories"
    return provenance.source


def _shorten(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_LINE_CHARS else flat[: MAX_LINE_CHARS - 1].rstrip() + "…"


def _line(record: MemoryRecord, *, dated: bool) -> str:
    label = _LABELS.get(record.memory_type, record.memory_type)
    parts = [label]
    if dated:
        parts.append(record.created_at.date().isoformat())
    parts.append(describe_provenance(record.provenance))
    return f"- {_shorten(record.content)}  [{', '.join(parts)}]"


@dataclass(frozen=True, slots=True)
class _Candidate:
    item: UserContextItem
    priority: tuple[int, float, float]
    """Higher is kept longer: (section: preferences 1, recalled 0), score, recency."""


def _render(items: Sequence[UserContextItem]) -> str:
    if not items:
        return EMPTY_TEXT
    lines = [HEADER]
    prefs = [i.line for i in items if i.section == "preference"]
    recalled = [i.line for i in items if i.section == "recalled"]
    if prefs:
        lines += [PREFERENCES_HEADER, *prefs]
    if recalled:
        lines += [RECALLED_HEADER, *recalled]
    return "\n".join(lines)


def render_user_context(
    user_id: str,
    preferences: Sequence[MemoryRecord],
    hits: Sequence[RecallHit],
    *,
    budget_tokens: int,
    counter: TokenCounter,
) -> UserContext:
    """The block for these preferences and recall hits, within ``budget_tokens``.

    Preferences are ordered by importance, then newest first; recalled items by score.
    Hits without a memory record, and hits of a memory already shown as a preference, are
    skipped. If even :data:`EMPTY_TEXT` does not fit, the text is empty.

    Raises:
        ValidationError: ``budget_tokens`` is negative.
    """
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 0:
        raise ValidationError(f"budget_tokens must be an integer >= 0, got {budget_tokens!r}")
    candidates: list[_Candidate] = []
    shown: set[str] = set()
    for record in preferences:
        shown.add(record.memory_id)
        item = UserContextItem(
            memory_id=record.memory_id,
            memory_type=record.memory_type,
            section="preference",
            line=_line(record, dated=False),
            score=record.importance,
            provenance=record.provenance,
            preference_key=_text_or_none(record.metadata.get("preference_key")),
            preference_value=_text_or_none(record.metadata.get("preference_value")),
        )
        candidates.append(_Candidate(item, (1, record.importance, record.created_at.timestamp())))
    for hit in hits:
        recalled = hit.memory
        if recalled is None or recalled.memory_id in shown:
            continue
        shown.add(recalled.memory_id)
        item = UserContextItem(
            memory_id=recalled.memory_id,
            memory_type=recalled.memory_type,
            section="recalled",
            line=_line(recalled, dated=True),
            score=hit.score,
            provenance=recalled.provenance,
        )
        candidates.append(_Candidate(item, (0, hit.score, recalled.created_at.timestamp())))
    candidates.sort(key=lambda c: c.priority, reverse=True)
    kept = [c.item for c in candidates]
    text = _render(kept)
    tokens = counter.count(text)
    while tokens > budget_tokens and kept:
        kept.pop()  # the lowest priority
        text = _render(kept)
        tokens = counter.count(text)
    if tokens > budget_tokens:
        text, tokens = "", 0
    return UserContext(
        user_id=user_id,
        text=text,
        items=tuple(kept),
        tokens=tokens,
        budget_tokens=budget_tokens,
        dropped=len(candidates) - len(kept),
    )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


_OVERRIDING_KINDS = frozenset({"language"})
"""Entity kinds whose active value is the user's choice for the session, not only its
topic: a session in Japanese, or asking for Japanese editions, has switched from a
preferred English (seed 001's case). An active ``genre`` or ``series`` is what the
conversation is about ("Berserk is a seinen, right?" makes ``genre: seinen`` active): it
does not contradict a favourite shojo, which the model still needs to recommend (and to
answer "what genre do I like?")."""
_OVERRIDDEN_KEYS = {
    key: kind for kind, key in KIND_FAVORITE_KEY.items() if kind in _OVERRIDING_KINDS
}
_OVERRIDDEN_KEYS |= {
    old: _OVERRIDDEN_KEYS[new]
    for old, new in PREFERENCE_KEY_ALIASES.items()
    if new in _OVERRIDDEN_KEYS
}
"""Preference key → the entity kind whose active value overrides it (``preferred_language``
→ ``language``): the map the detector writes these preferences by, read backwards, for
the kinds of :data:`_OVERRIDING_KINDS`, and the old names of those keys
(``favorite_language``, :data:`PREFERENCE_KEY_ALIASES`) that records written before the
rename still carry."""


def override_by_entities(
    context: UserContext, entities: Iterable[ActiveEntity], *, counter: TokenCounter
) -> UserContext:
    """``context`` without the preferences a session's active ``entities`` contradict.

    A preference is contradicted when its key is the favourite key of the ``language``
    kind (``preferred_language``: the map :mod:`tiermem.longterm.detect` writes it by; or
    its old name, ``favorite_language``, that a record written before the rename still
    carries) and the active ``language`` entity has another value, compared
    as structured memory compares values (:func:`tiermem.summaries.structured.same_value`:
    "English", "english" and "英語" are one language; "the Japanese edition" is
    ``japanese``). Of several entities of one kind, the last is the active one.

    The line is left out, not marked: the active entity (shown with the session's
    entities) already says the current value, a marker would cost tokens in every window
    and still show the stale value the model might follow, and the stored preference is
    not changed (the session overrides it, it does not correct it). Its memory id goes to
    :attr:`UserContext.overridden`. Preferences without a key (``remember(...,
    memory_type="preference")``), opinions (``opinion:genre:shojo``), favourites of the
    kinds a conversation is only about (``favorite_genre`` while ``genre: seinen`` is
    active, ``favorite_series``) and keys of kinds with no entity are never left out.

    The result depends on the preferences and the active entities only, so it changes
    when the user switches (a change of the cached prefix, the profile being before the
    cache point, once per switch) and never from turn to turn while neither changes.
    Returns ``context`` itself when nothing is contradicted.
    """
    active = {e.kind: e.value for e in entities}
    if not active:
        return context
    # Imported here: summaries depends on longterm, and same_value is needed only when a
    # session has an active entity of a kind some preference is keyed by.
    from tiermem.summaries.structured import same_value

    overridden: list[str] = []
    for item in context.items:
        kind = _OVERRIDDEN_KEYS.get(item.preference_key or "")
        if kind is None or item.preference_value is None or item.section != "preference":
            continue
        value = active.get(kind)
        if value is not None and not same_value(item.preference_value, value, slot=kind):
            overridden.append(item.memory_id)
    if not overridden:
        return context
    gone = set(overridden)
    kept = [item for item in context.items if item.memory_id not in gone]
    text = _render(kept)
    tokens = counter.count(text)
    if tokens > context.tokens:  # EMPTY_TEXT longer than what it replaces: never grow
        text, tokens = "", 0
    return context.model_copy(
        update={
            "text": text,
            "items": tuple(kept),
            "tokens": tokens,
            "overridden": (*context.overridden, *overridden),
        }
    )


def effective_budget(budget_tokens: int, model: str | None, models: ModelRegistry | None) -> int:
    """``budget_tokens`` shrunk by the model's safety margin (our counts are cl100k
    estimates for other tokenizers). Raises UnknownModelError for an unknown model."""
    if model is None:
        return budget_tokens
    spec = (models or default_registry()).get(model)
    return math.floor(budget_tokens * (1 - Fraction(str(spec.safety_margin))))


async def build_user_context(
    memory: LongTermMemory,
    user_id: str,
    query: str,
    *,
    budget_tokens: int,
    model: str | None = None,
    models: ModelRegistry | None = None,
    k: int = 8,
    max_preferences: int = 50,
) -> UserContext:
    """The user context for ``query``: current preferences (up to ``max_preferences``) and
    the ``k`` best recalled non-preference memories, within the budget.

    Without a recaller (or with an empty query), only preferences are shown.

    Raises:
        ValidationError: a bad id or budget.
        UnknownModelError: ``model`` is not in the model registry.
    """
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 0:
        raise ValidationError(f"budget_tokens must be an integer >= 0, got {budget_tokens!r}")
    budget = effective_budget(budget_tokens, model, models)
    preferences = await memory.preferences(user_id, limit=max_preferences)
    hits: list[RecallHit] = []
    if memory.recaller is not None and query.strip():
        types = [t for t in memory.types.names() if t != "preference"]
        hits = await memory.recall(user_id, query, types=types, k=k)
    context = render_user_context(
        user_id, preferences, hits, budget_tokens=budget, counter=memory.tokens
    )
    return context.model_copy(update={"budget_tokens": budget_tokens})
