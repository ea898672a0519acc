"""Review of 50dc199 (turn analysis gates): cases where the extractor's gates must select
exactly the rules that their own ``find`` would run (the rule's own ``find`` is the
reference: it tests its gate alone)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_s9_analysis_equivalence import ref_score
from tiermem.extraction.entities import EntityRule, PhraseRule, RuleEntityExtractor
from tiermem.models import TextBlock
from tiermem.policies.importance import RuleImportanceScorer
from tiermem.policies.phrases import TextView
from tiermem.policies.turn_text import TurnText


def _as_written(match: re.Match[str]) -> str:
    return match.group(0)


def _reference(extractor: RuleEntityExtractor, text: str) -> list[tuple[int, int, str, str]]:
    view = TurnText.of(text).view
    found = [
        (start, end, rule.kind, value)
        for rule in extractor._rules
        for start, end, value in rule.find(view)
    ]
    return sorted(found, key=lambda item: item[0])


def test_a_case_kept_gate_is_tested_when_only_the_folded_text_is_ascii() -> None:
    # "İ" folds to "i" (one character kept), so the folded text is ASCII while the text the
    # rule reads (case kept) is not: the rule's non-ASCII gate string must still be tested.
    rule = EntityRule("city", "İstanbul", _as_written, folded=False, requires=("İ",))
    extractor = RuleEntityExtractor(rules=[rule])
    for text in ["İstanbul", "to İstanbul and back", "istanbul", "ISTANBUL"]:
        view = TurnText.of(text).view
        assert view.folded.isascii()
        assert extractor.find(text) == _reference(extractor, text), text
    assert [(e.kind, e.value) for e in extractor.extract("İstanbul")] == [("city", "İstanbul")]


class _Tagged(PhraseRule):
    """A word list whose ``find`` also reports a hashtag: not the index's own lookup."""

    __slots__ = ()

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        found = super().find(view)
        at = view.folded.find("#go")
        return found if at < 0 else [*found, (at, at + 3, "go")]


class _DuckRule:
    """A rule of neither built-in class: the extractor calls its ``find``, as before."""

    kind = "duck"

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        at = view.folded.find("quack")
        return [] if at < 0 else [(at, at + 5, "quack")]


def test_rules_that_are_not_plain_word_lists_run_ungated() -> None:
    extractor = RuleEntityExtractor(
        rules=[_Tagged("tag", {"golang": "go"}), _DuckRule()]  # type: ignore[list-item]
    )
    for text in ["#go now", "golang", "quack", "nothing"]:
        assert extractor.find(text) == _reference(extractor, text), text


# -- randomised: the extractor and the scorer against their references ----------------------

_PIECES = (
    "İstanbul", "İ", "ISTANBUL", "\u212a", "ſ", "ß", "ﬁ", "ＯＫ", "ｏｋ", "Ok", "I’m", "Iʼd",
    "I‘d", "I'd rather", "i prefer", "I\nprefer", "I\tprefer", "I\u00a0prefer", "good\nnight",
    "good  night", "thanks", "ありがとう", "好き", "#go", "#tag", "golang", "quack", "2nd season",
    "２ｎｄ season", "c++", "vol 42", "４２巻", "Berserk", "dark\nfantasy", "seinen", "é",
    "e\u0301", "x", "42", "-", "\n", " ", "", "　",
)  # fmt: skip
_texts_st = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)


def _rules() -> list[object]:
    return [
        EntityRule("city", "İstanbul", _as_written, folded=False, requires=("İ",)),
        EntityRule("kelvin", "[0-9]+k", _as_written, requires=("k",)),
        PhraseRule("season", {"2nd season": "2", "c++": "cpp", "good night": "gn"}),
        PhraseRule("tag", {"#tag": "tag", "ok": "ok"}),
        _Tagged("go", {"golang": "go"}),
        _DuckRule(),
        *RuleEntityExtractor()._rules,
    ]


@settings(max_examples=300, deadline=None)
@given(text=_texts_st)
def test_random_texts_find_what_each_rule_finds(text: str) -> None:
    extractor = RuleEntityExtractor(rules=_rules())  # type: ignore[arg-type]
    assert extractor.find(text) == _reference(extractor, text)


@settings(max_examples=300, deadline=None)
@given(text=_texts_st, role=st.sampled_from(["user", "assistant"]))
def test_random_texts_score_as_the_previous_scorer(text: str, role: str) -> None:
    scorer = RuleImportanceScorer()
    blocks = (TextBlock(type="text", text=text),)
    entities = RuleEntityExtractor().extract(text)
    expected = ref_score(scorer, role, blocks, entities, TurnText.of(text))
    assert scorer.score(role, blocks, entities=entities, text=TurnText.of(text)) == expected
