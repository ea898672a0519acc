"""The detector's trigger gate (``_detect_rules.DRAFT_TRIGGERS``): a turn holding none of
the triggers skips the rules, so the gate must never change what the rules find."""

from __future__ import annotations

import inspect
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm import _detect_rules as rules
from tiermem.longterm import detect
from tiermem.longterm.detect import RuleMemoryDetector
from tiermem.policies.turn_text import TurnText

from .test_detect import CORPUS, NOTHING

DETECTOR = RuleMemoryDetector()

WORDS = [
    # words of the rules (English and Japanese), and words of neither
    "I", "i'd", "I'm", "my", "name", "is", "favorite", "fave", "preferred", "prefer", "like",
    "love", "adore", "enjoy", "don't", "never", "hate", "can't", "stand", "fan", "of", "into",
    "tired", "remember", "keep", "in", "mind", "forget", "call", "me", "Ken", "meant", "that's",
    "not", "what", "said", "no", "nope", "sorry", "wait", "actually", "it's", "instead", "but",
    "and", "horror", "seinen", "Berserk", "vol", "42", ",", ".", "?", "!", "please", "hello",
    "ok", "thanks", "好きな", "ジャンルは", "ホラー", "が", "好き", "嫌い", "苦手", "です", "。",
    "名前は", "と", "呼んで", "覚えておいて", "じゃなくて", "いいえ、", "のほうが", "漫画",
    "ください", "Do", "you", "have", "stock",
]  # fmt: skip


def _ungated(text: str) -> tuple[detect.DetectedMemory, ...]:
    """What the rules find in ``text`` without the gate (after the "!remember" command,
    which the gate does not cover)."""
    return DETECTOR._sentences(TurnText.of(text).said)


def test_the_gate_changes_nothing_on_the_rule_tables() -> None:
    for text in CORPUS + NOTHING:
        if not rules.COMMAND.match(text):  # answered before the gate
            assert DETECTOR.detect(text) == _ungated(text), text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))
def test_the_gate_changes_nothing_on_sentences_of_rule_words(words: list[str]) -> None:
    text = " ".join(words)
    if rules.COMMAND.match(text):
        return  # answered before the gate
    assert DETECTOR.detect(text) == _ungated(text)


def test_every_drafting_pattern_the_detector_reads_is_behind_a_trigger() -> None:
    """A gated pattern the engine uses must be one of DRAFTING_GATES (or a splitter that
    drafts nothing), so a new rule cannot be skipped by the gate unnoticed."""
    used = set(re.findall(r"\brules\.([A-Z_]+)\b", inspect.getsource(detect)))
    gated = {name for name in used if isinstance(getattr(rules, name), rules.Gated)}
    splitters = {"EN_CLAUSE"}  # cuts sentences into clauses; drafts nothing itself
    drafting = {name for name in dir(rules) if getattr(rules, name) in rules.DRAFTING_GATES}
    assert gated - splitters <= drafting
    for gate in rules.DRAFTING_GATES:
        for required in gate.requires:
            assert rules.DRAFT_TRIGGERS.search(required), required


def test_a_turn_without_triggers_drafts_nothing_and_one_with_them_still_does() -> None:
    assert DETECTOR.detect("Do you have Berserk vol 42 in stock?") == ()
    assert [d.key for d in DETECTOR.detect("ok. my name is Ken")] == ["name"]
