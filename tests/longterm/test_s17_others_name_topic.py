"""Someone else as the topic right before a bare 「名前は」 names them, not the user
(session 17; session 16 left 「娘、名前はハナです」 writing the user's name as ハナ, though
「娘の名前はハナです」 wrote nothing). The first four cases fail before session 17; the rest
pin the user's own name.
"""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import RuleMemoryDetector

_DETECTOR = RuleMemoryDetector()


@pytest.mark.parametrize(
    ("text", "drafted"),
    [
        ("娘、名前はハナです", []),
        ("息子は、名前は太郎です", []),
        ("妻って、名前はユキ", []),
        ("彼女、名前はユキです", []),
        ("娘の名前はハナです", []),
        ("名前はハナです", ["name: ハナ"]),
        ("はじめまして、名前はハナです", ["name: ハナ"]),
        ("私の名前はハナです", ["name: ハナ"]),
        ("娘、名前はハナです。私の名前は田中です", ["name: 田中"]),
    ],
)
def test_whose_name_a_bare_name_is(text: str, drafted: list[str]) -> None:
    assert [draft.content for draft in _DETECTOR.detect(text)] == drafted
