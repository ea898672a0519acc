"""Session 9's cheaper summary pass (issue #8) writes exactly what the pass wrote before.

Each function the change replaced is kept here as it was (the reference) and compared with
its replacement on random inputs; whole passes of long sessions (a generated conversation
with planted facts, corrections that supersede values, tool calls with large results and
redacted turns; the bench's repeated messages) are run once with the references patched
in and once as shipped, every module cache emptied before each run (so neither run reads
what the other computed), and their records compared byte for byte."""

from __future__ import annotations

import json
import random
import re
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.summaries.pass_records import after_each, pass_records
from tiermem.clock import FakeClock
from tiermem.policies.phrases import normal_form
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import (
    SummaryPolicy,
    _candidates,
    _lru,
    offline,
    rolling,
    structured,
    validate,
)
from tiermem.summaries._candidates import (
    _IDX,
    _LINE,
    _ROLE_WEIGHT,
    _SLOTS_AT,
    _TOOL_CALL,
    _WRONG,
    _body,
    _drop_stale,
    _mentions_stale,
    _merge,
    _Row,
    _score,
    _slot_keys,
)
from tiermem.summaries._lru import Lru, counted
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.rolling import BuiltTier, RollingBuilder
from tiermem.summaries.structured import ProbeSet, SaidIn, value_key, value_probe
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
STEADY = SummaryPolicy(min_preservation=0.0, recover_preservation=0.0)
_SPACES = re.compile(r"\s+")
WHITESPACE = [c for c in map(chr, range(0x110000)) if c.isspace()]

# -- the references: the functions as they were before the change ---------------------------


def ref_haystack(text: str) -> str:
    return _SPACES.sub(" ", normal_form(text).casefold())


def ref_stated_by(self: ProbeSet, said: SaidIn) -> set[int]:
    found: set[int] = set()
    by_entity = self._by_entity
    if by_entity:
        for pair in said.entities():
            hits = by_entity.get(pair)
            if hits is not None:
                found.update(hits)
    for at, needle in self._written:
        if at not in found and said.writes(needle):
            found.add(at)
    return found


def ref_retexted(self: RollingBuilder, tier: BuiltTier, text: str) -> BuiltTier:
    if text == tier.text.text:
        return tier
    summary = tier.text.model_copy(update={"text": text, "tokens": counted(self.counter, text)})
    return replace(tier, text=summary)


def ref_read_lines(
    summarizer: ExtractiveSummarizer, index: int, role: str, who: str, text: str
) -> tuple[Any, ...]:
    """A text block's candidate lines as they were read, every count the encoder's."""
    out: list[Any] = []
    weight = _ROLE_WEIGHT[role]
    for reading in summarizer._reader.read(text, role=role):
        score = _score(reading, weight)
        if score > 0:
            body = summarizer._cut(reading.text)
            line = f"- [{index}] {who}: {body}"
            cost, joined = COUNTER.count(line) + 1, COUNTER.count(line + "\n")
            out += (index, line, score, _slot_keys(reading), reading.wrong, body, cost, joined)
    return tuple(out)


def ref_carried_line(summarizer: ExtractiveSummarizer, line: str) -> tuple[Any, ...]:
    """An indexed line of a prior as it was carried, every count the encoder's."""
    match = _LINE.match(line)
    assert match is not None
    who, text = match.group("who"), match.group("text")
    role = "user" if who == "User" else "assistant"
    tool = who.startswith(("Result of", "Assistant called"))
    weight = _ROLE_WEIGHT["tool" if tool else role]
    readings = summarizer._reader.read(text, role=role) if not who.startswith("Result") else []
    reading = _merge(readings)
    score = _score(reading, weight) if reading else _TOOL_CALL
    return (
        int(match.group("index")),
        line,
        max(score, _TOOL_CALL),
        _slot_keys(reading),
        reading.wrong if reading else (),
        text,
        COUNTER.count(line) + 1,
        COUNTER.count(line + "\n"),
    )


