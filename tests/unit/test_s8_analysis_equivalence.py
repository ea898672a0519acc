"""Turn analysis gives exactly what its previous implementation gave (kept here as the
reference): the Latin words and keys of a text view, phrase search and find, entity
extraction, word units, number counts and the importance score, on random text mixing
ASCII, cue phrases, entity shapes, CJK, full-width forms, other scripts, digits with
separators, code, URLs, whitespace, and texts past the density and rule windows."""

from __future__ import annotations

import random
import re
from bisect import bisect_right

import pytest

from tiermem.extraction.entities import EntityRule, RuleEntityExtractor
from tiermem.extraction.turn_analysis import analyse_turn
from tiermem.models import TextBlock, ToolResultBlock
from tiermem.models.turns import Entity
from tiermem.policies import importance as importance_module
from tiermem.policies.importance import ImportanceScore, RuleImportanceScorer
from tiermem.policies.phrases import (
    LATIN_WORD_CHARS,
    PhraseIndex,
    TextView,
    _leftmost_longest,
    latin_words,
)
from tiermem.policies.turn_text import TurnText
from tiermem.tokens import TiktokenCounter

# -- the reference: the implementation before the change ------------------------------------

_REF_LATIN_RUN = re.compile(f"[{LATIN_WORD_CHARS}]+")
_CJK_CHARS = importance_module._CJK_CHARS
_REF_CJK_CHAR = re.compile(f"[{_CJK_CHARS}]")
_REF_SPACED_WORD = re.compile(f"[^\\W_{_CJK_CHARS}]+")
_REF_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")


def ref_keys(view: TextView) -> frozenset[str]:
    return frozenset(_REF_LATIN_RUN.findall(view.folded)).union(view.folded)


def ref_candidates(index: PhraseIndex, view: TextView) -> list[re.Pattern[str]]:
    firsts = ref_keys(view) & index._firsts
    return [index._pattern(first) for first in firsts] if firsts else []


def ref_search(index: PhraseIndex, view: TextView) -> bool:
    folded = view.folded
    return any(pattern.search(folded) for pattern in ref_candidates(index, view))


def ref_find(index: PhraseIndex, view: TextView) -> list[tuple[int, int, str]]:
    text = view.folded
    patterns = ref_candidates(index, view)
    if not patterns:
        return []
    if len(patterns) == 1:
        spans = [m.span() for m in patterns[0].finditer(text)]
    else:
        spans = list(_leftmost_longest(patterns, text))
    return [(start, end, " ".join(text[start:end].split())) for start, end in spans]


def ref_word_units(text: str) -> int:
    cjk = 0 if text.isascii() else len(_REF_CJK_CHAR.findall(text))
    return len(_REF_SPACED_WORD.findall(text)) + (cjk + 1) // 2


def ref_extract_find(
    extractor: RuleEntityExtractor, text: TurnText
) -> list[tuple[int, int, str, str]]:
    view = text.view
    found: list[tuple[int, int, int, str, str]] = []
    titles = ref_find(extractor._titles._index, view) if extractor._titles else []
    values = extractor._titles._values if extractor._titles else {}
    titles = [(start, end, values[key]) for start, end, key in titles]
    found += [(start, 0, end, "series", value) for start, end, value in titles]
    starts = [start for start, _, _ in titles]
    for rule in extractor._rules:
        if isinstance(rule, EntityRule):
            matches = rule.find(view)  # unchanged: the gate and the scan
        else:
            matches = [
                (start, end, rule._values[key]) for start, end, key in ref_find(rule._index, view)
            ]
        for start, end, value in matches:
            i = bisect_right(starts, start) - 1 if starts else -1
            if i < 0 or titles[i][1] < end:
                found.append((start, len(found), end, rule.kind, value))
    found.sort()
    return [(start, end, kind, value) for start, _, end, kind, value in found]


def ref_entities(extractor: RuleEntityExtractor, text: TurnText) -> tuple[Entity, ...]:
    pairs = dict.fromkeys((kind, value) for _, _, kind, value in ref_extract_find(extractor, text))
    return tuple(Entity(kind=kind, value=value) for kind, value in pairs)


