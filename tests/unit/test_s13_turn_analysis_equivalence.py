"""Session 13's turn analysis (issue #8: a tool output's catalogue rows) gives what the
session-start code (10b85d4) gave, every field: the turn text and its forms, token count,
entities (values, order, types), importance (score to the last bit, reason), drafts and
search terms; and the extractor's ``find`` gives the same matches at the same positions.

What changed, and is compared here against a copy of the old functions kept in this file:

* ``_isbn`` computes the check digit sum from the digits' bytes, and calls the prefix
  regex only for a match that starts with the word;
* ``RuleEntityExtractor.find``/``extract`` share one scan (``_found``), add a rule's
  matches in one step when no title can hold them, and of a text over 1,000 characters
  whose keys are not built yet look for the word lists' first words as substrings before
  building them;
* ``analyse_turn`` sends one scored text block with nothing else asked to the inlined
  plain analysis (built-in engines) or ``analyse_text_block``, and counts the tokens of
  the text it built rather than joining the blocks again.

Inputs: the conversation workload's turns (``bench/workload.py``: planted facts,
corrections, tool calls with catalogue outputs), random texts from the rules' own phrases
and entity shapes (``test_s11_analysis_plain``), long texts with and without the word
lists' first words, and random block contents (text, tool use, tool result, several text
blocks), through the built-in engines, engines with titles and other rules, and subclassed
engines.
"""

from __future__ import annotations

import dataclasses
import random
import re
from bisect import bisect_right
from typing import Any

import pytest
from bench.workload import workload_turns

from tests.unit.test_s11_analysis_plain import _extractors, _scorers, _texts
from tiermem.extraction import entities as entities_module
from tiermem.extraction.entities import (
    DEFAULT_ENTITY_RULES,
    EntityRule,
    RuleEntityExtractor,
)
from tiermem.extraction.turn_analysis import TurnAnalysis, analyse_turn
from tiermem.longterm.detect import RuleMemoryDetector
from tiermem.longterm.text import doc_terms
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.models.turns import Entity
from tiermem.policies.importance import ImportanceScore, RuleImportanceScorer
from tiermem.policies.turn_text import TurnText, as_turn_text
from tiermem.session import content_blocks
from tiermem.testing.conversations import MANGA_TITLES
from tiermem.tokens import TiktokenCounter

# -- reference: the session-start code (10b85d4) -----------------------------------------

_REF_ISBN_PREFIX = re.compile(r"isbn(?:-?1[03])?:?\s*")


def ref_isbn(match: re.Match[str]) -> str | None:
    """``entities._isbn`` as of 10b85d4."""
    written = match.group(0)
    prefix = _REF_ISBN_PREFIX.match(written)
    if prefix:
        written = written[prefix.end() :]
    digits = written.replace("-", "").replace(" ", "").upper()
    if len(digits) == 13 and digits.isdigit() and digits.startswith(("978", "979")):
        total = sum(int(d) * (1 if i % 2 == 0 else 3) for i, d in enumerate(digits))
        return digits if total % 10 == 0 else None
    if len(digits) == 10 and digits[:9].isdigit() and (digits[9].isdigit() or digits[9] == "X"):
        if not (prefix or "-" in written):
            return None
        total = sum((10 - i) * (10 if d == "X" else int(d)) for i, d in enumerate(digits))
        return digits if total % 11 == 0 else None
    return None


_REF_MONEY_PARTS = re.compile(r"([$¥€£]?)\s?([0-9][0-9,]*(?:\.[0-9]+)?)\s?(.*)")


def ref_money(match: re.Match[str]) -> str | None:
    """``entities._money`` as of 10b85d4."""
    parts = _REF_MONEY_PARTS.fullmatch(match.group(0))
    if parts is None:
        return None
    symbol, amount, word = parts.groups()
    return f"{entities_module._CURRENCIES[symbol or word]} {amount.replace(',', '')}"


def ref_volume(match: re.Match[str]) -> str | None:
    """``entities._volume`` as of 10b85d4."""
    number = re.search(r"[0-9]+", match.group(0))
    return str(int(number.group())) if number else None


_REF_VALUES = {
    entities_module._isbn: ref_isbn,
    entities_module._money: ref_money,
    entities_module._volume: ref_volume,
}


def ref_rules(rules: tuple[Any, ...]) -> tuple[Any, ...]:
    """``rules`` with the old value functions for the new ones."""
    return tuple(
        dataclasses.replace(rule, value=_REF_VALUES[rule.value])
        if isinstance(rule, EntityRule) and rule.value in _REF_VALUES
        else rule
        for rule in rules
    )