def ref_drop_stale(rows: list[_Row]) -> list[int]:
    """The rows that stay, as they were found (every line's mentions asked afresh)."""
    latest: dict[str, int] = {}
    current: dict[str, tuple[str, str]] = {}
    stating = [(row[_IDX], at) for at, row in enumerate(rows) if row[_SLOTS_AT]]
    stating.sort()
    for _, at in stating:
        slots = rows[at][_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            latest[slots[pos]] = at
            current[slots[pos]] = (slots[pos + 1], slots[pos + 2])
    stale: dict[str, str] = {}
    wrongs = False
    for row in rows:
        slots = row[_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            if slots[pos + 1] != current[slots[pos]][0]:
                stale[slots[pos + 2]] = slots[pos]
        if row[_WRONG]:
            wrongs = True
            for wrong in row[_WRONG]:
                stale.setdefault(wrong, "")
    if not stating and not wrongs:
        return list(range(len(rows)))
    current_keys = {key for key, _ in current.values()}
    stale = {
        value: slot
        for value, slot in stale.items()
        if value_key(value, slot=slot or None) not in current_keys
    }
    probes = (
        (
            ProbeSet([value_probe(value, slot=slot or None) for value, slot in stale.items()]),
            [value_probe(current[slot][1], slot=slot) if slot else None for slot in stale.values()],
        )
        if stale
        else None
    )
    kept = []
    for at, row in enumerate(rows):
        slots = row[_SLOTS_AT]
        if slots:
            stated = range(0, len(slots), 3)
            if any(slots[pos + 1] != current[slots[pos]][0] for pos in stated):
                continue
            if any(latest[slots[pos]] == at for pos in stated):
                kept.append(at)
            continue
        if not row[_WRONG] and probes and _mentions_stale(_body(row), *probes):
            continue
        kept.append(at)
    return kept


REFERENCES: list[tuple[Any, str, Callable[..., Any]]] = [
    (structured, "_haystack", ref_haystack),
    (ProbeSet, "stated_by", ref_stated_by),
    (RollingBuilder, "retexted", ref_retexted),
    (offline, "_drop_stale", ref_drop_stale),
]


@contextmanager
def _references(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as patch:
        for owner, name, function in REFERENCES:
            patch.setattr(owner, name, function)
        yield


def _clear_caches() -> None:
    """Empty every module-level cache of the summaries package (LRUs, per-reader maps of
    them, the last stale values), so a run computes everything itself."""
    for module in (structured, validate, _lru, _candidates, rolling):
        for value in vars(module).values():
            holds_caches = isinstance(value, weakref.WeakKeyDictionary | dict) and any(
                isinstance(v, Lru) for v in list(value.values())
            )
            if isinstance(value, Lru) or holds_caches:
                value.clear()
    validate._LAST_STALE.clear()
    _candidates._MENTION_SETS.clear()


# -- pieces, on random inputs ---------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from([*WHITESPACE, "a", "B", "é", "あ", ".", "’"]), max_size=40))
def test_folding_a_text_collapses_whitespace_as_the_pattern_did(text: str) -> None:
    structured._HAYSTACKS.clear()
    assert structured._haystack(text) == ref_haystack(text)


def _said_texts(rng: random.Random, values: list[str]) -> str:
    words = ["the", "budget", "is", "now", "vol", "order", "not", "Berserk", "¥", "8,000", "42"]
    parts = [rng.choice(words + values) for _ in range(rng.randint(0, 12))]
    glue = rng.choice([" ", "  ", ", ", "\n", "-"])
    return glue.join(parts)


def test_probe_sets_find_what_they_found() -> None:
    """Random stale values (entities, amounts, names, plain words) asked of random texts
    that often hold them, touching letters or not."""
    rng = random.Random(9)
    pool = [
        "¥8,000", "8000円", "¥5,000", "Berserk", "Blame!", "vol 3", "ORD-12345", "ORD-123",
        "seinen", "horror", "reading", "1234", "Tokyo", "jp", "a b", "e-mail",
    ]  # fmt: skip
    slots = [None, "budget", "series", "volume", "order_id", "genre", "city"]
    for _ in range(400):
        values = rng.sample(pool, rng.randint(1, 8))
        probes = [value_probe(v, slot=rng.choice(slots)) for v in values]
        probe_set = ProbeSet(probes)
        for _ in range(5):
            text = _said_texts(rng, values)
            assert probe_set.stated_by(SaidIn(text)) == ref_stated_by(probe_set, SaidIn(text))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from([" ", "\t", "a", "Z", "9", ".", "?", "!", "…", "あ", "-"]))
        | st.sampled_from(["- [12] User: my budget is ¥8,000.", "Also: x; y.", ""]),
        min_size=1,
        max_size=6,
    )
)
def test_a_rewritten_text_counts_as_the_encoder_counts_it(lines: list[str]) -> None:
    """What validation's rewrite of a tier counts (from the engine's line counts, or the
    whole text when a line starts with whitespace or is empty) is the encoder's count."""
    text = "\n".join(lines)
    summarizer = ExtractiveSummarizer(COUNTER)
    assert summarizer.count_text(text) == COUNTER.count(text)
    assert summarizer.count_text(text) == COUNTER.count(text)  # kept


