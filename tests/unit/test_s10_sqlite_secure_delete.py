"""Every SQLite connection of the backend turns secure_delete on, so erasure holds on builds
whose default is off. This machine's build defaults to on, so the test simulates a build
that does not: a wrapped ``sqlite3.connect`` turns it off before the backend sees the
connection (a real part cannot give us the other build)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tiermem.store.backends.sqlite import _open


@pytest.fixture
def off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.execute("PRAGMA secure_delete = OFF")
        return conn

    monkeypatch.setattr(_open.sqlite3, "connect", connect)


@pytest.mark.usefixtures("off_by_default")
def test_the_worker_connection_turns_secure_delete_on(tmp_path: Path) -> None:
    conn = _open.open_worker_connection(str(tmp_path / "a.db"), timedelta(seconds=1), "NORMAL")
    try:
        assert conn.execute("PRAGMA secure_delete").fetchone() == (1,)
    finally:
        conn.close()


@pytest.mark.usefixtures("off_by_default")
def test_the_direct_connection_turns_secure_delete_on(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    _open.open_worker_connection(path, timedelta(seconds=1), "NORMAL").close()
    conn = _open.open_direct_connection(path, "NORMAL")
    try:
        assert conn.execute("PRAGMA secure_delete").fetchone() == (1,)
    finally:
        conn.close()
