"""A redaction whose summary reset fails still takes the turn out of the recall index.

``Session.redact_turn`` redacts the archive, resets the session's summary records, then
removes the turn from the recall index. When the reset raised (a ``ConflictError``: the
records kept changing, "redact again"), the index kept the turn's words until the caller
redacted again. The index is now cleaned whatever the reset does.

The failure is injected (a real store cannot be made to fail exactly there): the summary
reset raises. Everything else is the embedded deployment, and the check is a raw scan of
its SQLite file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.store_scan import scan_sqlite
from tiermem.errors import ConflictError
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

SECRET = "zqv6630unindex"


async def test_the_index_forgets_the_turn_when_the_summary_reset_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "t.db"
    async with MemoryService.from_settings(
        TierMemSettings(sqlite_path=db), auto_summarize=False, auto_detect=False
    ) as memory:
        session = await memory.session(user_id="u-unindex")
        card = await session.add_turn("user", f"my card number is {SECRET}")
        await session.add_turn("assistant", "Thanks.")
        await memory.drain()
        assert scan_sqlite(db, [SECRET]), "the scan must see the turn before"

        async def conflict(*args: object, **kwargs: object) -> None:
            raise ConflictError("summary records kept changing; redact again")

        monkeypatch.setattr(memory.summaries, "redacted", conflict)
        with pytest.raises(ConflictError):
            await session.redact_turn(card.index)
        await memory.drain()
        assert scan_sqlite(db, [SECRET]) == []