ENDINGS = [".", "!", "?", "?)", "。", "…", "!!", " :)", "$", "€", "%", "🙂", "e\u0301", "42", "ok",
           "¥8,000.", "\"", "'", "...", "」", "→", " -", "?!?!?!?!?!?!?!?!?!"]  # fmt: skip


def _sentence(rng: random.Random) -> str:
    starts = ["My budget is", "I prefer", "Do you have", "Your order", "I'm reading", "We decided"]
    middles = ["¥8,000", "Berserk vol 42", "ORD-12345", "seinen", "horror", "Blame!", "3 items"]
    return f"{rng.choice(starts)} {rng.choice(middles)}{rng.choice(ENDINGS)}"


def test_a_turns_lines_are_read_and_counted_as_before() -> None:
    """The lines of text blocks said again at new turn indexes (kept without their index)
    are the lines the old reading made, every count the encoder's: any ending (letters,
    punctuation runs, symbols, combining marks, long runs that are encoded)."""
    rng = random.Random(5)
    summarizer = ExtractiveSummarizer(COUNTER)
    texts = [" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(60)]
    for _ in range(600):
        text = rng.choice(texts)
        role, who = rng.choice([("user", "User"), ("assistant", "Assistant")])
        index = rng.choice([0, 7, 42, 999, 1000, 123456, rng.randint(0, 10**7)])
        got = summarizer._read_lines(index, role, who, text)
        assert got == ref_read_lines(summarizer, index, role, who, text), (index, text)


def test_carried_lines_are_read_and_counted_as_before() -> None:
    """Lines of a prior carried again under new indexes (their index-free part kept):
    the rows the old reading made, counts the encoder's -- turns' speakers, tool results,
    leading zeros and other digits, a sentence after two spaces, endings of every kind."""
    rng = random.Random(6)
    summarizer = ExtractiveSummarizer(COUNTER)
    whos = ["User", "Assistant", "Result of search", "Result of lookup (failed)", "Bob"]
    sentences = [_sentence(rng) for _ in range(40)] + [" two spaces.", "x" * 300 + "!"]
    for _ in range(800):
        digits = rng.choice(
            ["0", "7", "007", "42", "1000", "123456", "٣", str(rng.randint(0, 10**6))]
        )
        line = f"- [{digits}] {rng.choice(whos)}: {rng.choice(sentences)}"
        got = summarizer._carried_line(line)
        assert got == ref_carried_line(summarizer, line), line


def test_stale_rows_are_dropped_as_before() -> None:
    """Random spans of statements, corrections ("…, not ¥5,000") and mentions of earlier
    values, read by the summarizer into rows and ranked in random orders: the rows kept
    are those the old rule kept (its answers per body kept across calls here)."""
    rng = random.Random(8)
    summarizer = ExtractiveSummarizer(COUNTER)
    said = [
        "My budget is ¥5,000.", "Actually my budget is ¥8,000, not ¥5,000.", "My budget is ¥9,000.",
        "Options under ¥5,000 are here.", "Options under ¥8,000 and ¥5,000.",
        "I'm reading Berserk.",
        "Make it Blame! instead.", "Berserk vol 42 is in stock.", "My postcode is 150-0001.",
        "My postcode is 160-0022, not 150-0001.", "ok thanks", "I prefer seinen.",
        "Do you have Blame! vol 3?", "Your order ORD-12345 ships tomorrow.",
    ]  # fmt: skip
    for _ in range(300):
        rows: list[_Row] = []
        for index in range(rng.randint(1, 14)):
            role, who = rng.choice([("user", "User"), ("assistant", "Assistant")])
            fields = summarizer._read_lines(index, role, who, rng.choice(said))
            rows += [fields[at : at + 8] for at in range(0, len(fields), 8)]  # type: ignore[misc]
        rng.shuffle(rows)
        assert _drop_stale(rows) == ref_drop_stale(rows)


# -- whole passes ---------------------------------------------------------------------------


def _service(clock: FakeClock, summarizer: ExtractiveSummarizer, *, shared: bool) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        tokens=COUNTER if shared else None,  # the engine's counter, or another one
        auto_detect=False,
        index_turns=False,
        auto_summarize=False,
        summary_policy=STEADY,
        summarizer=summarizer,
    )


