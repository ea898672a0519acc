"""A hedge inside a concessive clause ("Although it might be good, ...") is that clause's,
not the dislike's after it (session 17; session 16 left "Although it might be good, I don't
like horror" read as a hedged dislike, which drafts nothing). The dislike cases fail before
session 17; the hedged ones pin what must stay hedged.
"""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import RuleMemoryDetector

_DETECTOR = RuleMemoryDetector()


def _said(text: str) -> list[str]:
    return [draft.content for draft in _DETECTOR.detect(text)]


@pytest.mark.parametrize(
    ("text", "drafted"),
    [
        ("Although it might be good, I don't like horror", "dislikes horror"),
        ("Though it may not be fair, I hate horror", "hates horror"),
        ("Even if it might be fun, I don't like horror", "dislikes horror"),
        ("Even though it's maybe a classic, I don't like horror", "dislikes horror"),
        ("I know it's popular. While it might be great, I don't like horror.", "dislikes horror"),
        ("I like it, and while it might be good, I don't like horror", "dislikes horror"),
        ("Whereas others probably love it, I dislike horror", "dislikes horror"),
    ],
)
def test_a_hedge_in_a_concessive_clause_leaves_the_dislike(text: str, drafted: str) -> None:
    assert _said(text) == [drafted]


@pytest.mark.parametrize(
    "text",
    [
        "Although it is good, I probably don't like horror",  # the hedge is the main clause's
        "although, maybe I don't like horror",  # an empty concessive clause
        "Although I probably don't like horror, I'll watch it",  # the dislike is inside it
        "While I might not like horror much, I'll try it",
        "Maybe, I don't like horror",  # a comma alone is no break
        "I probably don't like horror",
    ],
)
def test_a_hedge_on_the_dislike_itself_still_drafts_nothing(text: str) -> None:
    assert _said(text) == []
