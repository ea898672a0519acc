"""Review of session 15 (R2): the view optimization (4d4cc2e, on by default) leaves a
pinned turn as it is. It knew nothing of pins: a pinned failed result whose call
succeeded later was dropped from the window, and a pinned large output seen and
superseded became a reference, though a pinned turn is one the caller wants sent as
stored. Now such a window is offered unoptimized. Fails on 5545a32.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tiermem.context.optimize import VIEW_POLICY, optimize_view
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock, Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.tokens import TiktokenCounter

NOW = datetime(2026, 11, 24, tzinfo=UTC)


def _turns(*, pinned: bool) -> list[Turn]:
    def turn(index: int, role: str, *blocks: object, pin: bool = False) -> Turn:
        return Turn.model_validate(
            {"role": role, "content": blocks, "timestamp": NOW, "index": index, "pinned": pin}
        )

    def call(tool_id: str) -> ToolUseBlock:
        return ToolUseBlock(tool_use_id=tool_id, name="stock", input={"q": "berserk 3"})

    def result(tool_id: str, status: str, text: str) -> ToolResultBlock:
        return ToolResultBlock(tool_use_id=tool_id, status=status, content=(TextBlock(text=text),))

    return [
        turn(0, "user", TextBlock(text="Is Berserk vol 3 in stock?")),
        turn(1, "assistant", call("a")),
        turn(2, "user", result("a", "error", "warehouse 7 offline: ticket W-7781"), pin=pinned),
        turn(3, "assistant", call("b")),
        turn(4, "user", result("b", "success", "3 in stock")),
        turn(5, "assistant", TextBlock(text="Yes, 3 are in stock.")),
    ]


def test_a_pinned_failure_stays_and_an_unpinned_one_goes() -> None:
    counter = TiktokenCounter()
    plain, report = optimize_view(_turns(pinned=False), VIEW_POLICY, counter)
    assert [t.index for t in plain] == [0, 3, 4, 5]  # passed before too
    assert report.dropped_turn_indexes == (1, 2)
    pinned = _turns(pinned=True)
    kept, report = optimize_view(pinned, VIEW_POLICY, counter)
    assert list(kept) == pinned
    assert report.tokens_saved == 0
    assert report.actions == {}


async def test_a_pinned_turn_reaches_the_window_through_session_context() -> None:
    memory = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory")
    )
    async with memory:
        session = await memory.session(user_id="u-pin")
        for turn in _turns(pinned=True):
            await session.add_turn(turn.role, list(turn.content), pinned=turn.pinned)
        window = await session.context(budget=4000)
        shown = [i.provenance.turn_indexes for i in window.items if i.kind == "turn"]
        assert (2,) in shown
        assert "ticket W-7781" in str(window.model_dump())