async def _records(
    turns: list[tuple[str, Any]],
    redact: set[int],
    titles: dict[str, str] | None = None,
    *,
    shared: bool = True,
) -> list[str]:
    """Each pass's summary and structured records, as a pass every 14 turns wrote them."""
    _clear_caches()
    clock = FakeClock()
    memory = _service(clock, ExtractiveSummarizer(COUNTER, known_titles=titles), shared=shared)
    return await pass_records(memory, turns, after_each(redact))


def _conversation(seeds: range, turns: int) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    out: list[tuple[str, Any]] = []
    titles: dict[str, str] = {}
    for seed in seeds:  # one long session: stale values pile up, as in bench/summary_pass_cpu.py
        conversation = generate_conversation(seed, turns=turns, facts=24, corrections=8)
        out += [(t.role, list(t.content)) for t in conversation.turns]
        titles.update(conversation.known_titles)
    return out, titles


async def test_passes_of_a_long_generated_session_write_what_they_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Facts, corrections, tool calls with large results and redacted turns, over three
    generated conversations in one session (a hundred superseded values by its end)."""
    turns, titles = _conversation(range(21, 24), 250)
    redact = {33, 120, 121, 400, 610}
    with _references(monkeypatch):
        ref = await _records(turns, redact, titles)
    new = await _records(turns, redact, titles)
    assert len(new) > 45
    stale = [json.loads(row)[0]["quality"]["stale_dropped"] for row in new]
    assert sum(stale) > 0  # the stale-line rules were exercised
    assert new == ref


async def test_passes_of_repeated_messages_write_what_they_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bench's messages, said again and again."""
    messages = [
        "Hello!",
        "I prefer seinen, nothing with horror please.",
        "Do you have Berserk vol 42 in stock?",
        "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
        "Your order ORD-12345 ships tomorrow.",
        "ok thanks",
        "Actually my budget is ¥8,000, not ¥5,000.",
    ]
    turns: list[tuple[str, Any]] = [
        ("user" if i % 2 == 0 else "assistant", messages[i % len(messages)]) for i in range(300)
    ]
    with _references(monkeypatch):
        ref = await _records(turns, {40}, shared=False)
    new = await _records(turns, {40}, shared=False)
    assert len(new) > 15
    assert new == ref
