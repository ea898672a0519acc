"""analyse_turn: every engine over one reading of a turn; large turns off the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.extraction import (
    LARGE_TURN_CHARS,
    RuleEntityExtractor,
    analyse_turn,
    analyse_turn_async,
    is_large_turn,
)
from tiermem.longterm.detect import RuleMemoryDetector
from tiermem.longterm.text import doc_terms
from tiermem.models import DocumentBlock, Entity, TextBlock, ToolResultBlock
from tiermem.policies.importance import RuleImportanceScorer
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
ENGINES: dict[str, Any] = {
    "tokens": COUNTER,
    "entities": RuleEntityExtractor(),
    "importance": RuleImportanceScorer(),
    "detector": RuleMemoryDetector(),
}


def paste(chars: int) -> str:
    return "the weather was nice and we walked to the shop. " * (chars // 49)


def test_a_turn_is_counted_scored_extracted_and_detected() -> None:
    blocks = (TextBlock(text="I prefer seinen. Is Berserk vol 42 in stock?"),)
    found = analyse_turn("user", blocks, **ENGINES, index_terms=True)
    assert found.token_count == COUNTER.count_blocks(blocks)
    assert found.entities == (
        Entity(kind="genre", value="seinen"),
        Entity(kind="volume", value="42"),
    )
    assert found.importance is not None
    assert found.importance.reason == "preference"
    assert [(d.key, d.value) for d in found.drafts] == [("favorite_genre", "seinen")]
    assert found.terms == doc_terms(blocks[0].text)


def test_assistant_turns_and_turns_without_text_detect_nothing() -> None:
    said = analyse_turn("assistant", (TextBlock(text="I prefer seinen"),), **ENGINES)
    assert said.drafts == ()
    result = ToolResultBlock(tool_use_id="t", content=(TextBlock(text="I prefer seinen"),))
    assert analyse_turn("user", (result,), **ENGINES).drafts == ()


def test_without_a_scorer_or_detector_those_steps_are_skipped() -> None:
    blocks = (TextBlock(text="I prefer seinen"),)
    found = analyse_turn(
        "user", blocks, tokens=COUNTER, entities=ENGINES["entities"], importance=None
    )
    assert found.importance is None
    assert found.drafts == ()
    assert found.terms is None


@pytest.mark.parametrize(("role", "blocks"), [("system", ("x",)), ("user", ())])
def test_bad_turns_are_refused(role: str, blocks: tuple[str, ...]) -> None:
    content = tuple(TextBlock(text=b) for b in blocks)
    with pytest.raises(ValidationError):
        analyse_turn(role, content, **ENGINES)


def test_a_200_kb_turn_is_counted_exactly_but_read_by_rules_at_its_ends() -> None:
    text = "I prefer seinen. " + paste(200_000) + "\nIs vol 42 in stock? Order ORD-12345."
    middle = len(text) // 2
    text = text[:middle] + " Actually I love horror, ISBN 978-4-08-851234-1. " + text[middle:]
    blocks = (TextBlock(text=text),)
    found = analyse_turn("user", blocks, **ENGINES)
    assert found.text.truncated
    assert found.token_count == COUNTER.count_blocks(blocks)  # the budget: never capped
    kinds = {e.kind for e in found.entities}
    assert {"genre", "volume", "order_id"} <= kinds
    assert "isbn" not in kinds  # the middle of the paste is not read
    assert [d.key for d in found.drafts] == ["favorite_genre"]


def test_large_turns_are_found_by_text_and_inline_documents() -> None:
    assert not is_large_turn((TextBlock(text="x" * LARGE_TURN_CHARS),))
    assert is_large_turn((TextBlock(text="x" * (LARGE_TURN_CHARS + 1)),))
    document = DocumentBlock(format="txt", name="notes", data=b"x" * (LARGE_TURN_CHARS + 1))
    inside = ToolResultBlock(tool_use_id="t", content=(document,))
    assert is_large_turn((inside,))


class ThreadRecordingCounter:
    """A token counter that records which thread counted."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def count(self, text: str) -> int:
        self.threads.append(threading.get_ident())
        return COUNTER.count(text)

    def count_blocks(self, blocks: Sequence[Any]) -> int:
        self.threads.append(threading.get_ident())
        return COUNTER.count_blocks(blocks)

    def count_message(self, message: Any) -> int:
        return COUNTER.count_message(message)


async def test_large_turns_are_analysed_off_the_event_loop() -> None:
    counter = ThreadRecordingCounter()
    engines = {**ENGINES, "tokens": counter}
    loop_thread = threading.get_ident()
    small = await analyse_turn_async("user", (TextBlock(text="I prefer seinen"),), **engines)
    large_text = "I prefer seinen. " + paste(LARGE_TURN_CHARS * 2)
    large = await analyse_turn_async("user", (TextBlock(text=large_text),), **engines)
    assert counter.threads[0] == loop_thread
    assert counter.threads[1] != loop_thread
    assert small.drafts == large.drafts
    # The loop is free while a large turn is analysed: other tasks run meanwhile.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    await analyse_turn_async("user", (TextBlock(text=paste(200_000)),), **engines)
    ticker.cancel()
    assert ticks > before + 1
