"""The offline summarizer, made cheaper for issue #8 (candidate rows as tuples, recency
folded into the budget's ranking, each line's counts carried with it, the rows of
recent priors and spans of turns kept whole, line counts from their parts), writes
exactly what it wrote before: the implementation before the change is kept here as the
reference (:class:`RefSummarizer`: uncached, counting with the encoder itself) and both
are run on the same inputs -- whole passes of long sessions (generated conversations
with planted facts, corrections, tool calls and results, redactions; the bench's
repeated messages) record by record, and random spans, priors, targets and ``must_keep``
items, with the same turn objects again (kept spans) and equal copies (not kept)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.summaries.pass_records import after_each, pass_records
from tiermem.clock import FakeClock
from tiermem.longterm.detect import split_sentences
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.models.turns import Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import SummaryPolicy
from tiermem.summaries.offline import (
    _CARRIED_UNINDEXED,
    _LINE,
    _RECENCY,
    _ROLE_WEIGHT,
    _SLOT,
    _SLOT_LINE,
    _TOOL_CALL,
    _TOPIC,
    _UNINDEXED,
    ExtractiveSummarizer,
    _body_of,
    _mentions_stale,
    _merge,
    _score,
    _slot_keys,
)
from tiermem.summaries.structured import (
    ProbeSet,
    SentenceReading,
    value_key,
    value_probe,
)
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
STEADY = SummaryPolicy(min_preservation=0.0, recover_preservation=0.0)
BENCH_MESSAGES = [  # bench/workload.py's messages: the same sentences said again and again
    "Hello!",
    "I prefer seinen, nothing with horror please.",
    "Do you have Berserk vol 42 in stock?",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "Your order ORD-12345 ships tomorrow.",
    "ok thanks",
]

# -- the reference: the implementation before the change ------------------------------------


@dataclass(slots=True)
class _Candidate:
    index: int
    order: int
    line: str
    score: float
    slots: tuple[str, ...] = ()
    wrong: tuple[str, ...] = ()
    body: str | None = None


class RefSummarizer(ExtractiveSummarizer):
    """``summarize_sync`` as it was, without its caches: every count is the encoder's."""

    def summarize_sync(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        candidates = self._ref_carried(prior or "")
        candidates += self._ref_from_turns(turns, start=len(candidates))
        if not any(c.score > _TOPIC for c in candidates):
            candidates += self._ref_topics(turns, start=len(candidates))
        candidates = _ref_drop_stale(candidates)
        _ref_add_recency(candidates)
        kept_items = [f"- {item.strip()}" for item in must_keep if item.strip()]
        return self._ref_fit(kept_items, candidates, target_tokens)

    def _ref_carried(self, prior: str) -> list[_Candidate]:
        out: list[_Candidate] = []
        for raw in prior.splitlines():
            line = raw.strip()
            if not line:
                continue
            match = _LINE.match(line)
            if match is None:
                text = line[2:] if line.startswith("- ") else line
                stated = _SLOT_LINE.match(text)
                slots: tuple[str, ...] = ()
                if stated:
                    slot, value = stated.group("slot"), stated.group("value").strip()
                    slots = (slot, value_key(value, slot=slot), value)
                score = _SLOT if stated else _CARRIED_UNINDEXED
                carried = f"- {text}"
                out.append(
                    _Candidate(_UNINDEXED, len(out), carried, score, slots, (), _body_of(carried))
                )
                continue
            who, text = match.group("who"), match.group("text")
            role = "user" if who == "User" else "assistant"
            weight = _ROLE_WEIGHT[
                "tool" if who.startswith(("Result of", "Assistant called")) else role
            ]
            readings = self._reader.read(text, role=role) if not who.startswith("Result") else []
            reading = _merge(readings)
            score = _score(reading, weight) if reading else _TOOL_CALL
            out.append(
                _Candidate(
                    int(match.group("index")),
                    len(out),
                    line,
                    max(score, _TOOL_CALL),
                    _slot_keys(reading),
                    reading.wrong if reading else (),
                    text,
                )
            )
        return out

    def _ref_from_turns(self, turns: Sequence[Turn], *, start: int) -> list[_Candidate]:
        out: list[_Candidate] = []
        tool_names: dict[str, str] = {}
        for turn in turns:
            if turn.redacted:
                continue
            who = "User" if turn.role == "user" else "Assistant"
            for block in turn.content:
                if isinstance(block, TextBlock):
                    weight = _ROLE_WEIGHT[turn.role]
                    for reading in self._reader.read(block.text, role=turn.role):
                        score = _score(reading, weight)
                        if score > 0:
                            body = self._cut(reading.text)
                            line = f"- [{turn.index}] {who}: {body}"
                            out.append(
                                _Candidate(
                                    turn.index,
                                    start + len(out),
                                    line,
                                    score,
                                    _slot_keys(reading),
                                    reading.wrong,
                                    body,
                                )
                            )
                elif isinstance(block, ToolUseBlock):
                    tool_names[block.tool_use_id] = block.name
                    args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
                    line = f"- [{turn.index}] Assistant called {block.name}({self._cut(args)})"
                    out.append(_Candidate(turn.index, start + len(out), line, _TOOL_CALL))
                elif isinstance(block, ToolResultBlock):
                    name = tool_names.get(block.tool_use_id, "a tool")
                    failed = " (failed)" if block.status == "error" else ""
                    label = f"Result of {name}{failed}"
                    salient = self._reader.read_salient(
                        text_of(block.content), role="assistant", limit=self._max_results
                    )
                    for reading in salient:
                        score = _score(reading, _ROLE_WEIGHT["tool"])
                        out.append(
                            self._ref_candidate(turn.index, start + len(out), label, reading, score)
                        )
        return out

    def _ref_candidate(
        self, index: int, order: int, who: str, reading: SentenceReading, score: float
    ) -> _Candidate:
        line = f"- [{index}] {who}: {self._cut(reading.text)}"
        return _Candidate(index, order, line, score, _slot_keys(reading), reading.wrong)

    def _ref_topics(self, turns: Sequence[Turn], *, start: int) -> list[_Candidate]:
        out: list[_Candidate] = []
        for turn in turns:
            said = "\n".join(b.text for b in turn.content if isinstance(b, TextBlock))
            sentences = split_sentences(said) if turn.role == "user" and not turn.redacted else []
            if sentences:
                line = f"- [{turn.index}] User: {self._cut(sentences[0])}"
                out.append(_Candidate(turn.index, start + len(out), line, _TOPIC))
        return out

    def _ref_fit(self, kept_items: list[str], candidates: list[_Candidate], target: int) -> str:
        used = sum(COUNTER.count(line) + 1 for line in kept_items)
        chosen: list[_Candidate] = []
        for candidate in sorted(candidates, key=lambda c: (-c.score, -c.index, -c.order)):
            cost = COUNTER.count(candidate.line) + 1
            if used + cost <= target:
                chosen.append(candidate)
                used += cost
        chosen.sort(key=lambda c: (c.index, c.order))
        text = "\n".join([*kept_items, *(c.line for c in chosen)])
        while chosen and COUNTER.count(text) > target:
            weakest = min(chosen, key=lambda c: (c.score, c.index, c.order))
            chosen.remove(weakest)
            text = "\n".join([*kept_items, *(c.line for c in chosen)])
        return text


def _ref_drop_stale(candidates: list[_Candidate]) -> list[_Candidate]:
    latest: dict[str, _Candidate] = {}
    current: dict[str, tuple[str, str]] = {}
    stating = [c for c in candidates if c.slots]
    for candidate in sorted(stating, key=lambda c: (c.index, c.order)):
        slots = candidate.slots
        for at in range(0, len(slots), 3):
            latest[slots[at]] = candidate
            current[slots[at]] = (slots[at + 1], slots[at + 2])
    current_keys = {key for key, _ in current.values()}
    stale: dict[str, str] = {}
    for candidate in candidates:
        slots = candidate.slots
        for at in range(0, len(slots), 3):
            if slots[at + 1] != current[slots[at]][0]:
                stale[slots[at + 2]] = slots[at]
        for wrong in candidate.wrong:
            stale.setdefault(wrong, "")
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
    for candidate in candidates:
        slots = candidate.slots
        if slots:
            stated = range(0, len(slots), 3)
            if any(slots[at + 1] != current[slots[at]][0] for at in stated):
                continue
            if any(latest[slots[at]] is candidate for at in stated):
                kept.append(candidate)
            continue
        body = _body_of(candidate.line) if candidate.body is None else candidate.body
        if not candidate.wrong and probes and _mentions_stale(body, *probes):
            continue
        kept.append(candidate)
    return kept


def _ref_add_recency(candidates: list[_Candidate]) -> None:
    indexes = sorted({c.index for c in candidates})
    if not indexes:
        return
    rank = {index: position for position, index in enumerate(indexes)}
    top = max(len(indexes) - 1, 1)
    for candidate in candidates:
        candidate.score += _RECENCY * rank[candidate.index] / top


# -- whole passes, record by record ---------------------------------------------------------


def _service(clock: FakeClock, summarizer: ExtractiveSummarizer) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_detect=False,
        index_turns=False,
        auto_summarize=False,
        summary_policy=STEADY,
        summarizer=summarizer,
    )


