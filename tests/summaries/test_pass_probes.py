"""The pass's value checks, made cheaper for issue #8, answer exactly as the rules they
replace: value probes and probe sets as ``states_value`` one value at a time, line-wise
words as whole-text words, line verdicts as the sentence-by-sentence stale rule, and kept
``stated_in`` checks as fresh ones. Randomised over generated conversations (planted
facts, corrections, tool output) and unicode edge cases; each compares with the rule as
it was, written out here."""

from __future__ import annotations

import random

from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.longterm.detect import split_sentences
from tiermem.models.turns import Turn
from tiermem.summaries.models import StructuredMemory
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.structured import (
    ProbeSet,
    RuleStructuredExtractor,
    SaidIn,
    same_value,
    stated_in,
    states_value,
    turn_said,
    value_probe,
)
from tiermem.summaries.validate import _read_words, _words_by_line, drop_stale
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
EDGE_TEXTS = [
    "",
    "\n",
    "a\n\nb",
    "Café\u0301 au lait.\n\u0301combining at a line start",
    "full\uff37idth ＡＢＣ １２３\nnbsp\u00a0here",
    "ﬁne ligature\r\nCRLF line\rCR only",
    "¥8,000 budget\n- [3] User: my budget is ¥8,000.",
    "tabs\tand  spaces \n trailing space \n",
    "ΣΊΣΥΦΟΣ straße ǅ\n\u2028line separator\u2029paragraph",
]


def _session(seed: int) -> tuple[list[Turn], RuleStructuredExtractor]:
    conversation = generate_conversation(seed, turns=240, facts=24, corrections=8)
    return list(conversation.indexed()), RuleStructuredExtractor(conversation.known_titles)


def _values(structured: StructuredMemory) -> list[tuple[str, str | None]]:
    """Every value structured memory holds, current and earlier, with its slot (and some
    without), plus values no text states."""
    out: list[tuple[str, str | None]] = []
    for slots in (structured.entities, structured.facts):
        for slot, fact in slots.items():
            for value in (fact.value, *fact.previous):
                out += [(value, slot), (value, None)]
    return [*out, ("ORD-00000", "order_id"), ("9", "volume"), ("", None), ("Nowhere", None)]


def test_probes_and_probe_sets_answer_as_states_value() -> None:
    rng = random.Random(8)
    for seed in (3, 17):
        turns, extractor = _session(seed)
        structured = extractor.extract_sync(turns)
        values = _values(structured)
        probes = [value_probe(value, slot=slot) for value, slot in values]
        probe_set = ProbeSet(probes)
        sentences = [s for t in turns for s in split_sentences(turn_said(t))]
        for text in [*rng.sample(sentences, 120), *EDGE_TEXTS]:
            for reader in (None, extractor.entities):
                said = SaidIn(text, reader)
                expected = {
                    at
                    for at, (value, slot) in enumerate(values)
                    if states_value(text, value, slot=slot, extractor=reader)
                }
                assert probe_set.stated_by(SaidIn(text, reader)) == expected, text
                assert {at for at, p in enumerate(probes) if said.states(p)} == expected, text


def test_words_by_line_are_the_words_of_the_whole_text() -> None:
    turns, _extractor = _session(5)
    rng = random.Random(5)
    lines = [*(turn_said(t) for t in turns), *EDGE_TEXTS]
    for _ in range(200):
        text = "\n".join(rng.sample(lines, rng.randint(1, 12)))
        assert _words_by_line(text) == _read_words(text)
    for text in EDGE_TEXTS:
        assert _words_by_line(text) == _read_words(text), text


def _drop_stale_as_it_was(
    text: str, structured: StructuredMemory, reader: RuleEntityExtractor
) -> tuple[str, int]:
    """``drop_stale`` sentence by sentence, every value asked of ``states_value``."""
    stale = [
        (slot, old, fact.value)
        for slots in (structured.facts, structured.entities)
        for slot, fact in slots.items()
        for old in fact.previous
        if old.strip() and not same_value(old, fact.value, slot=slot)
    ]
    if not stale or not text:
        return text, 0
    lines, dropped = [], 0
    for line in text.splitlines():
        sentences = split_sentences(line)
        kept = [
            s
            for s in sentences
            if not any(
                states_value(s, old, slot=slot, extractor=reader)
                and not states_value(s, new, slot=slot, extractor=reader)
                for slot, old, new in stale
            )
        ]
        if len(kept) == len(sentences):
            lines.append(line)
            continue
        dropped += len(sentences) - len(kept)
        if kept:
            lines.append(" ".join(s.strip() for s in kept))
    return "\n".join(lines), dropped


def test_drop_stale_drops_what_the_sentence_rule_drops() -> None:
    """Across a session's growing structured memory (its stale values change as it goes),
    on summaries of every stretch of it and on raw turns: the same text and count."""
    dropped_any = False
    for seed in (3, 11):
        turns, extractor = _session(seed)
        summarizer = ExtractiveSummarizer(COUNTER, extractor=extractor)
        for end in range(40, len(turns) + 1, 40):
            structured = extractor.extract_sync(turns[:end])
            texts = [
                summarizer.summarize_sync(turns[end - 40 : end], target_tokens=400),
                summarizer.summarize_sync(turns[:end], target_tokens=700),
                "\n".join(turn_said(t) for t in turns[:end]),
            ]
            for text in texts:
                for reader in (extractor.entities, None):
                    expected = _drop_stale_as_it_was(text, structured, reader or _READER)
                    assert drop_stale(text, structured, extractor=reader) == expected
                    assert drop_stale(text, structured, extractor=reader) == expected  # kept
                    dropped_any = dropped_any or expected[1] > 0
    assert dropped_any  # the sessions' corrections leave stale sentences to drop


_READER = RuleEntityExtractor()


def test_kept_stated_in_checks_answer_as_fresh_ones() -> None:
    turns, extractor = _session(9)
    structured = extractor.extract_sync(turns)
    values = _values(structured)
    text = ExtractiveSummarizer(COUNTER, extractor=extractor).summarize_sync(
        turns, target_tokens=900
    )
    for _ in range(2):  # the second time, every check and answer is a kept one
        check = stated_in(text)
        for value, slot in values:
            assert check(value, slot) == states_value(text, value, slot=slot), (value, slot)