def ref_find(self: RuleEntityExtractor, text: str | TurnText) -> list[tuple[int, int, str, str]]:
    """``RuleEntityExtractor.find`` as of 10b85d4."""
    view = as_turn_text(text).view
    found: list[tuple[int, int, int, str, str]] = []
    titles = self._titles.find(view) if self._titles else []
    starts: list[int] = []
    if titles:
        found += [(start, 0, end, "series", value) for start, end, value in titles]
        starts = [start for start, _, _ in titles]
    folded, normal = view.folded, view.normal
    if folded.isascii():
        present = set(filter(folded.__contains__, self._folded_ascii_gates))
        normal_gates = self._normal_ascii_gates if normal.isascii() else self._normal_gates
    else:
        present = set(filter(folded.__contains__, self._folded_gates))
        normal_gates = self._normal_gates
    if normal_gates:
        present.update(
            map(self._normal_keys.__getitem__, filter(normal.__contains__, normal_gates))
        )
    phrase_firsts = self._phrase_firsts
    if phrase_firsts:
        keys = view._keys if view._keys is not None else view.keys
        if not keys.isdisjoint(phrase_firsts):
            present.update(entities_module._PHRASE + first for first in keys & phrase_firsts)
    rules = self._rules_for(frozenset(present)) if present else self._ungated
    for rule in rules:
        if isinstance(rule, EntityRule):
            matches = rule._scan(folded if rule.folded else normal)
        else:
            matches = rule.find(view)
        for start, end, value in matches:
            i = bisect_right(starts, start) - 1 if starts else -1
            if i < 0 or titles[i][1] < end:
                found.append((start, len(found), end, rule.kind, value))
    if not found:
        return []
    found.sort()
    return [(start, end, kind, value) for start, _, end, kind, value in found]


def ref_extract(self: RuleEntityExtractor, text: str | TurnText) -> tuple[Entity, ...]:
    """``RuleEntityExtractor.extract`` as of 10b85d4."""
    found = ref_find(self, text)
    if not found:
        return ()
    if len(found) == 1:
        _, _, kind, value = found[0]
        return entities_module._entities(((kind, value),))
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str]] = []
    for _, _, kind, value in found:
        pair = (kind, value)
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return entities_module._entities(tuple(pairs))


class RefExtractor:
    """The old ``find`` and ``extract`` over an extractor of the same titles and rules (the
    old ``_isbn`` in them); its other parts are unchanged."""

    def __init__(self, new: RuleEntityExtractor) -> None:
        titles = new._titles
        self.inner = RuleEntityExtractor(rules=ref_rules(new._rules))
        self.inner._titles = titles

    def extract(self, text: str | TurnText) -> tuple[Entity, ...]:
        return ref_extract(self.inner, text)


def ref_analyse_turn(
    role: str,
    blocks: tuple[Any, ...],
    *,
    tokens: Any,
    entities: Any,
    importance: Any,
    detector: Any = None,
    index_terms: bool = False,
) -> TurnAnalysis:
    """``analyse_turn`` as of 10b85d4 (after its role and block checks)."""
    content = tuple(blocks)
    text = TurnText.of_blocks(content)
    found = entities.extract(text)
    score = importance.score(role, content, entities=found, text=text) if importance else None
    drafts: tuple[Any, ...] = ()
    if detector is not None and role == "user" and text.said_text.strip():
        drafts = detector.detect(text)
    return TurnAnalysis(
        text=text,
        token_count=tokens.count_blocks(content),
        entities=found,
        importance=score,
        drafts=drafts,
        terms=doc_terms(text) if index_terms else None,
    )


# -- comparisons -------------------------------------------------------------------------


def assert_same(got: TurnAnalysis, expected: TurnAnalysis) -> None:
    assert got.text == expected.text
    for name in ("view", "said"):
        g, e = getattr(got.text, name), getattr(expected.text, name)
        assert (g.normal, g.folded) == (e.normal, e.folded)
        # Words and keys, built now or later, are those of the text.
        assert (g.words, g.keys) == (e.words, e.keys)
    assert (got.text.nfkc, got.text.truncated) == (expected.text.nfkc, expected.text.truncated)
    assert (got.text.said is got.text.view) == (expected.text.said is expected.text.view)
    assert type(got.token_count) is int
    assert got.token_count == expected.token_count
    assert [type(e) for e in got.entities] == [Entity] * len(expected.entities)
    assert [(e.kind, e.value) for e in got.entities] == [
        (e.kind, e.value) for e in expected.entities
    ]
    if expected.importance is None:
        assert got.importance is None
    else:
        assert type(got.importance) is ImportanceScore
        assert got.importance.score.hex() == expected.importance.score.hex()
        assert got.importance.reason == expected.importance.reason
    assert got.drafts == expected.drafts
    assert got.terms == expected.terms