async def _records(
    summarizer: ExtractiveSummarizer, turns: list[tuple[str, Any]], redact: set[int]
) -> list[str]:
    """Each pass's summary and structured records, as a pass every 14 turns wrote them."""
    clock = FakeClock()
    memory = _service(clock, summarizer)
    return await pass_records(memory, turns, after_each(redact))


def _conversation_turns(seed: int, count: int) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    conversation = generate_conversation(seed, turns=count, facts=24, corrections=8)
    turns: list[tuple[str, Any]] = [(t.role, list(t.content)) for t in conversation.turns]
    return turns, dict(conversation.known_titles)


async def test_passes_of_a_generated_conversation_write_what_they_wrote() -> None:
    """Facts, corrections, tool calls with large results, and redacted turns: every pass's
    records are those the reference summarizer's passes write."""
    turns, titles = _conversation_turns(7, 400)
    redact = {33, 120, 121, 250}
    new = await _records(ExtractiveSummarizer(COUNTER, known_titles=titles), turns, redact)
    ref = await _records(RefSummarizer(COUNTER, known_titles=titles), turns, redact)
    assert len(new) > 20
    assert new == ref


async def test_passes_of_repeated_messages_write_what_they_wrote() -> None:
    """The bench's messages, said again and again (the same sentences at new indexes:
    their counts come from kept parts)."""
    turns = [
        ("user" if i % 2 == 0 else "assistant", BENCH_MESSAGES[i % len(BENCH_MESSAGES)])
        for i in range(300)
    ]
    new = await _records(ExtractiveSummarizer(COUNTER), turns, set())
    ref = await _records(RefSummarizer(COUNTER), turns, set())
    assert len(new) > 15
    assert new == ref


