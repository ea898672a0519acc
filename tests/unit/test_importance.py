"""Importance scoring: seed 000's table, cue boundaries, precedence, and the phrase matcher."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import Entity, TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.policies import (
    DEFAULT_IMPORTANCE_RULES,
    ImportanceRules,
    ImportanceScore,
    PhraseIndex,
    RuleImportanceScorer,
    TextView,
    score_importance,
)
from tiermem.policies.turn_text import TurnText

REASONS = {
    "preference", "correction", "recommendation", "tool_result",
    "acknowledgement", "greeting", "density",
}  # fmt: skip


def text(value: str) -> tuple[TextBlock, ...]:
    return (TextBlock(text=value),)


def result(value: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=value),))


@pytest.mark.parametrize(
    ("role", "said", "reason", "score"),
    [
        # preference 0.9
        ("user", "I like seinen", "preference", 0.9),
        ("user", "i PREFER the English edition", "preference", 0.9),
        ("user", "I don’t like horror", "preference", 0.9),  # curly apostrophe
        ("user", "My favourite is Berserk.", "preference", 0.9),
        ("user", "Call me Ken", "preference", 0.9),
        ("user", "青年漫画が好きです", "preference", 0.9),
        ("user", "好きなジャンルはダークファンタジー", "preference", 0.9),
        ("user", "ホラーは苦手です", "preference", 0.9),
        ("user", "ok, I prefer seinen", "preference", 0.9),  # not an acknowledgement
        # correction 0.85
        ("user", "No, I meant volume 3", "correction", 0.85),
        ("user", "That's not what I asked for", "correction", 0.85),
        ("user", "Actually, make it the paperback", "correction", 0.85),
        ("user", "いいえ、3巻です", "correction", 0.85),
        ("user", "違います。ベルセルクです", "correction", 0.85),
        ("user", "41巻じゃなくて42巻", "correction", 0.85),
        # recommendation 0.6 (assistant only)
        ("assistant", "I recommend Vinland Saga.", "recommendation", 0.6),
        ("assistant", "You might like Vagabond.", "recommendation", 0.6),
        ("assistant", "おすすめはヴィンランド・サガです", "recommendation", 0.6),
        # acknowledgement 0.2
        ("user", "ok", "acknowledgement", 0.2),
        ("user", "OK!", "acknowledgement", 0.2),
        ("user", "ＯＫ", "acknowledgement", 0.2),  # full width
        ("user", "Thanks so much!", "acknowledgement", 0.2),
        ("user", "got it, thank you", "acknowledgement", 0.2),
        ("user", "thanks, bye", "acknowledgement", 0.2),  # acknowledgement before greeting
        ("user", "ありがとうございます", "acknowledgement", 0.2),
        ("user", "了解です", "acknowledgement", 0.2),
        ("user", "OKです", "acknowledgement", 0.2),  # a CJK neighbour is no word boundary
        ("user", "わかりました、ありがとう！", "acknowledgement", 0.2),
        # greeting / farewell 0.1
        ("user", "hi", "greeting", 0.1),
        ("user", "Hello there!", "greeting", 0.1),
        ("user", "Good morning", "greeting", 0.1),
        ("user", "bye!", "greeting", 0.1),
        ("user", "こんにちは", "greeting", 0.1),
        ("user", "またね", "greeting", 0.1),
        ("assistant", "Hello! How can I help you today?", "greeting", 0.1),
        ("assistant", "いらっしゃいませ！", "greeting", 0.1),
    ],
)
def test_seed_table(role: str, said: str, reason: str, score: float) -> None:
    assert score_importance(role, text(said)) == ImportanceScore(score, reason)


@pytest.mark.parametrize(
    "said",
    [
        "book it",  # "ok" inside "book"
        "this is it",  # "hi" inside "this"
        "I'm hiking",  # "hi" inside "hiking"
        "thanksgiving plans",  # "thanks" inside "thanksgiving"
        "I likewise agree",  # "I like" inside "I likewise"
        "they recall me sometimes",  # "call me" inside "recall me"
        "sushi place",  # "hi" at the end of "sushi"
    ],
)
def test_cues_inside_words_do_not_count(said: str) -> None:
    assert score_importance("user", text(said)).reason == "density"


@pytest.mark.parametrize(
    "said",
    [
        "ok, show me vol 3",
        "ok, 3 please",  # few words, but a digit remains
        "了解、2冊",
        "ok, can you check the price of the new edition",  # too many other words
        "thanks! " + "and one more question about shipping " * 4,  # too long
        "わかりました。では、それを二冊ください",  # too many other words
    ],
)
def test_an_acknowledgement_with_a_request_is_not_an_acknowledgement(said: str) -> None:
    assert score_importance("user", text(said)).reason == "density"


def test_entities_make_a_short_reply_informative() -> None:
    berserk = (Entity(kind="series", value="Berserk"),)
    assert score_importance("user", text("ok Berserk")).reason == "acknowledgement"
    assert score_importance("user", text("ok Berserk"), entities=berserk).reason == "density"


@pytest.mark.parametrize(
    ("role", "said", "reason"),
    [
        ("assistant", "I like this one too", "density"),  # preferences are the user's
        ("assistant", "Actually, it is out of stock", "density"),  # corrections too
        ("user", "I recommend it to friends", "density"),  # recommendations the agent's
        ("user", "No, I meant I prefer seinen", "preference"),  # preference > correction
    ],
)
def test_cues_apply_to_their_role_and_precedence(role: str, said: str, reason: str) -> None:
    assert score_importance(role, text(said)).reason == reason


def test_tool_results() -> None:
    assert score_importance("user", (result("3 results: Berserk 1-42"),)).reason == "tool_result"
    # A review quoted by a tool is not the user's preference.
    quoted = (result("Review: I love this series"),)
    assert score_importance("user", quoted) == ImportanceScore(0.4, "tool_result")
    # The user's own words next to a tool result still count, and come first.
    mixed = (result("ok"), TextBlock(text="I prefer the hardcover"))
    assert score_importance("user", mixed).reason == "preference"
    # A tool result that only says "ok" is a tool result, not an acknowledgement.
    assert score_importance("user", (result("ok"),)).reason == "tool_result"


def test_density_grows_with_information_and_stays_in_bounds() -> None:
    bare = score_importance("user", text("show me something")).score
    numbers = score_importance("user", text("show me 3 of 42 for 1200")).score
    series = Entity(kind="series", value="Berserk")
    volume = Entity(kind="volume", value="42")
    with_entities = score_importance(
        "user", text("show me 3 of 42 for 1200"), entities=(series, volume)
    ).score
    assert 0.25 <= bare < numbers < with_entities <= 0.75
    huge = text("word 42 " * 5000)
    many = tuple(Entity(kind="k", value=str(i)) for i in range(10))
    assert score_importance("user", huge, entities=many) == ImportanceScore(0.75, "density")
    assert score_importance("user", ()) == ImportanceScore(0.25, "density")


def test_assistant_tool_call_is_scored_by_density() -> None:
    call = (ToolUseBlock(tool_use_id="t1", name="search", input={"q": "Berserk 42"}),)
    assert score_importance("assistant", call).reason == "density"


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValidationError, match="role must be 'user' or 'assistant'"):
        score_importance("system", text("hi"))


def test_rules_are_data() -> None:
    rules = dataclasses.replace(
        DEFAULT_IMPORTANCE_RULES, preference_cues=("I adore",), preference=0.95
    )
    scorer = RuleImportanceScorer(rules)
    assert scorer.score("user", text("I adore josei")) == ImportanceScore(0.95, "preference")
    assert scorer.score("user", text("I like josei")).reason == "density"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"preference": 1.5}, r"preference=1.5 is not in \[0, 1\]"),
        ({"density_floor": 0.8}, "density_floor is above density_ceiling"),
        ({"social_max_extra_words": -1}, "must be >= 0"),
        ({"greeting_cues": ()}, "greeting_cues must be a non-empty tuple"),
        ({"greeting_cues": "hi"}, "greeting_cues must be a non-empty tuple"),
    ],
)
def test_bad_rules_are_rejected(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ImportanceRules(**change)  # type: ignore[arg-type]


def test_an_empty_cue_is_rejected() -> None:
    with pytest.raises(ValidationError, match="empty"):
        RuleImportanceScorer(
            dataclasses.replace(DEFAULT_IMPORTANCE_RULES, acknowledgement_cues=("  ",))
        )


@pytest.mark.parametrize("bad", [-0.1, 1.01])
def test_a_score_outside_the_unit_interval_is_rejected(bad: float) -> None:
    with pytest.raises(ValidationError):
        ImportanceScore(bad, "density")


blocks = st.lists(
    st.one_of(
        st.builds(TextBlock, text=st.text(max_size=200)),
        st.builds(
            ToolResultBlock,
            tool_use_id=st.just("t"),
            content=st.tuples(st.builds(TextBlock, text=st.text(max_size=50))),
        ),
    ),
    max_size=4,
).map(tuple)


@given(st.sampled_from(["user", "assistant"]), blocks, st.integers(0, 8))
def test_any_turn_scores_in_the_unit_interval(
    role: str, content: tuple[TextBlock | ToolResultBlock, ...], n: int
) -> None:
    entities = tuple(Entity(kind="k", value=str(i)) for i in range(n))
    scored = score_importance(role, content, entities=entities)
    assert 0.0 <= scored.score <= 1.0
    assert scored.reason in REASONS


# ---------------------------------------------------------------- the phrase matcher

LATIN = re.compile("[0-9a-z]")


def reference_find(phrases: list[str], text: str) -> list[tuple[int, int]]:
    """Slow and obvious: every occurrence of every phrase, then leftmost-longest greedy."""
    found = []
    for phrase in {" ".join(p.split()) for p in phrases}:
        body = r"\s+".join(re.escape(w) for w in phrase.split())
        left = "(?<![0-9a-z])" if LATIN.match(phrase[0]) else ""
        right = "(?![0-9a-z])" if LATIN.match(phrase[-1]) else ""
        pattern = re.compile(left + body + right)
        found += [(i, m.end()) for i in range(len(text)) if (m := pattern.match(text, i))]
    found.sort(key=lambda span: (span[0], -span[1]))
    chosen: list[tuple[int, int]] = []
    for start, end in found:
        if not chosen or start >= chosen[-1][1]:
            chosen.append((start, end))
    return chosen


ALPHABET = ["a", "b", " ", "あ", "い", "."]
phrase = st.text(st.sampled_from(["a", "b", " ", "あ", "い"]), min_size=1, max_size=5).filter(
    str.strip
)
# Phrases that cannot occur in the texts, to push the index past its small-list size.
FILLERS = [f"zz{i}" for i in range(300)]


@settings(max_examples=300)
@given(st.lists(phrase, min_size=1, max_size=6), st.text(st.sampled_from(ALPHABET), max_size=30))
def test_phrase_index_is_leftmost_longest_whole_phrase(phrases: list[str], value: str) -> None:
    expected = reference_find(phrases, value)
    view = TextView(value)
    for index in (PhraseIndex(phrases), PhraseIndex(phrases + FILLERS)):
        assert [(s, e) for s, e, _ in index.find(view)] == expected
        assert index.search(view) == bool(expected)


def test_phrase_index_reports_the_phrase_and_prefers_the_longest() -> None:
    index = PhraseIndex(["dark fantasy", "Fantasy", "かあ", "ああ", "あい"])
    found = index.find(TextView("DARK\n fantasy and fantasyland; かああい"))
    assert [key for _, _, key in found] == ["dark fantasy", "かあ", "あい"]


@pytest.mark.parametrize("bad", [[], [" "], ["x" * 201]])
def test_phrase_index_rejects_bad_lists(bad: list[str]) -> None:
    with pytest.raises(ValidationError):
        PhraseIndex(bad)


def test_text_view_normalises_width_apostrophes_and_case() -> None:
    view = TextView("ＯＫ？ I’M ｶﾀｶﾅ\u3000İ")
    assert view.normal == "OK? I'M カタカナ İ"
    assert view.folded == "ok? i'm カタカナ i"
    assert len(view.folded) == len(view.normal)


PASTE = "the weather was nice and we walked to the shop. " * 4_000  # ~200 KB


def test_a_cue_in_the_middle_of_a_long_paste_is_not_the_speakers() -> None:
    middle = len(PASTE) // 2
    buried = PASTE[:middle] + " I prefer seinen. " + PASTE[middle:]
    assert score_importance("user", text(buried)).reason == "density"
    assert score_importance("user", text(PASTE + " I prefer seinen.")).reason == "preference"
    assert score_importance("user", text("I prefer seinen. " + PASTE)).reason == "preference"


@given(st.sampled_from(["user", "assistant"]), st.text(max_size=200), st.text(max_size=50))
def test_a_turn_text_given_scores_as_the_blocks_do(role: str, said: str, quoted: str) -> None:
    blocks = (TextBlock(text=said), result(quoted))
    given_text = score_importance(role, blocks, text=TurnText.of_blocks(blocks))
    assert given_text == score_importance(role, blocks)