def ref_social(scorer: RuleImportanceScorer, said: TextView) -> bool:
    if len(said.folded) > scorer.rules.social_max_chars:
        return False
    cues = ref_find(scorer._social, said)
    if not cues:
        return False
    folded = said.folded
    parts = []
    last = 0
    for start, end, _ in cues:
        parts.append(folded[last:start])
        last = end
    parts.append(folded[last:])
    rest = " ".join(parts)
    return (
        not _REF_NUMBER.search(rest) and ref_word_units(rest) <= scorer.rules.social_max_extra_words
    )


def ref_score(
    scorer: RuleImportanceScorer,
    role: str,
    content: tuple[TextBlock | ToolResultBlock, ...],
    entities: tuple[Entity, ...],
    read: TurnText,
) -> tuple[float, str]:
    rules = scorer.rules
    said = read.said
    if role == "user":
        if ref_search(scorer._preference, said):
            return rules.preference, "preference"
        if ref_search(scorer._correction, said):
            return rules.correction, "correction"
    elif ref_search(scorer._recommendation, said):
        return rules.recommendation, "recommendation"
    if any(isinstance(b, ToolResultBlock) for b in content):
        return rules.tool_result, "tool_result"
    if not entities and ref_social(scorer, said):
        if ref_search(scorer._acknowledgement, said):
            return rules.acknowledgement, "acknowledgement"
        return rules.greeting, "greeting"
    window = read.view.folded[: scorer.DENSITY_WINDOW_CHARS]
    d = (
        0.5 * min(len(set(entities)), 4) / 4
        + 0.2 * min(len(_REF_NUMBER.findall(window)), 3) / 3
        + 0.3 * min(ref_word_units(window), 60) / 60
    )
    score = rules.density_floor + (rules.density_ceiling - rules.density_floor) * d
    return min(max(score, rules.density_floor), rules.density_ceiling), "density"


# -- random text ----------------------------------------------------------------------------

_FRAGMENTS = [
    "I prefer", "I'd rather", "I’m into", "no, I meant", "actually", "you might like",
    "how about", "thanks", "ok", "OK", "hi", "Hello!", "see you", "good  night", "wrong",
    "好き", "青年が好き", "違います", "おすすめ", "ありがとう", "またね", "了解です",
    "Berserk", "ベルセルク", "Final Fantasy", "dark fantasy", "Japanese", "日本語", "seinen",
    "shōnen", "isekai", "ORD-12345", "ord-1234567", "B0ABCDEF12", "ISBN 978-4-08-851234-1",
    "9784088512341", "4-08-851234-X", "alice@Example.COM", "a@b", "$50,000", "¥1,200",
    "€9.99", "£5", "1200円", "500 yen", "20 dollars", "2024-01-15", "2024-02-30",
    "2024年1月15日", "vol 42", "vol. 007", "volume 3", "42巻", "第3巻", "４２巻", "ＯＫ",
    "１，２００", "1.2.3", "1..2", "3,14", "42", "0", "x1y2", "a_b", "snake_case_name",
    "def f(x):\n    return x * 2", "https://example.com/a-b?id=42&q=vol-3", "C++", "e-mail",
    "İstanbul", "straße", "ÉLAN", "café", "Ωmega", "Привет мир", "שלום", "مرحبا", "²³",
    "①②", "ｶﾀｶﾅ", "한국어", "中国語", "👍", "🙂 ok", "\u3000", "\t", "\n\n", "  ", "-", "--",
    ".", ",", "!", "?", "'", "’", "_", "#tag", "@here", "e\u0301", "ﬁ", "Ⅻ", "\u00a0",
]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice(["", " ", "\n", "\u3000", "ok", "42"])
    parts = []
    for _ in range(rng.randrange(1, 30)):
        if rng.random() < 0.6:
            parts.append(rng.choice(_FRAGMENTS))
        else:
            length = rng.randrange(1, 12)
            alphabet = rng.choice(
                [
                    "abcdefghijklmnopqrstuvwxyz",
                    "ABCXYZ0123456789",
                    "あいうえおカキク漫画巻",
                    "éüßøÀ",
                ]
            )
            parts.append("".join(rng.choice(alphabet) for _ in range(length)))
        parts.append(rng.choice([" ", " ", ", ", ". ", "", "\n", "-", "　"]))
    text = "".join(parts)
    if kind > 0.95:  # past the density window (4,000) and often past the rule window
        text = (text + " ") * rng.randrange(
            4_000 // max(len(text), 1) + 1, 30_000 // max(len(text), 1) + 2
        )
    return text