# -- random calls ---------------------------------------------------------------------------


def _turns_of(seed: int) -> tuple[list[Turn], dict[str, str]]:
    conversation = generate_conversation(seed, turns=240, facts=24, corrections=8)
    return list(conversation.indexed()), dict(conversation.known_titles)


def _random_prior(rng: random.Random, earlier: list[str]) -> str | None:
    lines: list[str] = []
    if earlier and rng.random() < 0.8:
        lines += rng.choice(earlier).splitlines()
    extra = [
        "budget: ¥8,000",
        "- budget: ¥5,000",
        "preference:favorite_genre: seinen",
        "- Also: the user wants vol 3",
        "an unindexed line from an LLM",
        "- [007] User: I'll take vol 4, not vol 3.",
        "",
        "   ",
        "- [3] Result of search_books: Berserk vol 42 is ¥990.",
    ]
    lines += rng.sample(extra, rng.randrange(0, 4))
    if rng.random() < 0.2:
        rng.shuffle(lines)
    return "\n".join(lines) if lines or rng.random() < 0.5 else None


def test_random_calls_summarize_as_before() -> None:
    """Random spans (sometimes with the same turn objects again, sometimes equal copies),
    random priors (earlier outputs, carried slot lines, unindexed lines), targets and
    ``must_keep`` items, one summarizer warmed by every call before: the same text as the
    reference each time."""
    rng = random.Random(8)
    for seed in (3, 5):
        turns, titles = _turns_of(seed)
        new = ExtractiveSummarizer(COUNTER, known_titles=titles)
        ref = RefSummarizer(COUNTER, known_titles=titles)
        spans: list[list[Turn]] = []
        outputs: list[str] = []
        for _ in range(150):
            if spans and rng.random() < 0.4:
                span = rng.choice(spans)  # the same turn objects: a kept span
                if rng.random() < 0.3:
                    span = [t.model_copy() for t in span]  # equal, not the same: not kept
            else:
                first = rng.randrange(0, len(turns) - 1)
                span = turns[first : first + rng.randrange(1, 40)]
                spans.append(span)
            prior = _random_prior(rng, outputs)
            target = rng.choice([16, 40, 120, 300, 500, 700, 2_000])
            must_keep = rng.sample(["budget: ¥8,000", "vol 42", "  ", "the user's postcode"], 2)
            must_keep = must_keep if rng.random() < 0.3 else []
            got = new.summarize_sync(span, prior=prior, target_tokens=target, must_keep=must_keep)
            want = ref.summarize_sync(span, prior=prior, target_tokens=target, must_keep=must_keep)
            assert got == want, (seed, target, prior)
            outputs.append(got)


