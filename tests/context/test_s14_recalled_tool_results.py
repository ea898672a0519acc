"""A recalled tool result says what it is and as of when (session 14).

Seed 000's anti-pattern: "Storing tool results in long-term memory → stale product data
… re-fetch on next session". A stock level recalled two days later read like any turn
("[user, session s1, turn 3, …] in stock, 3 copies left"), an answer the model would give
as today's. Review probe p9.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tiermem.context.recall_block import hit_line
from tiermem.longterm.hits import RecallHit
from tiermem.models import TextBlock, ToolResultBlock, Turn

SAID = datetime(2026, 3, 10, 12, tzinfo=UTC)


def _hit(content: tuple[object, ...], text: str) -> RecallHit:
    turn = Turn(index=3, role="user", content=content, timestamp=SAID)  # type: ignore[arg-type]
    return RecallHit(kind="turn", doc_id="s1:3", text=text, score=1.0, turn=turn, session_id="s1")


def test_a_recalled_tool_result_is_labelled_and_dated() -> None:
    text = "Berserk vol 42: in stock, 3 copies left, ¥880"
    result = ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=text),))
    for in_session in (False, True):
        line = hit_line(_hit((result,), text), in_session=in_session)
        assert line.startswith("- [tool result, ")
        assert line.endswith("(data as of 2026-03-10; fetch it again before relying on it)")
        assert text in line


def test_a_users_own_turn_reads_as_before() -> None:
    text = "Is Berserk vol 42 in stock?"
    line = hit_line(_hit((TextBlock(text=text),), text), in_session=False)
    assert line == f"- [user, session s1, turn 3, 2026-03-10] {text}"
