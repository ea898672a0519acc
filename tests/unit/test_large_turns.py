"""A large turn is analysed off the event loop when added through the service (issue #7,
item 6); a small one stays on it (a thread hop would cost more than the work)."""

from __future__ import annotations

import threading
from typing import Any

from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.extraction.turn_analysis import LARGE_TURN_CHARS
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock


class _RecordingExtractor(RuleEntityExtractor):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def extract(self, text: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().extract(text)


async def test_large_turns_are_analysed_in_a_worker_thread() -> None:
    clock = FakeClock()
    extractor = _RecordingExtractor()
    async with MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        entities=extractor,
    ) as memory:
        session = await memory.session("s", user_id="u")
        await session.add_turn("user", "Is Berserk vol 42 in stock?")
        pasted = "The order ORD-55512 shipped. " * (2 * LARGE_TURN_CHARS // 29)
        big = await session.add_turn("user", pasted)
    main = threading.main_thread().name
    assert extractor.threads[0] == main
    assert extractor.threads[1] != main
    assert big.token_count > 1000
    assert any(e.value == "ORD-55512" for e in big.entities)


async def test_a_turn_is_normalised_once_for_every_engine(monkeypatch: Any) -> None:
    """Entities, importance, indexing and detection all read the analysis' TurnText."""
    from tiermem.policies import turn_text

    built: list[str] = []
    original = turn_text.TurnText._build.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, text: str, said_text: str) -> Any:
        built.append(text[:20])
        return original(cls, text, said_text)

    monkeypatch.setattr(turn_text.TurnText, "_build", classmethod(counting))
    clock = FakeClock()
    async with MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock
    ) as memory:
        session = await memory.session("s", user_id="u")
        middle = "nothing to see here. " * (LARGE_TURN_CHARS // 10)
        pasted = f"I prefer seinen. {middle} The word zanzibar hides in the middle. {middle}"
        await session.add_turn("user", pasted)
        await memory.drain()
        assert len(built) == 1
        hits = await memory.longterm.recall("u", "zanzibar", scope=("turn",))
        assert [h.provenance.turn_indexes for h in hits] == [(0,)]
        prefs = await memory.longterm.preferences("u")
        assert prefs
