"""The plain-text analysis of the built-in engines (``analyse_plain_text``, the path of a
plain ``add_turn`` since session 11) gives what the engines give through their methods,
every field: the turn text and its view, token count, entities (values, order, types) and
importance (score to the last bit, reason). Compared with a copy of the session-start
analysis (``analyse_text_block`` at 34e61b4) on the bench's messages, generated
conversations of both domains and random text built from the rules' own phrase lists,
entity shapes, numbers, dates, CJK, emoji, mixed case, punctuation, empty and long texts;
and end to end, a default service's turns against those of a service whose engines are
subclasses (which take the general path)."""

from __future__ import annotations

import random

import pytest

from tiermem.clock import FakeClock
from tiermem.extraction import entities as entities_module
from tiermem.extraction.entities import PhraseRule, RuleEntityExtractor
from tiermem.extraction.plain_analysis import analyse_plain_text, is_plain_analysis
from tiermem.extraction.turn_analysis import TurnAnalysis
from tiermem.models import TextBlock
from tiermem.models.turns import Entity
from tiermem.policies.importance import (
    DEFAULT_IMPORTANCE_RULES,
    ImportanceRules,
    ImportanceScore,
    RuleImportanceScorer,
)
from tiermem.policies.turn_text import TurnText
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing.conversations import MANGA_TITLES, generate_conversation
from tiermem.tokens import TiktokenCounter

# -- reference: the session-start analysis of one text block -----------------------------


def ref_analysis(
    role: str,
    text: str,
    tokens: TiktokenCounter,
    extractor: RuleEntityExtractor,
    scorer: RuleImportanceScorer,
) -> TurnAnalysis:
    """``analyse_text_block`` as of 34e61b4: each engine through its methods."""
    blocks = (TextBlock(type="text", text=text),)
    read = TurnText.of(text)
    found = extractor.extract(read)
    return TurnAnalysis(
        text=read,
        token_count=tokens.count_blocks(blocks),
        entities=found,
        importance=scorer.score(role, blocks, entities=found, text=read),
        drafts=(),
        terms=None,
    )


def assert_same(got: TurnAnalysis, expected: TurnAnalysis) -> None:
    assert got == expected
    # What equality leaves out: the view's forms, and exact types and float bits.
    assert (got.text.view.normal, got.text.view.folded) == (
        expected.text.view.normal,
        expected.text.view.folded,
    )
    assert got.text.said is got.text.view
    assert type(got.token_count) is int
    assert [type(e) for e in got.entities] == [Entity] * len(expected.entities)
    assert [(e.kind, e.value) for e in got.entities] == [
        (e.kind, e.value) for e in expected.entities
    ]
    assert got.importance is not None
    assert expected.importance is not None
    assert type(got.importance) is ImportanceScore
    assert got.importance.score.hex() == expected.importance.score.hex()
    assert got.importance.reason == expected.importance.reason
    # The view's cached words and keys, once computed, are those of the text.
    view, fresh = got.text.view, TurnText.of(got.text.text).view
    assert view.words == fresh.words
    assert view.keys == fresh.keys


# -- texts -------------------------------------------------------------------------------

MESSAGES = [
    "Hello!",
    "I prefer seinen, nothing with horror please.",
    "Do you have Berserk vol 42 in stock?",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "Your order ORD-12345 ships tomorrow.",
    "ok thanks",
]  # the bench's (bench/workload.py)

_RULES = DEFAULT_IMPORTANCE_RULES
_PHRASES = [
    *_RULES.preference_cues,
    *_RULES.correction_cues,
    *_RULES.recommendation_cues,
    *_RULES.acknowledgement_cues,
    *_RULES.greeting_cues,
    *entities_module._LANGUAGES,
    *entities_module._GENRES,
    *MANGA_TITLES,
]
_SHAPES = [
    "ORD-12345", "ord-1234567", "ORD-123", "B0ABCDEF12", "b0abcdef12", "ISBN 978-4-08-851234-1",
    "isbn: 4-08-851234-X", "9784088512341", "9784088512342", "4-08-851234-X",
    "alice@Example.COM", "a@b", "x@y.1", "$50,000", "$ 5", "¥1,200", "€9.99", "£5", "1200円",
    "500 yen", "20 dollars", "3 euros", "9 usd", "2024-01-15", "2024-02-30", "2024年1月15日",
    "vol 42", "Vol. 007", "volume 3", "VOL42", "42巻", "第3巻", "４２巻", "0", "42", "3.14",
    "1,000,000", "1.2.3", "2024", "12:30", "-", "--", "e-mail", "C++",
]  # fmt: skip
_OTHER = [
    "the", "a", "stock", "please", "Book", "this", "okay?", "HELLO", "ThAnKs", "İstanbul",
    "straße", "café", "ÉLAN", "Привет", "한국어", "漫画", "です", "ｶﾀｶﾅ", "ＯＫ", "👍", "🎉🎉",
    "’", "'", "\u3000", "\t", "\n", "  ", ".", ",", "!", "?", "#", "(", ")", ":", ";", "/",
    "e\u0301", "ﬁ", "①",
]  # fmt: skip


