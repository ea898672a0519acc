"""A like that ranks ("I like horror more than romance") is a like of its first term, and a
negated one ("I don't like horror more than thrillers") ranks without rejecting: no
draft, as "as much as" since 86e9023. Before, the first wrote the garbled key
``opinion:horror_more_than_romance`` and the second a dislike of horror (which, since
eab43be, ends a favourite horror)."""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import detect_memories

FIXED = (
    ("I like horror more than romance.", [("opinion:genre:horror", "likes")]),
    ("I like horror better than romance.", [("opinion:genre:horror", "likes")]),
    ("I love seinen more than shojo.", [("opinion:genre:seinen", "loves")]),
    ("I prefer paperback rather than hardcover.", [("favorite_format", "paperback")]),
    ("I don't like horror more than thrillers.", []),
    ("I don't like horror better than thrillers.", []),
)
STILL = (
    ("I like horror.", [("opinion:genre:horror", "likes")]),
    ("I don't like horror.", [("opinion:genre:horror", "dislikes")]),
    ("I like more than one genre.", []),
)


@pytest.mark.parametrize(("text", "expected"), FIXED + STILL)
def test_a_comparison_is_a_like_of_its_first_term_or_nothing(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == expected
