"""Decisions and unresolved intentions in common phrasings (session 14, review probe p22).

Before: "we decided to go with …" and "put it in my cart" were no decision; "let me check
with my wife first" and "notify me when it's restocked" no unresolved intention; and a
request for something later asked as a question ("can you let me know when vol 43 is back
in stock?", "could you remind me later?") was dropped for ending in "?". Ordinary
questions still state nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm import _detect_rules as rules
from tiermem.models import TextBlock, Turn
from tiermem.policies.phrases import TextView
from tiermem.summaries.structured import RuleStructuredExtractor

EXTRACTOR = RuleStructuredExtractor()
T0 = datetime(2030, 1, 1, tzinfo=UTC)

DECISIONS = [
    "We decided to go with the hardcover edition.",
    "We've decided on the box set.",
    "Put it in my cart.",
    "Please add vol 3 to my order.",
    "We'll take both volumes.",
    "We're going with the French edition.",
    "OK, I'll take volume 3.",  # as before
]
UNRESOLVED = [
    "Let me check with my wife first.",
    "Let me think it over.",
    "I need to ask my husband before I order.",
    "Notify me when it's restocked.",
    "Email me if the price drops.",
    "Let me know when volume 43 is back in stock.",
    "Keep me posted when it ships.",
    "Can you let me know when vol 43 is back in stock?",
    "Could you remind me later?",
    "Can you remind me about the preorder next week?",
    "Remind me later?",
    "Could you please notify me as soon as it's restocked?",
    "Can you check the reprint date later?",
    "Could you hold one for me?",
    "I'll think about it and come back.",  # as before
]
NEITHER = [
    "Is vol 43 in stock?",
    "Can you tell me the price?",
    "Can you check if vol 43 is in stock?",
    "Can you tell me if vol 43 is in stock?",
    "Can you tell me when the store opens?",
    "Can you remind me what the price was?",
    "Remind me what the price was.",
    "Let me know if you have vol 43.",
    "Let me check the price.",
    "Is the order still pending?",
    "Have you decided on a restock date?",
    "Don't put it in my cart.",
    "How do I add it to my cart?",
    "Did you put it in my cart?",
    "My friend decided to go with the hardcover.",
]


def reading(text: str) -> tuple[bool, bool]:
    (read,) = EXTRACTOR.read(text, role="user")
    return read.decision, read.unresolved


@pytest.mark.parametrize("text", DECISIONS)
def test_a_decision_is_read(text: str) -> None:
    assert reading(text) == (True, False)


@pytest.mark.parametrize("text", UNRESOLVED)
def test_an_unresolved_intention_is_read(text: str) -> None:
    assert reading(text) == (False, True)


@pytest.mark.parametrize("text", NEITHER)
def test_an_ordinary_question_or_a_refusal_states_neither(text: str) -> None:
    assert reading(text) == (False, False)


def test_an_assistant_question_is_no_intention_of_the_user() -> None:
    (read,) = EXTRACTOR.read("Can you let me know when you have paid?", role="assistant")
    assert not read.unresolved


ITEM_RULES = [rules.EN_DECISION, rules.EN_UNRESOLVED, rules.EN_REQUESTED_UNRESOLVED]


def assert_gate_changes_nothing(text: str) -> None:
    folded = TextView(text).folded
    for rule in ITEM_RULES:
        got, want = rule.search(folded), rule.regex.search(folded)
        assert (got and got.span()) == (want and want.span()), (rule.regex.pattern, text)


@pytest.mark.parametrize("text", DECISIONS + UNRESOLVED + NEITHER)
def test_the_gates_change_nothing_on_the_cases(text: str) -> None:
    assert_gate_changes_nothing(text)


WORDS = [
    "we",
    "i",
    "you",
    "can",
    "could",
    "please",
    "let",
    "me",
    "know",
    "when",
    "once",
    "if",
    "as",
    "soon",
    "notify",
    "email",
    "remind",
    "check",
    "with",
    "my",
    "wife",
    "ask",
    "husband",
    "think",
    "it",
    "over",
    "put",
    "add",
    "to",
    "in",
    "cart",
    "order",
    "basket",
    "decided",
    "go",
    "hardcover",
    "don't",
    "not",
    "later",
    "posted",
    "keep",
    "hold",
    "one",
    "for",
    "what",
    "is",
    "vol",
    "43",
    "'ll",
    "'ve",
    "have",
    "need",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=10))
def test_the_gates_change_nothing_on_sentences_of_rule_words(words: list[str]) -> None:
    assert_gate_changes_nothing(" ".join(words))


async def test_the_review_probe_keeps_every_decision_and_intention() -> None:
    said = [
        "I'll decide after payday.",
        "Let me check with my wife first.",
        "Can you let me know when vol 43 is back in stock?",
        "Notify me when it's restocked.",
        "Could you remind me later?",
        "We decided to go with the hardcover edition.",
        "Put it in my cart.",
        "Is vol 43 in stock?",
    ]
    turns = [
        Turn(index=i, role="user", content=(TextBlock(text=t),), timestamp=T0, token_count=1)
        for i, t in enumerate(said)
    ]
    memory = await EXTRACTOR.extract(turns)
    assert [d.text for d in memory.decisions] == said[5:7]
    assert [u.text for u in memory.unresolved] == said[:5]
