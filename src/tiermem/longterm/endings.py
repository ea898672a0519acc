"""Which favourite a dislike ends: the one matcher of "this favourite is the disliked
value", for detection (:meth:`MemoryWrites.remember_detected`), the redaction replay of an
ending and the handoff's check that an ending stands (:mod:`tiermem.summaries.handoff`).

A dislike written under ``opinion:<kind>:<value>`` (``opinion:genre:horror``) ends the
favourite of its kind (``favorite_genre``, :func:`favorite_key_of_kind`) when that
favourite is the same value: the rules file an opinion about it under this very key
("paperbacks" and ``opinion:format:paperback``), or structured memory compares the two as
one (``same_value``: "Japanese" and "日本語"). A favourite of several values ("seinen and
josei", "horror, thrillers", 「ホラーとスリラー」) is never ended: a dislike of one leaves the
other liked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tiermem.longterm.detect import favorite_key_of_kind, opinion_keys
from tiermem.models import JsonValue

_SEVERAL = re.compile(
    r"\s(?:and|or|&)\s|[,/&、]|[^\W\d_ぁ-ゖ]\s*[とや]\s*[^\W\d_ぁ-ゖ]", re.IGNORECASE
)
"""A list of values: "horror and thrillers", "horror, thrillers", 「ホラーとスリラー」."""

__all__ = [
    "ENDED_BY_KEY",
    "ENDED_REASON",
    "dislike_ending",
    "ending_matcher",
    "is_ending",
]

ENDED_BY_KEY = "retired_by_key"
"""Metadata of an ending a dislike made: the dislike's opinion key."""
ENDED_REASON = "retired_reason"
"""Metadata of every ending written since session 16: why the value ended (the dislike's
text, or the reason :meth:`LongTermMemory.retire_preference` was given)."""


def dislike_ending(opinion_key: str) -> tuple[str, Callable[[str], bool]] | None:
    """The favourite's key a dislike under ``opinion_key`` ends, and which of its values
    (module docstring); None for an opinion of no known kind, or of a kind that has no
    favourite."""
    parts = opinion_key.split(":")
    if len(parts) != 3:
        return None  # an opinion about something of no known kind
    kind, value = parts[1], parts[2]
    favourite_key = favorite_key_of_kind(kind)
    if favourite_key is None:
        return None
    # Imported here: summaries depends on longterm.
    from tiermem.summaries.structured import same_value

    def matches(said: str) -> bool:
        keys = opinion_keys(said)
        if keys == {opinion_key}:
            return True
        if len(keys) > 1 or _SEVERAL.search(said):
            # "seinen and josei", "horror, thrillers" (a genre the rules do not know is
            # no key of its own, and same_value keys on the first): a dislike of one
            # leaves the other liked.
            return False
        return same_value(said, value, slot=kind)

    return favourite_key, matches


def is_ending(metadata: Mapping[str, JsonValue]) -> bool:
    """Whether a preference record with ``metadata`` is an ending (a retired favourite:
    by a detected dislike, or explicitly), not a value."""
    return isinstance(metadata.get("retired_by"), str) or isinstance(
        metadata.get(ENDED_REASON), str
    )


def ending_matcher(
    metadata: Mapping[str, JsonValue], dislike_key: str | None = None
) -> Callable[[str], bool]:
    """Which values the ending with ``metadata`` ended, to end them again or to tell that
    it ended a value: an ending a dislike made takes what that dislike's
    :func:`dislike_ending` takes (its opinion key from the ending, else ``dislike_key``,
    the dislike's own, else the one key the rules file the ended value under); an explicit
    ending, or one whose dislike's key is unknown, takes the ended value only."""
    ended = metadata.get("preference_value")
    key = metadata.get(ENDED_BY_KEY)
    if not isinstance(key, str) and isinstance(metadata.get("retired_by"), str):
        key = dislike_key
        if key is None and isinstance(ended, str):
            keys = opinion_keys(ended)
            key = next(iter(keys)) if len(keys) == 1 else None
    found = dislike_ending(key) if isinstance(key, str) else None
    if found is not None:
        return found[1]
    return lambda said: said == ended
