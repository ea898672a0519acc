"""``tiermem serve``'s function: it refuses to listen beyond localhost without keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tiermem.errors import ValidationError
from tiermem.interfaces.api import run_server
from tiermem.interfaces.tenancy import KeyStore
from tiermem.settings import TierMemSettings

ALL_INTERFACES = "0.0.0.0"  # noqa: S104 -- refusing to bind it is what is tested


@pytest.mark.parametrize("host", [ALL_INTERFACES, "::", "192.0.2.1", "example.internal"])
def test_serve_refuses_to_listen_beyond_localhost_without_keys(tmp_path: Path, host: str) -> None:
    settings = TierMemSettings(sqlite_path=tmp_path / "t.db", api_keys_file=tmp_path / "keys.json")
    with pytest.raises(ValidationError, match=f"refusing to listen on {re.escape(host)}"):
        run_server(settings, host, 0)
    # A revoked key is no key.
    key_id, _ = KeyStore(tmp_path / "keys.json").create("acme")
    KeyStore(tmp_path / "keys.json").revoke(key_id)
    with pytest.raises(ValidationError, match="no active key"):
        run_server(settings, host, 0)
    assert not (tmp_path / "t.db").exists()  # refused before anything was opened