def _texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_random_text(rng) for _ in range(count)]


TITLES = {"Berserk": "Berserk", "ベルセルク": "Berserk", "Final Fantasy": "Final Fantasy"}


@pytest.mark.parametrize("seed", range(4))
def test_views_words_and_keys_are_the_references(seed: int) -> None:
    for text in _texts(300, seed):
        view = TextView(text)
        assert view.words == _REF_LATIN_RUN.findall(view.folded)
        assert latin_words(text) == _REF_LATIN_RUN.findall(text)
        # Keys changed on purpose: an ASCII text's are its words only (an index looks for
        # the punctuation its phrases start with itself); what phrases are found with them
        # is compared below.
        words = set(_REF_LATIN_RUN.findall(view.folded))
        expected = words if view.folded.isascii() else ref_keys(view)
        assert view.keys == expected


@pytest.mark.parametrize("seed", range(4))
def test_word_units_and_numbers_are_the_references(seed: int) -> None:
    for text in _texts(300, seed):
        for piece in (text, TextView(text).folded, text[:4000]):
            assert importance_module._word_units(piece) == ref_word_units(piece)
            assert importance_module._NUMBER.findall(piece) == _REF_NUMBER.findall(piece)
            assert importance_module._SPACED_WORD.findall(piece) == _REF_SPACED_WORD.findall(piece)


@pytest.mark.parametrize("seed", range(4))
def test_phrase_search_and_find_are_the_references(seed: int) -> None:
    scorer = RuleImportanceScorer()
    indexes = [
        scorer._preference,
        scorer._correction,
        scorer._recommendation,
        scorer._acknowledgement,
        scorer._social,
        PhraseIndex(TITLES),
        PhraseIndex(["'80s manga", "#tag", "$5 deal", "-", "ok", "C++", "e-mail", "İstanbul"]),
    ]
    for text in _texts(300, seed):
        view = TextView(text)
        for index in indexes:
            assert index.find(view) == ref_find(index, view)
            assert index.search(view) == ref_search(index, view)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("titles", [None, TITLES])
def test_turn_analysis_is_the_reference(seed: int, titles: dict[str, str] | None) -> None:
    tokens = TiktokenCounter()
    extractor = RuleEntityExtractor(titles)
    scorer = RuleImportanceScorer()
    rng = random.Random(seed)
    for text in _texts(250, seed):
        role = rng.choice(["user", "assistant"])
        blocks: tuple[TextBlock | ToolResultBlock, ...]
        if rng.random() < 0.1:
            blocks = (
                TextBlock(type="text", text=text or "x"),
                ToolResultBlock(
                    type="tool_result",
                    tool_use_id="t1",
                    content=(TextBlock(type="text", text=rng.choice(_FRAGMENTS)),),
                ),
            )
        else:
            blocks = (TextBlock(type="text", text=text),)
        analysis = analyse_turn(role, blocks, tokens=tokens, entities=extractor, importance=scorer)
        read = TurnText.of_blocks(blocks)
        if len(blocks) == 1:
            assert analysis.token_count == tokens.count(text)
        assert extractor.find(read) == ref_extract_find(extractor, read)
        expected_entities = ref_entities(extractor, read)
        assert analysis.entities == expected_entities
        assert analysis.importance == ImportanceScore(
            *ref_score(scorer, role, blocks, expected_entities, read)
        )