def _word(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.35:
        word = rng.choice(_PHRASES)
    elif pick < 0.55:
        word = rng.choice(_SHAPES)
    elif pick < 0.65:
        word = str(rng.randrange(0, 10 ** rng.randrange(1, 14)))
    else:
        word = rng.choice(_OTHER)
    case = rng.random()
    if case < 0.1:
        return word.upper()
    if case < 0.2:
        return word.title()
    return word


def _random_text(rng: random.Random, ascii_only: bool) -> str:
    kind = rng.random()
    if kind < 0.04:
        return rng.choice(["", " ", "\n", "ok", "42", "hi!", "OK."])
    words = [_word(rng) for _ in range(rng.randrange(1, 30))]
    if ascii_only:
        words = [w for w in words if w.isascii()] or ["ok"]
    seps = [" ", " ", " ", ", ", ". ", "", "\n", "-", "! "]
    text = "".join(w + rng.choice(seps) for w in words)
    if kind > 0.97:  # past the density window (4,000), sometimes past the rule window
        text = (text + " ") * (rng.randrange(4_100, 14_000) // max(len(text), 1) + 1)
    return text


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    # Most turns are ASCII (the inlined path): weight them.
    texts = [_random_text(rng, ascii_only=rng.random() < 0.7) for _ in range(count)]
    for domain in ("manga", "assistant"):
        conversation = generate_conversation(seed, turns=150, facts=12, domain=domain)
        texts += [
            b.text for turn in conversation.turns for b in turn.content if isinstance(b, TextBlock)
        ]
    return MESSAGES + texts


SEEDS = range(4)


def _extractors() -> list[RuleEntityExtractor]:
    return [
        RuleEntityExtractor(),
        RuleEntityExtractor(MANGA_TITLES),
        # A word list with a phrase starting with punctuation, and a rule without a gate.
        RuleEntityExtractor(
            rules=[
                PhraseRule("tag", {"#tag": "tag", "-": "dash", "ok": "ok"}),
                *entities_module.DEFAULT_ENTITY_RULES,
            ]
        ),
        RuleEntityExtractor(
            {"Berserk": "Berserk"},
            rules=[
                entities_module.EntityRule("number", r"[0-9][0-9]*", lambda m: m.group()),
                PhraseRule("genre", entities_module._GENRES),
            ],
        ),
    ]


def _scorers() -> list[RuleImportanceScorer]:
    return [
        RuleImportanceScorer(),
        # Cue lists starting with punctuation: the cue gate is off.
        RuleImportanceScorer(ImportanceRules(greeting_cues=("#hello", "hi"))),
        RuleImportanceScorer(
            ImportanceRules(density_floor=0.1, density_ceiling=0.9, social_max_chars=10)
        ),
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_plain_analysis_is_the_session_start_analysis(seed: int) -> None:
    tokens = TiktokenCounter()
    extractors, scorers = _extractors(), _scorers()
    assert all(is_plain_analysis(tokens, e, s) for e in extractors for s in scorers)
    rng = random.Random(seed)
    for text in _texts(seed, 900):
        role = rng.choice(["user", "assistant"])
        extractor, scorer = rng.choice(extractors), rng.choice(scorers)
        blocks = (TextBlock(type="text", text=text),)
        got = analyse_plain_text(role, blocks, tokens, extractor, scorer)
        assert_same(got, ref_analysis(role, text, tokens, extractor, scorer))
        # The default pair on every text.
        got = analyse_plain_text(role, blocks, tokens, extractors[0], scorers[0])
        assert_same(got, ref_analysis(role, text, tokens, extractors[0], scorers[0]))


def test_every_entity_shape_and_phrase_alone() -> None:
    tokens = TiktokenCounter()
    for extractor in _extractors():
        for scorer in _scorers():
            for text in [*_SHAPES, *_PHRASES, *_OTHER]:
                for role in ("user", "assistant"):
                    blocks = (TextBlock(type="text", text=text),)
                    got = analyse_plain_text(role, blocks, tokens, extractor, scorer)
                    assert_same(got, ref_analysis(role, text, tokens, extractor, scorer))


# -- end to end: the service's fast path against its general path ------------------------


class _Tokens(TiktokenCounter):
    pass


class _Entities(RuleEntityExtractor):
    pass


class _Scorer(RuleImportanceScorer):
    pass


def _service(*, general: bool) -> MemoryService:
    clock = FakeClock()
    engines = (
        {"tokens": _Tokens(), "entities": _Entities(), "importance": _Scorer()} if general else {}
    )
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        **engines,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("seed", range(2))
def test_a_default_service_adds_the_turns_of_the_general_path(seed: int) -> None:
    fast, general = _service(general=False), _service(general=True)
    assert is_plain_analysis(fast.tokens, fast.entities, fast.importance)
    assert not is_plain_analysis(general.tokens, general.entities, general.importance)
    rng = random.Random(seed)
    for text in _texts(seed + 10, 400):
        if len(text) > 4_000:  # a plain add_turn's limit (LARGE_TURN_CHARS)
            continue
        role = rng.choice(["user", "assistant"])
        turn, analysis = fast.analyse_text_turn(role, text)
        expected_turn, expected = general.analyse_text_turn(role, text)
        assert_same(analysis, expected)
        assert turn.model_dump() == expected_turn.model_dump()


def test_a_subclassed_engine_is_read_through_its_methods() -> None:
    # Overridden methods are honoured: only the exact built-in classes are inlined.
    class Loud(RuleEntityExtractor):
        def extract(self, text: str | TurnText) -> tuple[Entity, ...]:
            return (Entity(kind="mood", value="loud"),)

    class Flat(RuleImportanceScorer):
        def score(self, *args: object, **kwargs: object) -> ImportanceScore:
            return ImportanceScore(0.5, "flat")

    clock = FakeClock()
    service = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        entities=Loud(),
        importance=Flat(),
    )
    turn, analysis = service.analyse_text_turn("user", "hello there")
    assert analysis.entities == (Entity(kind="mood", value="loud"),)
    assert turn.importance == 0.5
    assert turn.metadata == {"importance_reason": "flat"}
