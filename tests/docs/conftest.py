"""The docs tests' fixture: a fresh directory with the embedded default settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh directory with the embedded default settings, as the working directory."""
    for name in list(os.environ):
        if name.startswith("TIERMEM_") and not name.startswith(("TIERMEM_TEST", "TIERMEM_REQ")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TIERMEM_SQLITE_PATH", str(tmp_path / "tiermem.db"))
    monkeypatch.setenv("TIERMEM_API_KEYS_FILE", str(tmp_path / "api_keys.json"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return tmp_path
