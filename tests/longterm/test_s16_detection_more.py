"""Session 16 (H7): a hiragana name ending in だ, and a hedge in an earlier clause.

- 「私の名前はやまだ」 wrote ``name`` = やま: a bare だ came off every name, and 「やまだです」
  lost it too (です came off, then だ). Surnames end in だ (やまだ, よしだ, しまだ, おだ):
  a bare だ after hiragana is now the name's, unless a second だ follows (「やまだだ」);
  です, だよ, といいます still come off (「やまだです」, 「よしだだよ」: やまだ, よしだ).
- A hedge in an earlier clause dropped a dislike when no clause split came between them
  ("It might rain, but honestly I don't like horror", "…, yet I don't like horror",
  「雨かもしれないが、ホラーは苦手」): a clause break (but, yet, ;, the end of a sentence,
  けど, が、) between the hedge and the dislike now puts the hedge out of its scope.

The 15 cases of NAMES and DISLIKES fail on 7a095a8; the 19 guards (NAME_GUARDS,
EARLIER_CLAUSE_GUARDS, STILL_HEDGED) pass on both."""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import detect_memories

NAMES = [
    ("私の名前はやまだ", "やまだ"),
    ("私の名前はやまだです", "やまだ"),
    ("名前はやまだだ", "やまだ"),
    ("私の名前はしまだ", "しまだ"),
    ("名前はおだ", "おだ"),
    ("僕の名前ははまだです。", "はまだ"),
    ("私の名前はまえだといいます", "まえだ"),
    ("名前はわだ、よろしく", "わだ"),
    ("私の名前はいしだと申します", "いしだ"),
]
NAME_GUARDS = [
    ("私の名前は田中だ", "田中"),
    ("名前はハナだよ", "ハナ"),
    ("名前はケンだ", "ケン"),
    ("私の名前は田中です", "田中"),
    ("私の名前はあかね", "あかね"),  # its ね is the name's (f741dd7)
    ("名前ははなだよ", "はな"),  # だよ after hiragana still comes off
    ("私の名前はさくらです", "さくら"),
    ("名前はよしだだよ", "よしだ"),  # だよ came off before too
]
DISLIKES = [
    ("It might rain, but honestly I don't like horror.", "dislikes"),
    ("Maybe it's late, but still I don't like horror.", "dislikes"),
    ("It might rain, yet I don't like horror.", "dislikes"),
    ("It might rain but honestly I hate horror.", "hates"),
    ("雨かもしれないが、ホラーは苦手", "dislikes"),
    ("たぶん雨だが、ホラーは好きじゃない", "dislikes"),
]
EARLIER_CLAUSE_GUARDS = [
    ("It might rain, but I don't like horror.", "dislikes"),
    ("Maybe it's late, but I don't like horror.", "dislikes"),
    ("It might rain; I don't like horror.", "dislikes"),
    ("たぶん雨だけど、ホラーは苦手", "dislikes"),
]
STILL_HEDGED = [
    "I probably don't like horror.",
    "Maybe I don't like horror anymore.",
    "Maybe, I don't like horror.",
    "It might rain, but honestly I probably don't like horror.",
    "It might rain, but honestly I don't like horror, maybe.",
    "雨かもしれないが、たぶんホラーは苦手",
    "雨だが、ホラーは苦手かも",
]


def names(text: str) -> list[str | None]:
    return [d.value for d in detect_memories(text) if d.key == "name"]


@pytest.mark.parametrize(("text", "name"), NAMES)
def test_a_hiragana_name_keeps_its_da(text: str, name: str) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize(("text", "name"), NAME_GUARDS)
def test_a_copula_still_comes_off(text: str, name: str) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize(("text", "value"), DISLIKES + EARLIER_CLAUSE_GUARDS)
def test_a_hedge_in_an_earlier_clause_keeps_the_dislike(text: str, value: str) -> None:
    assert [(d.key, d.value) for d in detect_memories(text)] == [("opinion:genre:horror", value)]


@pytest.mark.parametrize("text", STILL_HEDGED)
def test_a_hedge_in_the_dislikes_clause_still_drafts_nothing(text: str) -> None:
    assert detect_memories(text) == ()
