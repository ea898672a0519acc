"""Session 16 (H5): Japanese name endings, a name that is none, and a hedge's scope.

- 「僕の名前は田中だよ」 wrote ``name`` = 田中だよ: only です / だ / といいます / と申します came
  off. Now a copula with its sentence-final particle (だよ, だね, ですよ, でございます, っす)
  comes off, and a particle alone (よ, ね) after a name not written in hiragana.
- 「名前はまだない」 wrote ``name`` = まだない (「秘密です」: 秘密): a negation or a refusal
  is no name.
- A hedge anywhere in the sentence dropped a real dislike: "I don't like horror, it might
  scare me" (the hedge is the reason's) and 「ホラーは苦手、かもめも苦手」 (かも inside かもめ)
  drafted nothing. Now the hedge must be the dislike's: up to its object, or alone after it.

The 24 cases of NAMES, NO_NAME, DISLIKES and the gull fail on b232e45; the 15 guards
(NAME_GUARDS, English names and 「…と呼んで」, STILL_HEDGED) pass on both."""

from __future__ import annotations

import pytest

from tiermem.longterm.detect import detect_memories

NAMES = [
    ("僕の名前は田中だよ", "田中"),
    ("名前は田中だよ", "田中"),
    ("名前は田中だね", "田中"),
    ("私の名前は田中ですよ", "田中"),
    ("私の名前は田中でございます", "田中"),
    ("名前は田中っす", "田中"),
    ("名前は田中よ", "田中"),
    ("名前はハナね", "ハナ"),
    ("私の名前はあかねだよ", "あかね"),
    ("名前はケンって言います", "ケン"),
]
NAME_GUARDS = [
    ("私の名前は田中です。", "田中"),
    ("私の名前はハナです", "ハナ"),
    ("名前はケンといいます", "ケン"),
    ("私の名前は田中と申します", "田中"),
    ("私の名前はあかね", "あかね"),  # its ね is the name's
    ("名前はナイ", "ナイ"),
]
NO_NAME = [
    "名前はまだない",
    "名前はまだ決めていない",
    "名前はないです",
    "名前は秘密です",
    "名前は内緒だよ",
    "名前はまだありません",
    "名前は教えたくありません",
]
DISLIKES = [
    ("I don't like horror, it might scare me.", "dislikes"),
    ("I don't like horror, maybe it's too scary.", "dislikes"),
    ("I hate horror because it might give me nightmares.", "hates"),
    ("I don't like horror, but maybe I'll try it.", "dislikes"),
    ("ホラーは苦手、かもめも苦手", "dislikes"),
    ("ホラーは嫌い、怖いかも", "dislikes"),
]
STILL_HEDGED = [
    "I probably don't like horror.",
    "I don't like horror, maybe.",
    "I don't like horror, probably not.",
    "I don't like horror, or maybe I do.",
    "I'm not a fan of horror, maybe.",
    "ホラーは苦手かもね",
    "ホラーは苦手なのかも",
    "ホラーは苦手、たぶん",
]


def names(text: str) -> list[str | None]:
    return [d.value for d in detect_memories(text) if d.key == "name"]


@pytest.mark.parametrize(("text", "name"), NAMES)
def test_a_copula_and_a_final_particle_are_not_part_of_the_name(text: str, name: str) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize(("text", "name"), NAME_GUARDS)
def test_names_read_before_still_read(text: str, name: str) -> None:
    assert names(text) == [name]


@pytest.mark.parametrize("text", NO_NAME)
def test_a_negation_or_refusal_is_no_name(text: str) -> None:
    assert detect_memories(text) == ()


def test_english_names_and_call_me_are_unchanged() -> None:
    assert names("My name is Ken.") == ["Ken"]
    assert [(d.key, d.value) for d in detect_memories("ハナと呼んで")] == [("addressed_as", "ハナ")]


@pytest.mark.parametrize(("text", "value"), DISLIKES)
def test_a_hedge_outside_the_dislike_keeps_the_dislike(text: str, value: str) -> None:
    drafts = [(d.key, d.value) for d in detect_memories(text)]
    assert drafts[0] == ("opinion:genre:horror", value)


def test_kamome_is_a_gull_not_a_doubt() -> None:
    assert [(d.key, d.value) for d in detect_memories("かもめは苦手")] == [
        ("opinion:かもめ", "dislikes")
    ]


@pytest.mark.parametrize("text", STILL_HEDGED)
def test_a_hedge_on_the_dislike_still_drafts_nothing(text: str) -> None:
    assert detect_memories(text) == ()
