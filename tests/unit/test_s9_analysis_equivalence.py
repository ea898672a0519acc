"""Turn analysis after this round's cuts gives what the plain definitions give: the turn
text's forms (NFKC, rule window, straight apostrophes, folding) against
``unicodedata.normalize``; entity finds against running every rule with its own gate (the
extractor now also skips word lists none of whose first words is in the text); importance
against a copy of the previous scorer (which looked each cue list up in turn, where the
scorer now skips them all when no key of the text starts a cue); the short ``add_turn``
path's analysis against the general one. Texts: the bench's messages, generated
conversations and random text mixing ASCII, cues, entity shapes, CJK, full-width forms,
curly apostrophes, other scripts, code and texts past the rule windows."""

from __future__ import annotations

import random
import unicodedata
from bisect import bisect_right

import pytest

from tiermem.clock import FakeClock
from tiermem.extraction.entities import PhraseRule, RuleEntityExtractor
from tiermem.extraction.turn_analysis import analyse_turn
from tiermem.models import TextBlock, ToolResultBlock
from tiermem.models.turns import Entity
from tiermem.policies import importance as importance_module
from tiermem.policies.importance import ImportanceScore, RuleImportanceScorer
from tiermem.policies.phrases import PhraseIndex, straight_apostrophes
from tiermem.policies.turn_text import RULE_HEAD_CHARS, RULE_TAIL_CHARS, TurnText, rule_window
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

# -- references -----------------------------------------------------------------------------


def ref_forms(text: str) -> tuple[str, str, str, bool]:
    """(nfkc, view.normal, view.folded, truncated) by definition."""
    normal = unicodedata.normalize("NFKC", text)
    window = rule_window(normal)
    for mark in ("\u2019", "\u2018", "\u02bc"):
        window = window.replace(mark, "'")
    folded = window.lower()
    if len(folded) != len(window):
        folded = "".join(ch.lower()[0] for ch in window)
    return normal, window, folded, len(normal) > RULE_HEAD_CHARS + RULE_TAIL_CHARS


def ref_find(extractor: RuleEntityExtractor, read: TurnText) -> list[tuple[int, int, str, str]]:
    """Every rule run, each behind its own gate only (no selection by the extractor)."""
    view = read.view
    titles = extractor._titles.find(view) if extractor._titles else []
    found: list[tuple[int, int, int, str, str]] = [
        (start, 0, end, "series", value) for start, end, value in titles
    ]
    starts = [start for start, _, _ in titles]
    for rule in extractor._rules:
        for start, end, value in rule.find(view):
            i = bisect_right(starts, start) - 1 if starts else -1
            if i < 0 or titles[i][1] < end:
                found.append((start, len(found), end, rule.kind, value))
    found.sort()
    return [(start, end, kind, value) for start, _, end, kind, value in found]


def ref_entities(extractor: RuleEntityExtractor, read: TurnText) -> tuple[Entity, ...]:
    pairs = dict.fromkeys((kind, value) for _, _, kind, value in ref_find(extractor, read))
    return tuple(Entity(kind=kind, value=value) for kind, value in pairs)


def ref_score(
    scorer: RuleImportanceScorer,
    role: str,
    content: tuple[TextBlock | ToolResultBlock, ...],
    entities: tuple[Entity, ...],
    read: TurnText,
) -> ImportanceScore:
    """The scorer before this round: each cue list looked up in turn."""
    rules = scorer.rules
    said = read.said
    if role == "user":
        if scorer._preference.search(said):
            return ImportanceScore(rules.preference, "preference")
        if scorer._correction.search(said):
            return ImportanceScore(rules.correction, "correction")
    elif scorer._recommendation.search(said):
        return ImportanceScore(rules.recommendation, "recommendation")
    if any(isinstance(b, ToolResultBlock) for b in content):
        return ImportanceScore(rules.tool_result, "tool_result")
    if not entities and scorer._is_only_social(said):
        if scorer._acknowledgement.search(said):
            return ImportanceScore(rules.acknowledgement, "acknowledgement")
        return ImportanceScore(rules.greeting, "greeting")
    window = read.view.folded[: scorer.DENSITY_WINDOW_CHARS]
    return ImportanceScore(scorer._density(window, entities), "density")


# -- texts ----------------------------------------------------------------------------------

MESSAGES = [
    "Hello!",
    "I prefer seinen, nothing with horror please.",
    "Do you have Berserk vol 42 in stock?",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "Your order ORD-12345 ships tomorrow.",
    "ok thanks",
]  # the bench's (bench/workload.py)

