"""The sync facade drives the async core from plain blocking code."""

from __future__ import annotations

from pathlib import Path

from tiermem.settings import TierMemSettings
from tiermem.sync import SyncMemory


def test_sync_facade_round_trip(tmp_path: Path) -> None:
    settings = TierMemSettings(
        hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "t.db"
    )
    with SyncMemory.from_settings(settings) as memory:
        session = memory.session("s-sync", user_id="u-1")
        turn = session.add_turn("user", "I prefer seinen")
        assert turn.index == 0
        assert [t.text for t in session.history()] == ["I prefer seinen"]
        assert session.id == "s-sync"
        assert [r.session_id for r in memory.list_sessions("u-1")] == ["s-sync"]
    # The data outlives the facade: it is in the SQLite file.
    with SyncMemory.from_settings(settings) as memory:
        again = memory.session("s-sync", user_id="u-1")
        assert [t.text for t in again.get_turns()] == ["I prefer seinen"]


def test_sync_facade_reaches_long_term_memory(tmp_path: Path) -> None:
    settings = TierMemSettings(hot_backend="memory", durable_backend="sqlite",
                               sqlite_path=tmp_path / "lt.db")
    with SyncMemory.from_settings(settings) as memory:
        record = memory.longterm.remember("u-1", "collects first editions", memory_type="fact")
        assert memory.longterm.get("u-1", record.memory_id) == record
