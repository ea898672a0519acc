"""Rule-based auto-detection of memories in user turns: tables of English and Japanese
statements, the negatives that must not fire, and the key design (what updates what)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.longterm import _detect_rules as rules
from tiermem.longterm.detect import (
    DetectedMemory,
    RuleMemoryDetector,
    detect_memories,
    sentence_spans,
    split_sentences,
)
from tiermem.policies.phrases import TextView, normal_form
from tiermem.policies.turn_text import TurnText

Draft = tuple[str, str | None, str | None, str]
"""(reason, key, value, content) of a detected memory."""


def drafts(text: str) -> list[Draft]:
    return [(d.reason, d.key, d.value, d.content) for d in detect_memories(text)]


PREFERENCES: list[tuple[str, list[Draft]]] = [
    # stated preferences name one favourite per category
    ("I prefer seinen", [("prefer", "favorite_genre", "seinen", "prefers seinen")]),
    ("ok, I'd prefer shonen", [("prefer", "favorite_genre", "shonen", "prefers shonen")]),
    ("I really prefer dark fantasy.", [
        ("prefer", "favorite_genre", "dark fantasy", "prefers dark fantasy")]),
    ("I prefer reading in Japanese", [
        ("prefer", "opinion:reading_in_japanese", "prefers", "prefers reading in Japanese")]),
    ("I prefer Japanese", [("prefer", "preferred_language", "Japanese", "prefers Japanese")]),
    ("I prefer paperbacks", [
        ("prefer", "favorite_format", "paperbacks", "prefers paperbacks")]),
    ("my favorite genre is seinen", [
        ("favorite", "favorite_genre", "seinen", "favorite genre: seinen")]),
    ("My favourite author is Naoki Urasawa.", [
        ("favorite", "favorite_author", "Naoki Urasawa", "favorite author: Naoki Urasawa")]),
    ("my favorite manga is Vagabond", [
        ("favorite", "favorite_series", "Vagabond", "favorite series: Vagabond")]),
    ("my favorite is horror", [("favorite", "favorite_genre", "horror", "favorite: horror")]),
    # likes and dislikes are opinions, one key per thing
    ("I like horror", [("like", "opinion:genre:horror", "likes", "likes horror")]),
    ("I love horror manga", [("like", "opinion:genre:horror", "loves", "loves horror")]),
    ("I really enjoy isekai stories", [("like", "opinion:genre:isekai", "likes", "likes isekai")]),
    ("I like seinen and josei", [
        ("like", "opinion:genre:seinen", "likes", "likes seinen"),
        ("like", "opinion:genre:josei", "likes", "likes josei")]),
    ("I like the art style in Vagabond", [
        ("like", "opinion:art_style_in_vagabond", "likes", "likes the art style in Vagabond")]),
    ("I don't like horror", [("dislike", "opinion:genre:horror", "dislikes", "dislikes horror")]),
    ("I do not really like romance anymore, but fantasy is fine", [
        ("dislike", "opinion:genre:romance", "dislikes", "dislikes romance")]),
    ("I hate isekai", [("dislike", "opinion:genre:isekai", "hates", "hates isekai")]),
    ("I can't stand cliffhangers", [
        ("dislike", "opinion:cliffhangers", "hates", "hates cliffhangers")]),
    ("I'm not a fan of romance", [
        ("dislike", "opinion:genre:romance", "dislikes", "dislikes romance")]),
    ("I'm a big fan of dark fantasy", [
        ("like", "opinion:genre:dark_fantasy", "likes", "likes dark fantasy")]),
    ("I'm tired of isekai", [("dislike", "opinion:genre:isekai", "dislikes", "dislikes isekai")]),
    ("I like horror and I hate romance", [
        ("like", "opinion:genre:horror", "likes", "likes horror"),
        ("dislike", "opinion:genre:romance", "hates", "hates romance")]),
    # names
    ("call me Ken", [("addressed_as", "addressed_as", "Ken", "wants to be called Ken")]),
    ("Please call me Ken-san", [
        ("addressed_as", "addressed_as", "Ken-san", "wants to be called Ken-san")]),
    ("Could you call me Ken?", [("addressed_as", "addressed_as", "Ken", "wants to be called Ken")]),
    ("My name is Ken Sato", [("name", "name", "Ken Sato", "name: Ken Sato")]),
    # Japanese
    ("好きなジャンルはセイネンです", [
        ("favorite", "favorite_genre", "セイネン", "favorite genre: セイネン")]),
    ("一番好きな作家は浦沢直樹です。", [
        ("favorite", "favorite_author", "浦沢直樹", "favorite author: 浦沢直樹")]),
    ("好きな作品はベルセルク", [
        ("favorite", "favorite_series", "ベルセルク", "favorite series: ベルセルク")]),
    ("セイネンの方が好きです", [("prefer", "favorite_genre", "セイネン", "prefers セイネン")]),
    ("少年より青年のほうが好き", [("prefer", "favorite_genre", "青年", "prefers 青年")]),
    ("ホラーは苦手です", [("dislike", "opinion:genre:horror", "dislikes", "dislikes ホラー")]),
    ("ホラーは嫌い", [("dislike", "opinion:genre:horror", "dislikes", "dislikes ホラー")]),
    ("実はホラーが大嫌いです", [("dislike", "opinion:genre:horror", "hates", "hates ホラー")]),
    ("恋愛はあまり好きじゃない", [
        ("dislike", "opinion:genre:romance", "dislikes", "dislikes 恋愛")]),
    ("私はホラーが大好き！", [("like", "opinion:genre:horror", "loves", "loves ホラー")]),
    ("異世界ものが好きです", [("like", "opinion:genre:isekai", "likes", "likes 異世界")]),
    ("ホラー好きです", [("like", "opinion:genre:horror", "likes", "likes ホラー")]),
    ("セイネン大好き", [("like", "opinion:genre:seinen", "loves", "loves セイネン")]),
    ("ホラーは本当に苦手", [("dislike", "opinion:genre:horror", "dislikes", "dislikes ホラー")]),
    ("時代劇が好き", [("like", "opinion:時代劇", "likes", "likes 時代劇")]),
    ("ホラーは苦手だけど、セイネンは好き", [
        ("dislike", "opinion:genre:horror", "dislikes", "dislikes ホラー"),
        ("like", "opinion:genre:seinen", "likes", "likes セイネン")]),
    ("ホラーじゃなくてセイネンが好き", [
        ("like", "opinion:genre:seinen", "likes", "likes セイネン"),
        ("contrast", "favorite_genre", "セイネン", "prefers セイネン"),
        ("contrast", "opinion:genre:horror", "dislikes", "dislikes ホラー")]),
    ("ケンと呼んでください", [("addressed_as", "addressed_as", "ケン", "wants to be called ケン")]),
    ("私の名前はケンです", [("name", "name", "ケン", "name: ケン")]),
]  # fmt: skip

EXPLICIT: list[tuple[str, str, str]] = [
    ("!remember my birthday is May 3", "command", "my birthday is May 3"),
    ("!remember: I read on a Kindle. And I prefer seinen.", "command",
     "I read on a Kindle. And I prefer seinen."),
    ("remember that I'm allergic to peanuts", "remember_request", "I'm allergic to peanuts"),
    ("Please remember: my budget is $50 a month", "remember_request", "my budget is $50 a month"),
    ("Can you remember that I read on a Kindle?", "remember_request", "I read on a Kindle"),
    ("Keep in mind that I only buy first editions", "remember_request",
     "I only buy first editions"),
    ("私はベジタリアンだと覚えておいて", "remember_request", "私はベジタリアンだ"),
    ("締め切りは金曜日だって覚えておいてね", "remember_request", "締め切りは金曜日だ"),
    ("覚えておいてください：締め切りは金曜日です", "remember_request", "締め切りは金曜日です"),
]  # fmt: skip

CORRECTIONS: list[tuple[str, str]] = [
    ("No, I meant volume 3", "Correction: I meant volume 3"),
    ("I meant the 2021 edition", "Correction: I meant the 2021 edition"),
    ("Actually, show me volume 7 instead", "Correction: Actually, show me volume 7 instead"),
    ("No, it's vol. 12", "Correction: it's vol. 12"),
    ("いいえ、3巻じゃなくて4巻です", "Correction: 3巻じゃなくて4巻です"),
    ("違います、5巻です", "Correction: 5巻です"),
]

NOTHING: list[str] = [
    # questions
    "do you like horror?",
    "Do you prefer seinen or shonen?",
    "ホラーは好きですか？",
    "ホラーは好きですか",
    "Do you remember that book?",
    # vague objects: nothing to recall later
    "I like that one",
    "I love it",
    "I like it when you recommend new series",
    "I like this",
    "これが好き",
    "それは苦手です",
    "これを覚えておいて",
    "大好き！",
    "本当に好き",
    "めっちゃ好き",
    "そういうの好き",
    "あなたが好き",
    "remember me?",
    # wishes, not tastes; other people; negated negatives
    "I'd like volume 3",
    "I would like to order the box set",
    "My friend likes horror",
    "My sister hates romance",
    "I prefer not to get spoilers",
    "I don't hate horror",
    "ホラーは嫌いじゃない",
    # not names
    "call me later",
    "call me back tomorrow",
    "don't call me Ken",
    "my name is not Ken",
    # not memories at all
    "Is Berserk vol 42 in stock?",
    "I remember that",
    "Actually that sounds great",
    "No, it's fine",
    "いいえ、結構です",
    "Hello!",
    "",
    "   ",
    "I like to think so",
]


@pytest.mark.parametrize(("text", "expected"), PREFERENCES)
def test_preferences(text: str, expected: list[Draft]) -> None:
    assert drafts(text) == expected
    assert all(d.memory_type == "preference" for d in detect_memories(text))


@pytest.mark.parametrize(("text", "reason", "content"), EXPLICIT)
def test_explicit_requests_to_remember(text: str, reason: str, content: str) -> None:
    (draft,) = detect_memories(text)
    assert (draft.memory_type, draft.reason, draft.content) == ("fact", reason, content)
    assert draft.explicit
    assert draft.importance == 0.8


@pytest.mark.parametrize(("text", "content"), CORRECTIONS)
def test_corrections(text: str, content: str) -> None:
    (draft,) = detect_memories(text)
    assert (draft.memory_type, draft.reason, draft.content) == ("fact", "correction", content)
    assert draft.tags == ("correction",)
    assert not draft.explicit


@pytest.mark.parametrize("text", NOTHING)
def test_nothing_is_detected(text: str) -> None:
    assert detect_memories(text) == ()


def key_of(text: str) -> str | None:
    (draft,) = detect_memories(text)
    return draft.key


def test_a_new_favourite_updates_the_same_key_and_opinions_are_separate() -> None:
    assert key_of("I prefer seinen") == key_of("I prefer shonen") == "favorite_genre"
    assert key_of("好きなジャンルはセイネンです") == "favorite_genre"
    assert key_of("my favorite genre is josei") == "favorite_genre"
    # A dislike is a key of its own, the same in either language, and a change of heart
    # about the same thing updates it.
    horror = key_of("I don't like horror")
    assert horror != "favorite_genre"
    assert (
        horror == key_of("ホラーは苦手です") == key_of("I love horror now") == key_of("ホラー好き")
    )
    assert key_of("I hate romance") != horror


def test_a_later_statement_in_one_turn_wins() -> None:
    found = detect_memories("I prefer seinen. Actually, I prefer shonen.")
    assert [(d.key, d.value) for d in found] == [("favorite_genre", "shonen")]


def test_mixed_turn_finds_each_statement_in_order() -> None:
    found = detect_memories(
        "Hi! I prefer seinen. Is Berserk vol. 42 in stock? Also I don't like horror."
    )
    assert [(d.key, d.value) for d in found] == [
        ("favorite_genre", "seinen"),
        ("opinion:genre:horror", "dislikes"),
    ]


def test_known_titles_make_series_favourites() -> None:
    detector = RuleMemoryDetector({"Berserk": "Berserk", "ベルセルク": "Berserk"})
    (draft,) = detector.detect("I prefer Berserk")
    assert (draft.key, draft.value) == ("favorite_series", "Berserk")
    (liked,) = detector.detect("ベルセルクが大好き")
    assert (liked.key, liked.value) == ("opinion:series:berserk", "loves")
    assert detect_memories("I prefer Berserk", detector=detector) == (draft,)
    # Without the catalogue it is an opinion about "Berserk".
    assert key_of("I prefer Berserk") == "opinion:berserk"


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("I prefer seinen. Is Berserk vol. 42 in stock?",
         ["I prefer seinen.", "Is Berserk vol. 42 in stock?"]),
        ("It costs 3.5 dollars. Ok", ["It costs 3.5 dollars.", "Ok"]),
        ("I love J. K. Rowling! Really", ["I love J. K. Rowling!", "Really"]),
        ("好き。嫌い", ["好き。", "嫌い"]),
        ("ホラーは苦手？ いいえ", ["ホラーは苦手?", "いいえ"]),
        ("line one\nline two", ["line one", "line two"]),
        ("", []),
    ],
)  # fmt: skip
def test_split_sentences(text: str, sentences: list[str]) -> None:
    assert split_sentences(text) == sentences


@given(st.text(max_size=300))
def test_detection_never_fails_and_drafts_are_well_formed(text: str) -> None:
    for draft in detect_memories(text):
        assert isinstance(draft, DetectedMemory)
        assert draft.content.strip()
        if draft.memory_type == "preference":
            assert draft.key
            assert draft.value
        else:
            assert draft.memory_type == "fact"
            assert draft.key is None


PASTE = "the weather was nice and we walked to the shop. " * 4_000  # ~200 KB


def test_a_long_turn_is_read_at_its_ends() -> None:
    middle = len(PASTE) // 2
    text = "I prefer seinen. " + PASTE[:middle] + "I hate isekai. " + PASTE[middle:]
    text += "Also I don't like horror."
    assert [d.key for d in detect_memories(text)] == ["favorite_genre", "opinion:genre:horror"]


def test_remember_command_keeps_the_whole_turn() -> None:
    (draft,) = detect_memories("!remember " + PASTE + "the end")
    assert draft.content == (PASTE + "the end").strip()


CORPUS = [t for t, _ in PREFERENCES] + [t for t, _, _ in EXPLICIT] + [t for t, _ in CORRECTIONS]
CORPUS += NOTHING


@given(st.text(max_size=200))
def test_a_turn_text_gives_what_its_string_gives(text: str) -> None:
    assert detect_memories(TurnText.of(text)) == detect_memories(text)


@pytest.mark.parametrize("text", CORPUS)
def test_a_gate_never_changes_what_its_pattern_finds(text: str) -> None:
    gated = [v for v in vars(rules).values() if isinstance(v, rules.Gated)]
    view = TextView(text)
    for piece in (view.normal, view.folded, *split_sentences(text)):
        for part in (piece, piece.lower()):
            for pattern in gated:
                for method in ("search", "match"):
                    got = getattr(pattern, method)(part)
                    want = getattr(pattern.regex, method)(part)
                    assert (got and got.span()) == (want and want.span()), (pattern, part)


@given(st.text(max_size=120))
def test_sentence_spans_are_ordered_stripped_and_non_empty(text: str) -> None:
    normal = normal_form(text)
    end = 0
    for start, stop in sentence_spans(normal):
        assert end <= start < stop
        sentence = normal[start:stop]
        assert sentence == sentence.strip()
        end = stop


def test_no_pattern_opens_with_an_unanchored_lazy_dot() -> None:
    # Searching for ".+?X" retries from every position when there is no X: quadratic, and
    # seconds of CPU on one long Japanese sentence. Anchored, it reads the sentence once.
    lazy_start = re.compile(r"(?:\((?:\?P<\w+>|\?:))*\.[+*]\?")
    for name, value in vars(rules).items():
        regex = value.regex if isinstance(value, rules.Gated) else value
        if isinstance(regex, re.Pattern) and lazy_start.match(regex.pattern):
            raise AssertionError(f"{name} opens with a lazy dot; anchor it with '^'")


def test_a_long_japanese_sentence_is_read_in_one_pass() -> None:
    text = "あ" * 11_000 + "好き"  # took 3 s when the pattern was searched unanchored
    assert detect_memories(text) == ()
