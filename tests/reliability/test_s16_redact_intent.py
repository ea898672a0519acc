"""Redacting a turn removes its intent too.

An intent is a label an application (or a classifier) derived from the turn's words
("cancel_order", "report_fraud"): it says what the turn was about, so it goes with the
content. Before, ``Turn.redact`` kept it, and the redacted turn's intent stayed in the hot
window and the archive (and became a topic of the summary rebuilt after the redaction).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.store_scan import scan_sqlite
from tiermem.models.turns import Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

INTENT = "report_fraud_zqv4410"


def test_a_redacted_turn_has_no_intent() -> None:
    turn = Turn.model_validate(
        {
            "index": 3,
            "role": "user",
            "content": [{"type": "text", "text": "someone used my card"}],
            "timestamp": "2030-01-01T00:00:00Z",
            "intent": INTENT,
            "agent_name": "support",
        }
    )
    redacted = turn.redact()
    assert redacted.intent is None
    assert redacted.redacted
    assert redacted.text != turn.text
    assert (redacted.index, redacted.role, redacted.agent_name) == (3, "user", "support")


@pytest.mark.parametrize("durable", ["memory", "sqlite"])
async def test_redaction_leaves_the_intent_nowhere(durable: str, tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    settings = (
        TierMemSettings(sqlite_path=db)
        if durable == "sqlite"
        else TierMemSettings(durable_backend="memory")
    )
    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(user_id="u-intent")
        await session.add_turn("user", "hello")
        flagged = await session.add_turn("user", "someone used my card", intent=INTENT)
        await session.add_turn("assistant", "I'm sorry to hear that.")
        await memory.drain()
        assert (await session.get_turn(flagged.index)).intent == INTENT
        if durable == "sqlite":
            assert scan_sqlite(db, [INTENT]), "the scan must see the intent before"
        await session.redact_turn(flagged.index)
        await memory.drain()
        assert (await session.get_turn(flagged.index)).intent is None
        assert all(t.intent != INTENT for t in await session.history())
        if durable == "sqlite":
            assert scan_sqlite(db, [INTENT]) == []