def test_a_redacted_or_changed_turn_is_read_afresh() -> None:
    """A span whose turn was redacted (a new turn object with the same index) is not taken
    for the kept span of its earlier objects."""
    turns, titles = _turns_of(4)
    new = ExtractiveSummarizer(COUNTER, known_titles=titles)
    ref = RefSummarizer(COUNTER, known_titles=titles)
    span = turns[20:40]
    first = new.summarize_sync(span, target_tokens=700)
    assert first == ref.summarize_sync(span, target_tokens=700)
    redacted = [t.model_copy(update={"redacted": True}) if t.role == "user" else t for t in span]
    got = new.summarize_sync(redacted, target_tokens=700)
    assert got == ref.summarize_sync(redacted, target_tokens=700)
    assert got != first


def test_a_summarizer_shared_by_threads_summarizes_as_before() -> None:
    """Threads sharing one summarizer (its kept spans and priors change under them, past
    their bounds) each get the reference's text."""
    turns, titles = _turns_of(9)
    shared = ExtractiveSummarizer(COUNTER, known_titles=titles)
    ref = RefSummarizer(COUNTER, known_titles=titles)
    rng = random.Random(9)
    calls = []
    for _ in range(60):
        first = rng.randrange(0, len(turns) - 1)
        span = turns[first : first + rng.randrange(1, 30)]
        prior = ref.summarize_sync(turns[max(0, first - 20) : first + 1], target_tokens=300)
        calls.append((span, prior, rng.choice([120, 500, 700])))
    want = [ref.summarize_sync(s, prior=p, target_tokens=t) for s, p, t in calls]

    def run(offset: int) -> list[str]:
        order = calls[offset:] + calls[:offset]
        got = [shared.summarize_sync(s, prior=p, target_tokens=t) for s, p, t in order]
        return got[len(calls) - offset :] + got[: len(calls) - offset]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, [0, 15, 30, 45]))
    assert all(result == want for result in results)
