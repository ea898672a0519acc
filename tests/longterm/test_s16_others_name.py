"""Session 16 (H2): someone else's name is not the user's.

``JA_NAME`` read any 「…名前は X」: 「娘の名前はハナです」 ("my daughter's name is Hana") wrote
``name`` = ハナ, the user's name, shown in their profile from then on. Now 「Xの名前は」 is the
user's only when X ends in a first person (私, わたし, 僕, 俺, 自分, あたし) or 「名前は」 stands
alone; and the name is what follows 「名前は」 up to a comma (「私の名前はハナ、よろしく」 wrote
name = よろしく, the last part, as an object of a like is read). The English forms ("my
daughter's name is Hana") never matched ``EN_NAME`` ("my name is"): guards. The
someone-else and comma cases fail on fc45edb; the guards pass on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.summaries.test_s15_redact_ended_favourite import deployment
from tiermem.longterm.detect import detect_memories

SOMEONE_ELSE = [
    "娘の名前はハナです",
    "妻の名前はユイです",
    "夫の名前はケンです",
    "息子の名前はタロウ",
    "母の名前は花子です",
    "友達の名前はケンです",
    "娘さんの名前はハナです",
    "うちの猫の名前はタマです",
    "私の娘の名前はハナです",
]
ENGLISH_SOMEONE_ELSE = [
    "My daughter's name is Hana.",
    "My wife's name is Yui.",
    "My friend's name is Ken.",
    "Her name is Hana.",
    "My son is named Taro.",
]
MINE = [
    ("私の名前はハナです", "ハナ"),
    ("わたしの名前はハナです", "ハナ"),
    ("僕の名前はケンです", "ケン"),
    ("自分の名前はケンです", "ケン"),
    ("名前はケンといいます", "ケン"),
    ("ちなみに私の名前はハナです", "ハナ"),
    ("My name is Ken.", "Ken"),
    ("my name's Ken", "Ken"),
    ("My son's name is Taro and my name is Ken.", "Ken"),
]
MINE_AFTER_SOMEONE_ELSE = [
    ("夫の名前はケンで、私の名前はユイです", "ユイ"),
    ("私の名前はハナ、娘の名前はユイです", "ハナ"),
    ("私の名前はハナ、よろしく", "ハナ"),
]


def names(text: str) -> list[str | None]:
    return [d.value for d in detect_memories(text) if d.key == "name"]


@pytest.mark.parametrize("text", SOMEONE_ELSE + ENGLISH_SOMEONE_ELSE)
def test_someone_elses_name_is_not_the_users(text: str) -> None:
    assert names(text) == []


@pytest.mark.parametrize(("text", "name"), MINE + MINE_AFTER_SOMEONE_ELSE)
def test_the_users_own_name_still_counts(text: str, name: str) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize(
    ("text", "name"), [("Call me Ken.", "Ken"), ("ケンと呼んでください", "ケン")]
)
def test_call_me_still_counts(text: str, name: str) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == [("addressed_as", name)]


@pytest.mark.parametrize("name", ["memory+memory", "memory+sqlite"])
async def test_a_daughters_name_leaves_the_users_name(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(["私の名前はユイです", "娘の名前はハナです"])
        slot = await d.memory.longterm.get_preference(d.user, "name")
        assert slot is not None
        assert slot.metadata["preference_value"] == "ユイ"
        assert await d.memory.longterm.preference_history(d.user, "name") == []
