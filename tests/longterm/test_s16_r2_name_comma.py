"""Review of session 16 (R2): the user's Japanese name around a comma.

05fb8c4 made the name what follows 「名前は」 up to a comma, but cut the clause before the
copula was taken off, and kept an empty part: 「私の名前はハナです、よろしく」 wrote ``name`` =
ハナです (on fc45edb: よろしく), and 「私の名前は、ハナです」 -- a comma right after 「名前は」,
common in writing -- wrote no name at all (fc45edb: ハナ). Now the name is the first
non-empty part after 「名前は」, without its copula. Every case but the guards fails on
5d94d0d."""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import detect_memories

CASES = [
    ("私の名前は、ハナです", "ハナ"),
    ("私の名前は、ハナです。", "ハナ"),
    ("名前は、ケンといいます", "ケン"),
    ("私の名前はハナです、よろしく", "ハナ"),
    ("名前はケンといいます、よろしくお願いします", "ケン"),
    ("僕の名前はケンだ、よろしく", "ケン"),
]
GUARDS = [
    ("私の名前はハナです", "ハナ"),
    ("私の名前はハナ、よろしく", "ハナ"),
    ("夫の名前はケンで、私の名前はユイです", "ユイ"),
]


def names(text: str) -> list[str | None]:
    return [d.value for d in detect_memories(text) if d.key == "name"]


@pytest.mark.parametrize(("text", "name"), CASES + GUARDS)
def test_the_name_is_the_first_part_after_the_topic_without_its_copula(
    text: str, name: str
) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize("text", ["娘の名前は、ハナです", "私の名前は、", "名前は、、"])
def test_someone_elses_or_no_name_writes_none(text: str) -> None:
    assert names(text) == []