_FRAGMENTS = [
    "I prefer", "I'd rather", "I’m into", "I‘d", "Iʼll", "no, I meant", "actually",
    "you might like", "how about", "check out", "thanks", "ok", "OK", "hi", "Hello!",
    "see you", "good  night", "wrong", "call me", "my favourite", "好き", "青年が好き",
    "違います", "おすすめ", "ありがとう", "またね", "了解です", "Berserk", "ベルセルク",
    "Final Fantasy", "dark fantasy", "Japanese", "日本語", "seinen", "shōnen", "isekai",
    "ORD-12345", "ord-1234567", "B0ABCDEF12", "ISBN 978-4-08-851234-1", "9784088512341",
    "4-08-851234-X", "alice@Example.COM", "a@b", "$50,000", "¥1,200", "€9.99", "£5",
    "1200円", "500 yen", "20 dollars", "2024-01-15", "2024-02-30", "2024年1月15日", "vol 42",
    "vol. 007", "volume 3", "42巻", "第3巻", "４２巻", "ＯＫ", "１，２００", "1.2.3", "3,14",
    "def f(x):\n    return x * 2", "https://example.com/a-b?id=42&q=vol-3", "C++", "e-mail",
    "İstanbul", "straße", "ÉLAN", "café", "Привет мир", "שלום", "①②", "ｶﾀｶﾅ", "한국어",
    "👍", "\u3000", "\t", "\n\n", "  ", "-", ".", "!", "?", "'", "’", "#tag", "e\u0301", "ﬁ",
]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice(["", " ", "\n", "\u3000", "ok", "42", "’"])
    parts = []
    for _ in range(rng.randrange(1, 25)):
        if rng.random() < 0.6:
            parts.append(rng.choice(_FRAGMENTS))
        else:
            alphabet = rng.choice(
                ["abcdefghijklmnopqrstuvwxyz", "ABCXYZ0123456789", "あいう漫画巻"]
            )
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 10))))
        parts.append(rng.choice([" ", " ", ", ", ". ", "", "\n", "-", "　"]))
    text = "".join(parts)
    if kind > 0.96:  # past the density window, often past the rule window
        text = (text + " ") * rng.randrange(
            4_000 // max(len(text), 1) + 1, 20_000 // max(len(text), 1) + 2
        )
    return text


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = [_random_text(rng) for _ in range(count)]
    conversation = generate_conversation(seed, turns=120, facts=12, corrections=4)
    for turn in conversation.turns:
        texts += [b.text for b in turn.content if isinstance(b, TextBlock)]
    return MESSAGES + texts


TITLES = {"Berserk": "Berserk", "ベルセルク": "Berserk", "Final Fantasy": "Final Fantasy"}
SEEDS = range(5)  # about 5,000 texts in all


@pytest.mark.parametrize("seed", SEEDS)
def test_turn_text_forms_are_the_definitions(seed: int) -> None:
    for text in _texts(seed, 800):
        read = TurnText.of(text)
        normal, view_normal, folded, truncated = ref_forms(text)
        assert (read.text, read.said_text, read.nfkc) == (text, text, normal)
        assert (read.view.normal, read.view.folded) == (view_normal, folded)
        assert read.said is read.view
        assert read.truncated == truncated
        assert straight_apostrophes(text) == text.translate(
            str.maketrans(dict.fromkeys("\u2019\u2018\u02bc", "'"))
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_analysis_is_the_reference(seed: int) -> None:
    tokens = TiktokenCounter()
    titles = TITLES if seed % 2 else None
    # A word list with a phrase that starts with punctuation is never skipped: exercised too.
    extractors = [
        RuleEntityExtractor(titles),
        RuleEntityExtractor(
            titles,
            rules=[
                PhraseRule("tag", {"#tag": "tag", "-": "dash", "ok": "ok"}),
                *RuleEntityExtractor()._rules,
            ],
        ),
    ]
    scorer = RuleImportanceScorer()
    rng = random.Random(seed)
    for text in _texts(seed, 800):
        role = rng.choice(["user", "assistant"])
        blocks: tuple[TextBlock | ToolResultBlock, ...] = (TextBlock(type="text", text=text),)
        if rng.random() < 0.1:
            result = ToolResultBlock(
                type="tool_result",
                tool_use_id="t1",
                content=(TextBlock(type="text", text=rng.choice(_FRAGMENTS)),),
            )
            blocks = (TextBlock(type="text", text=text or "x"), result)
        for extractor in extractors:
            read = TurnText.of_blocks(blocks)
            assert extractor.find(read) == ref_find(extractor, read)
            expected = ref_entities(extractor, TurnText.of_blocks(blocks))
            assert extractor.extract(TurnText.of_blocks(blocks)) == expected
            analysis = analyse_turn(
                role, blocks, tokens=tokens, entities=extractor, importance=scorer
            )
            assert analysis.entities == expected
            assert analysis.importance == ref_score(
                scorer, role, blocks, expected, TurnText.of_blocks(blocks)
            )


def test_a_cue_list_starting_with_punctuation_is_always_read() -> None:
    rules = importance_module.ImportanceRules(greeting_cues=("#hello", "hi"))
    scorer = RuleImportanceScorer(rules)
    assert scorer._cue_firsts is None  # the gate is off: every list is looked up
    for text in ["#hello", "well #hello", "nothing here", "hi"]:
        read = TurnText.of(text)
        blocks = (TextBlock(type="text", text=text),)
        assert scorer.score("user", blocks, text=read) == ref_score(
            scorer, "user", blocks, (), TurnText.of(text)
        )
    assert scorer.score("user", (TextBlock(type="text", text="#hello"),)).reason == "greeting"
    assert PhraseIndex(["#hello", "hi"]).punctuation_firsts == ("#",)


@pytest.mark.parametrize("seed", range(2))
def test_the_short_add_turn_path_analyses_as_the_general_one(seed: int) -> None:
    clock = FakeClock()
    service = MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock
    )
    rng = random.Random(seed)
    for text in _texts(seed, 300):
        if len(text) > 4_000 or "\ud800" in text:
            continue
        role = rng.choice(["user", "assistant"])
        _, analysis = service.analyse_text_turn(role, text)
        expected = analyse_turn(
            role,
            (TextBlock(type="text", text=text),),
            tokens=service.tokens,
            entities=service.entities,
            importance=service.importance,
        )
        assert analysis == expected
        assert analysis.text.view.folded == expected.text.view.folded
