"""Session 11's cheaper summary pass (issue #8) writes exactly what the pass wrote before.

The change: the offline summarizer keeps the candidate rows of a prior and a kept span of
turns with their ranking (``ExtractiveSummarizer._ranking``), since a pass's middle tier and
the next pass's ancient tier rank the same prior and span (with other targets), and so do a
tier's first build and its validation retry. The summarizer as it was (``summarize_sync``
and ``_fit`` ranking every call) is kept here as the reference; whole passes of long
sessions and direct calls over generated, long and Unicode texts are run with both and
compared byte for byte."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tests.summaries.pass_records import after_each, pass_records
from tiermem.clock import FakeClock
from tiermem.models.content import TextBlock
from tiermem.models.turns import Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import SummaryPolicy, offline
from tiermem.summaries._candidates import _IDX, _LINE_AT, _RECENCY, _SCORE, _TOPIC, _drop_stale
from tiermem.summaries._candidates import _Row as Row
from tiermem.summaries._lru import INLINE_KEY, text_key
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
AT = datetime(2026, 1, 1, tzinfo=UTC)
STEADY = SummaryPolicy(validate=True)


class _Reference(ExtractiveSummarizer):
    """The summarizer as it was before session 11: every call ranks its rows."""

    def summarize_sync(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        rows = self._carried(prior or "")
        self._from_turns(turns, rows)
        if not any(row[_SCORE] > _TOPIC for row in rows):
            rows += self._topics(turns)
        kept = _drop_stale(rows)
        kept_items = [f"- {item.strip()}" for item in must_keep if item.strip()]
        return self._ref_fit(kept_items, rows, kept, target_tokens)

    def _ref_fit(self, kept_items: list[str], rows: list[Row], kept: list[int], target: int) -> str:
        used = sum(self._line_tokens(line) for line in kept_items)
        indexes = sorted({rows[at][_IDX] for at in kept})
        top = max(len(indexes) - 1, 1)
        recency = {index: _RECENCY * position / top for position, index in enumerate(indexes)}
        ranked: list[tuple[float, int, int]] = []
        rank = ranked.append
        for at in kept:
            row = rows[at]
            index = row[_IDX]
            rank((-(row[_SCORE] + recency[index]), -index, -at))
        ranked.sort()
        chosen: list[tuple[int, int]] = []
        held = self._line_counts.held
        for _, _, order in ranked:
            row = rows[-order]
            cost = row[6]
            if cost is None:
                line = row[_LINE_AT]
                cost = held(line if len(line) <= INLINE_KEY else text_key(line))
                if cost is None:
                    cost = self._line_tokens(line)
            if used + cost <= target:
                chosen.append((row[_IDX], -order))
                used += cost
        chosen.sort()
        picked = [rows[at] for _, at in chosen]
        lines = [*kept_items, *(row[_LINE_AT] for row in picked)]
        text = "\n".join(lines)
        while chosen and self._joined_tokens(lines, text, picked, dashed=True) > target:
            scores = {-order: -score for score, _, order in ranked}
            weakest = min(chosen, key=lambda pair: (scores[pair[1]], pair[0], pair[1]))
            chosen.remove(weakest)
            picked = [rows[at] for _, at in chosen]
            lines = [*kept_items, *(row[_LINE_AT] for row in picked)]
            text = "\n".join(lines)
        return text


# -- whole passes ---------------------------------------------------------------------------


async def _records(
    turns: list[tuple[str, Any]], redact: set[int], summarizer: ExtractiveSummarizer
) -> list[str]:
    """Each pass's summary and structured records, as a pass every 14 turns wrote them."""
    clock = FakeClock()
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        tokens=COUNTER,
        auto_detect=False,
        index_turns=False,
        auto_summarize=False,
        summary_policy=STEADY,
        summarizer=summarizer,
    )
    return await pass_records(memory, turns, after_each(redact))


async def test_passes_of_a_long_generated_session_write_what_they_wrote() -> None:
    """Facts, corrections (retries and stale lines), tool calls with large results and
    redacted turns, over three generated conversations in one session."""
    turns: list[tuple[str, Any]] = []
    titles: dict[str, str] = {}
    for seed in range(31, 34):
        conversation = generate_conversation(seed, turns=250, facts=24, corrections=8)
        turns += [(t.role, list(t.content)) for t in conversation.turns]
        titles.update(conversation.known_titles)
    redact = {33, 120, 121, 400, 610}
    ref = await _records(turns, redact, _Reference(COUNTER, known_titles=titles))
    summarizer = ExtractiveSummarizer(COUNTER, known_titles=titles)
    new = await _records(turns, redact, summarizer)
    assert len(new) > 45
    retried = [json.loads(row)[0]["quality"]["retried_tiers"] for row in new]
    assert any(retried)  # validation retries were exercised
    assert new == ref