def assert_same_matches(new: RuleEntityExtractor, ref: RefExtractor, text: TurnText) -> None:
    # Fresh views for each side: what one built must not hide what the other builds.
    a, b = TurnText.of(text.text), TurnText.of(text.text)
    assert new.find(a) == ref_find(ref.inner, b)
    a, b = TurnText.of(text.text), TurnText.of(text.text)
    got, expected = new.extract(a), ref.extract(b)
    assert [(type(e), e.kind, e.value) for e in got] == [
        (type(e), e.kind, e.value) for e in expected
    ]
    # A view whose keys ``find`` left unbuilt builds the same ones later.
    assert (a.view.words, a.view.keys) == (b.view.words, b.view.keys)


# -- inputs ------------------------------------------------------------------------------

WORKLOAD = workload_turns("conversation", 600)  # two conversations: 48 tool outputs


def _workload_blocks() -> list[tuple[str, tuple[Any, ...]]]:
    return [(role, content_blocks(content)) for role, content in WORKLOAD]


def _long_texts(seed: int) -> list[str]:
    """Texts over 1,000 characters (the substring gate of the word lists): tool outputs,
    with and without a first word of a list (as a word, inside a word, in CJK), random
    words, past the rule window."""
    rng = random.Random(seed)
    outputs = [
        b.content[0].text
        for _, blocks in _workload_blocks()
        for b in blocks
        if isinstance(b, ToolResultBlock)
    ][:6]
    short = _texts(seed, 60)
    inserts = [
        "", " Japanese ", "japanesex ", " xenglish", " 日本語 ", "英", " dark fantasy ",
        " DARK ", "darkness ", " seinen.", " shōnen ", " セイネン ", "ホ", " horror!", "Horrors ",
    ]  # fmt: skip
    texts: list[str] = []
    for n in range(16):
        base = rng.choice(outputs) if n % 2 else " ".join(rng.sample(short, 30))
        cut = rng.randrange(len(base))
        text = base[:cut] + rng.choice(inserts) + base[cut:]
        if n % 5 == 0:
            text = (text + "\n") * rng.randrange(2, 6)  # sometimes past 12,000: windowed
        texts.append(text)
    return texts


def _random_blocks(seed: int) -> list[tuple[str, tuple[Any, ...]]]:
    rng = random.Random(seed)
    texts = [t for t in _texts(seed, 60) if t] + _long_texts(seed)[:6]
    out: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(80):
        role = rng.choice(("user", "assistant"))
        shape = rng.random()
        text = rng.choice(texts)
        if shape < 0.3:
            blocks: tuple[Any, ...] = (TextBlock(text=text),)
        elif shape < 0.5:
            blocks = (TextBlock(text=text), TextBlock(text=rng.choice(texts)))
        elif shape < 0.7:
            blocks = (
                TextBlock(text=text),
                ToolUseBlock(
                    tool_use_id="t1", name="search", input={"query": rng.choice(texts)[:80]}
                ),
            )
        elif shape < 0.9:
            blocks = (ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=text),)),)
        else:
            blocks = (
                TextBlock(text=rng.choice(texts)),
                ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=text),)),
            )
        out.append((role, blocks))
    return out


class _Counter(TiktokenCounter):
    """A subclass: analysed through its methods."""


class _Extractor(RuleEntityExtractor):
    pass


class _Scorer(RuleImportanceScorer):
    pass


# -- tests -------------------------------------------------------------------------------


def test_find_and_extract_are_the_old_ones_on_the_conversation_workload() -> None:
    for new in _extractors():
        ref = RefExtractor(new)
        for _, blocks in _workload_blocks():
            assert_same_matches(new, ref, TurnText.of_blocks(blocks))


@pytest.mark.parametrize("seed", range(2))
def test_find_and_extract_are_the_old_ones_on_random_and_long_texts(seed: int) -> None:
    for new in _extractors():
        ref = RefExtractor(new)
        for text in _texts(seed, 150) + _long_texts(seed):
            assert_same_matches(new, ref, TurnText.of(text))


