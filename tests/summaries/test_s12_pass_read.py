"""Session 12's cheaper reading of a pass's new turns (issue #8) makes the rows it made.

The change: the offline summarizer reads a new turn's text block with one lookup of its
kept lines (``Lru.held``, then ``Lru.put`` of what it made, where ``_text_lines`` looked it
up, then asked ``Lru.get`` to look again and compute it through a partial), makes the
text's key once (``_read_lines`` made it again), and makes no line prefix for a block
without a candidate line. The reader as it was (``_read_turns``, ``_text_lines`` and
``_read_lines``) is kept here as the reference; generated turns (hypothesis: text blocks of
sentences with values, long and Unicode texts, tool calls and results, redacted turns) are
read by both, fresh and again as new objects, and whole passes of a generated conversation
and of repeated messages are compared byte for byte."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.summaries.pass_records import pass_records
from tiermem.clock import FakeClock
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.models.turns import Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import SummaryPolicy
from tiermem.summaries._candidates import (
    _FIELDS,
    _ROLE_WEIGHT,
    _TOOL_CALL,
    _LineFields,
    _Row,
    _score,
)
from tiermem.summaries._lru import INLINE_KEY, Lru, text_key
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
AT = datetime(2026, 1, 1, tzinfo=UTC)


class _Reference(ExtractiveSummarizer):
    """The reader as it was before session 12 (verbatim)."""

    def _read_turns(self, turns: Sequence[Turn], out: list[_Row]) -> None:
        tool_names: dict[str, str] = {}
        for turn in turns:
            if turn.redacted:
                continue
            who = "User" if turn.role == "user" else "Assistant"
            for block in turn.content:
                if isinstance(block, TextBlock):
                    fields = self._ref_text_lines(turn.index, turn.role, who, block.text)
                    if fields:
                        out += [
                            fields[at : at + _FIELDS]  # type: ignore[misc]
                            for at in range(0, len(fields), _FIELDS)
                        ]
                elif isinstance(block, ToolUseBlock):
                    tool_names[block.tool_use_id] = block.name
                    args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
                    line = f"- [{turn.index}] Assistant called {block.name}({self._cut(args)})"
                    out.append((turn.index, line, _TOOL_CALL, (), (), None, None, None))
                elif isinstance(block, ToolResultBlock):
                    name = tool_names.get(block.tool_use_id, "a tool")
                    failed = " (failed)" if block.status == "error" else ""
                    label = f"Result of {name}{failed}"
                    salient = self._reader.read_salient(
                        text_of(block.content), role="assistant", limit=self._max_results
                    )
                    for reading in salient:
                        score = _score(reading, _ROLE_WEIGHT["tool"])
                        out.append(self._candidate(turn.index, label, reading, score))

    def _ref_text_lines(self, index: int, role: str, who: str, text: str) -> _LineFields:
        key = (index, role, text if len(text) <= INLINE_KEY else text_key(text))
        held = self._text_cache.held(key)
        if held is not None:
            return held
        return self._text_cache.get(key, partial(self._ref_read_lines, index, role, who, text))

    def _ref_read_lines(self, index: int, role: str, who: str, text: str) -> _LineFields:
        key = (role, who, text if len(text) <= INLINE_KEY else text_key(text))
        said = self._said.held(key)
        if said is None:
            said = self._said.get(key, partial(self._said_lines, role, who, text))
        out: list[int | str | float | tuple[str, ...] | None] = []
        digits = str(index)
        prefix = self._prefix_tokens(digits, who) if self._additive and digits.isdigit() else None
        fields = iter(said)
        for score, slots, wrong, body, body_cost, change in zip(
            fields, fields, fields, fields, fields, fields, strict=True
        ):
            line = f"- [{digits}] {who}: {body}"
            if prefix is None or body_cost is None or change is None:
                cost = self._indexed_tokens(line, digits, who, body)
                joined = self._newline_tokens(line)
            else:
                cost = prefix + body_cost
                joined = cost + change
            out += (index, line, score, slots, wrong, body, cost, joined)
        return tuple(out)


# -- generated turns -----------------------------------------------------------------------

_WORDS = [
    "budget", "¥8,000", "¥5,000", "Berserk", "vol", "42", "ORD-12345", "seinen", "horror",
    "é", "ß", "İ", "ﬁ", "日本語", "ベルセルク", "😀", "\u0301", "\u200b", "\t", "\n", "x" * 300,
    "...", "!?", "$", "actually", "not", "my", "is", "name", "I", "prefer", "want", "42巻",
    "Tokyo", "March 3", "2026-05-01", "Alice", "decided", "need", "to", "remember",
]  # fmt: skip

_sentence = st.builds(
    lambda words, end: " ".join(words) + end,
    st.lists(st.sampled_from(_WORDS), min_size=0, max_size=14),
    st.sampled_from([".", "!", "?", "。", "", " …", ")"]),
)
_text = st.lists(_sentence, min_size=1, max_size=6).map(" ".join)


@st.composite
def _turn_specs(draw: st.DrawFn) -> list[tuple[int, Any, list[Any], bool]]:
    """``(index, role, content, redacted)`` of consecutive turns."""
    first = draw(st.sampled_from([0, 7, 99, 999, 1000, 123_456]))
    out = []
    for index in range(first, first + draw(st.integers(1, 12))):
        role = draw(st.sampled_from(["user", "assistant"]))
        content: list[Any] = [TextBlock(text=t) for t in draw(st.lists(_text, max_size=3))]
        if role == "assistant" and draw(st.booleans()):
            call = f"t{index}"
            content.append(ToolUseBlock(tool_use_id=call, name="search", input={"q": draw(_text)}))
            content.append(
                ToolResultBlock(
                    tool_use_id=call,
                    content=(TextBlock(text=draw(_text)),),
                    status=draw(st.sampled_from(["success", "error"])),
                )
            )
        if not content:
            content = [TextBlock(text=draw(_text))]
        out.append((index, role, content, draw(st.booleans()) and draw(st.booleans())))
    return out


def _turns(specs: list[tuple[int, str, list[Any], bool]]) -> list[Turn]:
    return [
        Turn(timestamp=AT, index=index, role=role, content=tuple(content), redacted=redacted)
        for index, role, content, redacted in specs
    ]


def _rows(summarizer: ExtractiveSummarizer, turns: Sequence[Turn]) -> list[_Row]:
    out: list[_Row] = []
    summarizer._read_turns(turns, out)
    return out


_SHARED = ExtractiveSummarizer(COUNTER)
_SHARED_REF = _Reference(COUNTER)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_turn_specs(), st.integers(1, 400))
def test_new_turns_are_read_into_the_rows_they_were(
    specs: list[tuple[int, str, list[Any], bool]], cut: int
) -> None:
    """Fresh summarizers (any cut), and warm ones shared by every example (texts said
    again at other indexes): the same rows, in the same order, read first and again as
    new turn objects (the kept lines) and by a whole summary."""
    turns = _turns(specs)
    fresh, fresh_ref = (
        ExtractiveSummarizer(COUNTER, max_sentence_chars=cut),
        _Reference(COUNTER, max_sentence_chars=cut),
    )
    assert _rows(fresh, turns) == _rows(fresh_ref, turns)
    assert _rows(_SHARED, turns) == _rows(_SHARED_REF, turns)
    again = _turns(specs)  # other objects: the kept text blocks, not the kept span
    assert _rows(_SHARED, again) == _rows(_SHARED_REF, again)
    assert fresh.summarize_sync(again, target_tokens=cut) == fresh_ref.summarize_sync(
        again, target_tokens=cut
    )


def test_a_block_without_candidates_is_kept_as_no_lines() -> None:
    """ "ok thanks" has no candidate line: kept (a second read is a hit), as ``()``."""
    summarizer = ExtractiveSummarizer(COUNTER)
    turn = Turn(timestamp=AT, index=5, role="user", content=(TextBlock(text="ok thanks"),))
    assert _rows(summarizer, [turn]) == []
    assert summarizer._text_cache.held((5, "user", "ok thanks")) == ()
    assert summarizer._text_cache.misses == 1


def test_a_long_text_block_is_keyed_by_its_digest_once() -> None:
    """A text past ``INLINE_KEY`` characters is kept under its digest, and found again by a
    copy of the turn (another object, the same text)."""
    summarizer = ExtractiveSummarizer(COUNTER)
    text = "My budget is ¥8,000. " * 40
    turn = Turn(timestamp=AT, index=3, role="user", content=(TextBlock(text=text),))
    first = _rows(summarizer, [turn])
    assert first
    assert summarizer._text_cache.held((3, "user", text_key(text))) is not None
    again = _rows(summarizer, [turn.model_copy()])
    assert again == first
    assert summarizer._text_cache.misses == 1


# -- the LRU's put --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.text(max_size=12)), max_size=80))
def test_put_keeps_what_a_missing_get_keeps(ops: list[tuple[int, str]]) -> None:
    """``held`` then ``put`` on a miss leaves the same entries, order and weight as
    ``get`` computing it, within both bounds."""
    by_get: Lru[int, str] = Lru(8, max_chars=40, weigh=len)
    by_put: Lru[int, str] = Lru(8, max_chars=40, weigh=len)
    for key, value in ops:
        got = by_get.get(key, lambda value=value: value)  # type: ignore[misc]
        held = by_put.held(key)
        if held is None:
            by_put.put(key, value)
            held = value
        assert held == got
        assert list(by_put._data.items()) == list(by_get._data.items())
        assert by_put._weight == by_get._weight <= 40
        assert len(by_put) <= 8
    assert (by_put.hits, by_put.misses) == (by_get.hits, by_get.misses)


# -- whole passes ---------------------------------------------------------------------------


async def _records(turns: list[tuple[str, Any]], summarizer: ExtractiveSummarizer) -> list[str]:
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
        summary_policy=SummaryPolicy(validate=True),
        summarizer=summarizer,
    )
    return await pass_records(memory, turns, {90: 80})


async def test_passes_of_a_generated_conversation_write_what_they_wrote() -> None:
    """Facts, corrections, tool calls with large results and a redacted turn."""
    conversation = generate_conversation(41, turns=260, facts=24, corrections=8)
    turns: list[tuple[str, Any]] = [(t.role, list(t.content)) for t in conversation.turns]
    titles = dict(conversation.known_titles)
    ref = await _records(turns, _Reference(COUNTER, known_titles=titles))
    new = await _records(turns, ExtractiveSummarizer(COUNTER, known_titles=titles))
    assert len(new) > 15
    assert new == ref


async def test_passes_of_repeated_messages_write_what_they_wrote() -> None:
    """The bench's messages said again and again: every new block's lines are made from
    kept index-free lines."""
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
        ("user" if i % 2 == 0 else "assistant", messages[i % len(messages)]) for i in range(240)
    ]
    ref = await _records(turns, _Reference(COUNTER))
    new = await _records(turns, ExtractiveSummarizer(COUNTER))
    assert len(new) > 10
    assert new == ref