async def test_passes_of_repeated_messages_write_what_they_wrote() -> None:
    """The bench's messages, said again and again: the kept rankings are used."""
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
    ref = await _records(turns, {40}, _Reference(COUNTER))
    summarizer = ExtractiveSummarizer(COUNTER)
    used = 0
    ranking = summarizer._ranking

    def counting(turns: Sequence[Turn], prior: str) -> Any:
        nonlocal used
        before = dict(summarizer._rankings)
        out = ranking(turns, prior)
        used += any(out[1] is kept[2] for kept in before.values())
        return out

    summarizer._ranking = counting  # type: ignore[method-assign]
    new = await _records(turns, {40}, summarizer)
    assert len(new) > 15
    assert used > 10  # most passes' ancient tier is the previous middle tier's ranking
    assert new == ref


# -- direct calls ---------------------------------------------------------------------------

_WORDS = [
    "budget", "¥8,000", "Berserk", "vol", "42", "ORD-12345", "seinen", "é", "ß", "ǅ", "İ",
    "ﬁ", "日本語", "ベルセルク", "😀", "👩‍👩‍👧", "\u0301", "\u200b", "\t", "x" * 300, "...",
    "!?", "$", "actually", "not", "my", "is", "name", "I", "prefer", "want", "42巻",
]  # fmt: skip


def _text(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 6)):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 14))]
        sentences.append(" ".join(words) + rng.choice([".", "!", "?", "。", "", " …"]))
    return " ".join(sentences)


def _turns(rng: random.Random, first: int, count: int) -> list[Turn]:
    return [
        Turn(
            session_id="s-1",
            timestamp=AT,
            index=index,
            role="user" if rng.random() < 0.5 else "assistant",
            content=(TextBlock(text=_text(rng)),),
        )
        for index in range(first, first + count)
    ]


def test_rolling_calls_summarize_as_before() -> None:
    """The three calls of each pass as the rolling builder makes them (the ancient tier
    ranks the previous middle tier's prior and span again), with must_keep retries, on
    random long and Unicode texts: the same text as the reference, call for call."""
    for seed in range(12):
        rng = random.Random(seed)
        new, ref = ExtractiveSummarizer(COUNTER), _Reference(COUNTER)
        spans: list[list[Turn]] = []
        ancient = ""
        first = 0
        for _ in range(8):
            span = _turns(rng, first, rng.randint(1, 20))
            first += len(span)
            spans.append(span)
            calls: list[tuple[list[Turn], str, int]] = []
            if len(spans) >= 3:
                calls.append((spans[-3], ancient, 300))
            if len(spans) >= 2:
                calls.append((spans[-2], "", 500))
            calls.append((spans[-1], "", 700))
            texts = []
            prior = ancient
            for turns, own, target in calls:
                use = own if own else prior
                keep = [_text(rng)] if rng.random() < 0.3 else []
                target = rng.choice([target, 16, 40])
                got = new.summarize_sync(turns, prior=use, target_tokens=target, must_keep=keep)
                want = ref.summarize_sync(turns, prior=use, target_tokens=target, must_keep=keep)
                assert got == want
                if keep:  # a validation retry ranks the same rows again
                    got = new.summarize_sync(turns, prior=use, target_tokens=target)
                    assert got == ref.summarize_sync(turns, prior=use, target_tokens=target)
                texts.append(got)
                prior = got
            ancient = texts[0] if len(texts) >= 2 else ""
        assert len(new._rankings) <= offline.RANKINGS


def test_a_kept_ranking_is_not_taken_for_other_turns() -> None:
    """The same span key (first index, length) and prior with other turns (a redacted or
    edited turn is a new object) ranks the new turns."""
    summarizer = ExtractiveSummarizer(COUNTER)
    said = [
        Turn(
            session_id="s",
            timestamp=AT,
            index=i,
            role="user",
            content=(TextBlock(text=f"My budget is ¥{i}000."),),
        )
        for i in range(1, 5)
    ]
    first = summarizer.summarize_sync(said, prior="", target_tokens=300)
    edited = [
        *said[:3],
        said[3].model_copy(update={"content": (TextBlock(text="I want Berserk vol 7."),)}),
    ]
    second = summarizer.summarize_sync(edited, prior="", target_tokens=300)
    assert second == _Reference(COUNTER).summarize_sync(edited, prior="", target_tokens=300)
    assert second != first


def test_spans_without_candidates_do_not_share_a_ranking() -> None:
    """Two spans whose turns give no candidate row (a redacted turn; a turn that only says
    its topic) have equal rows (none): each is ranked for its own turns."""
    summarizer = ExtractiveSummarizer(COUNTER)
    [said] = [
        Turn(session_id="s", timestamp=AT, index=0, role="user", content=(TextBlock(text="Hi."),))
    ]
    assert summarizer.summarize_sync([said], target_tokens=100) == "- [0] User: Hi."
    assert summarizer.summarize_sync([said.redact()], target_tokens=100) == ""
    assert summarizer.summarize_sync([said], target_tokens=100) == "- [0] User: Hi."