def test_money_and_volume_values_are_the_old_ones() -> None:
    rng = random.Random(6)
    rules = [
        r
        for r in DEFAULT_ENTITY_RULES
        if isinstance(r, EntityRule)
        and r.value in (entities_module._money, entities_module._volume)
    ]
    spaces = ["", "", " ", "\t", "\u3000", "\n", "  "]
    for _ in range(2_000):
        number = rng.choice(["0", "7", "007", "42", "1,200", "12,345,678", "3.14", "1234", "99999"])
        for written in (
            rng.choice("$¥€£") + rng.choice(spaces) + number,
            number + rng.choice(spaces) + rng.choice(["円", "yen", "dollars", "euro", "usd"]),
            rng.choice(["vol", "vol.", "volume", "第"]) + rng.choice(spaces) + number + "巻",
            number + rng.choice(spaces) + "巻",
        ):
            text = TurnText.of(rng.choice(["", "x ", "1", "a-"]) + written + rng.choice(["", "!"]))
            for rule in rules:
                for match in rule._regex.finditer(text.view.folded):
                    assert rule.value(match) == _REF_VALUES[rule.value](match)


def test_isbn_values_are_the_old_ones() -> None:
    rng = random.Random(5)
    rules = [r for r in DEFAULT_ENTITY_RULES if isinstance(r, EntityRule) and r.kind == "isbn"]
    for _ in range(600):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice((9, 12))))
        digits = rng.choice(("978", "979", "")) + digits if len(digits) == 12 else digits
        shaped = "-".join(digits[i : i + rng.randrange(1, 5)] for i in range(0, len(digits), 4))
        for check in "0123456789x":
            for written in (digits + check, shaped + "-" + check, "isbn " + digits + check):
                text = written[:13] if rng.random() < 0.05 else written
                for rule in rules:
                    for match in rule._regex.finditer(text):
                        assert entities_module._isbn(match) == ref_isbn(match)


Engines = tuple[Any, Any, Any, RefExtractor, RuleMemoryDetector]


def _engines() -> list[Engines]:
    """(tokens, extractor, scorer, the extractor's reference, a detector)."""
    tokens = TiktokenCounter()
    detector = RuleMemoryDetector()
    engines = [
        (tokens, RuleEntityExtractor(), RuleImportanceScorer()),
        (tokens, RuleEntityExtractor(MANGA_TITLES), _scorers()[1]),
        (_Counter(), _Extractor(MANGA_TITLES), _Scorer()),  # the general path, subclasses
        (tokens, _extractors()[2], _scorers()[2]),
    ]
    return [(t, e, s, RefExtractor(e), detector) for t, e, s in engines]


def _compare(role: str, blocks: tuple[Any, ...], engines: Engines) -> None:
    tokens, extractor, scorer, ref, detector = engines
    for importance, det, terms in (
        (scorer, None, False),
        (None, None, False),
        (scorer, detector, False),
        (scorer, None, True),
    ):
        got = analyse_turn(
            role,
            blocks,
            tokens=tokens,
            entities=extractor,
            importance=importance,
            detector=det,
            index_terms=terms,
        )
        expected = ref_analyse_turn(
            role,
            blocks,
            tokens=tokens,
            entities=ref,
            importance=importance,
            detector=det,
            index_terms=terms,
        )
        assert_same(got, expected)


def test_analyse_turn_is_the_old_one_on_the_conversation_workload() -> None:
    engines = _engines()
    for n, (role, blocks) in enumerate(_workload_blocks()):
        # Every turn with the default engines, every fourth with each of the others.
        for k, engine in enumerate(engines):
            if k == 0 or n % 4 == k:
                _compare(role, blocks, engine)


@pytest.mark.parametrize("seed", range(2))
def test_analyse_turn_is_the_old_one_on_random_blocks(seed: int) -> None:
    engines = _engines()
    for n, (role, blocks) in enumerate(_random_blocks(seed)):
        _compare(role, blocks, engines[n % len(engines)])


def test_a_long_tool_output_naming_no_list_word_leaves_its_keys_unbuilt() -> None:
    """The substring gate at work: a catalogue output's keys (every word and character)
    are built by no reader on the turn path, and its entities are found all the same."""
    extractor = RuleEntityExtractor()
    output = next(
        b for _, blocks in _workload_blocks() for b in blocks if isinstance(b, ToolResultBlock)
    )
    text = TurnText.of_blocks((output,))
    assert len(text.text) > 1_000
    found = extractor.extract(text)
    assert {e.kind for e in found} >= {"volume", "asin", "isbn", "money"}
    assert text.view._keys is None
    # Naming a language, it is read as a word list's text.
    named = TurnText.of(text.text + "\nAll in Japanese.")
    assert Entity(kind="language", value="japanese") in extractor.extract(named)
    assert named.view._keys is not None
