"""Every ``tiermem`` command through typer's CliRunner on an embedded SQLite file, and one run
as a real process (``python -m tiermem``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiermem.interfaces.cli import app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock

runner = CliRunner()
T0 = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    db = tmp_path / "cli.db"
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "memory")
    monkeypatch.setenv("TIERMEM_DURABLE_BACKEND", "sqlite")
    monkeypatch.setenv("TIERMEM_SQLITE_PATH", str(db))
    monkeypatch.setenv("TIERMEM_API_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("TIERMEM_LLM", "none")
    monkeypatch.setenv("TIERMEM_HOT_WINDOW", "4")
    monkeypatch.setenv("COLUMNS", "220")
    return db


def invoke(*args: str, input: str | None = None) -> str:
    result = runner.invoke(app, list(args), input=input)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def fails(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 1, result.output
    return result.output


def seed(db: Path, *, tenant: str = "local", turns: int = 6) -> None:
    async def main() -> None:
        memory = MemoryService.from_settings(TierMemSettings(sqlite_path=db, hot_window=4))
        try:
            session = await memory.session(f"{tenant}:s-1", user_id=f"{tenant}:u-1")
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                text = "I prefer seinen. Do you have Berserk vol 42?" if i == 0 else f"turn {i}"
                await session.add_turn(role, text, timestamp=T0 + timedelta(minutes=i))
            await memory.drain()
        finally:
            await memory.aclose()

    asyncio.run(main())


def test_chat_offline_uses_memory_and_tools() -> None:
    out = invoke(
        "chat",
        "--user",
        "u-1",
        "--session",
        "s-chat",
        input="I prefer seinen. Do you have Berserk vol 42?\nwhat is 15*37?\n"
        "/remember format=paperback\n/calc 2^^3\n/tools\n/quit\n",
    )
    assert "no LLM configured" in out
    assert "offline extractive responder" in out
    assert "[calculator] 15*37 = 555" in out
    assert "seinen" in out  # recalled from what turn 0 said
    assert "remembered format: paperback" in out
    assert "expected a number or '('" in out  # a typo is shown, not sent to the tool
    assert "calculator" in out
    assert "closed" in out
    assert "6 turns added to session s-chat" in out
    assert "local:" not in out  # the tenant's store ids are never shown
    shown = invoke("inspect", "s-chat")
    assert "what is 15*37?" in shown
    assert "genre" in shown
    assert "seinen" in shown
    recalled = invoke("recall", "u-1", "paperback", "--json")
    hits = json.loads(recalled)
    assert hits[0]["text"] == "format: paperback"


def test_inspect_shows_hot_and_archived_turns_entities_and_records(embedded: Path) -> None:
    seed(embedded)
    out = invoke("inspect", "s-1")
    assert "hot turns (4 of 6; 2 archived only)" in out
    assert "turn 5" in out
    assert "turn 1" not in out
    assert "volume" in out
    assert "42" in out
    assert "metadata" in out
    assert "entities" in out
    assert "turn_count" in out


def test_inspect_of_another_tenant_or_unknown_session_fails(embedded: Path) -> None:
    seed(embedded, tenant="acme")
    assert "does not exist" in fails("inspect", "s-1")  # tenant local has no s-1
    assert "hot turns" in invoke("inspect", "s-1", "--tenant", "acme")
    assert "hot turns" in invoke("inspect", "acme:s-1", "--no-tenant")


def test_recall_lists_hits_with_provenance(embedded: Path) -> None:
    seed(embedded)
    out = invoke("recall", "u-1", "seinen", "--turns")
    assert "prefers seinen" in out
    assert "s-1 turn 0" in out
    assert "nothing recalled" in invoke("recall", "u-1", "seinen", "--tenant", "other")


def test_export_import_round_trip_keeps_timestamps_and_indexes(
    embedded: Path, tmp_path: Path
) -> None:
    seed(embedded)
    path = tmp_path / "u1.jsonl"
    invoke("export", "--user", "u-1", "-o", str(path))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    turns = [r for r in records if r["type"] == "turn"]
    assert [t["index"] for t in turns] == list(range(6))
    assert [datetime.fromisoformat(t["timestamp"]) for t in turns] == [
        T0 + timedelta(minutes=i) for i in range(6)
    ]
    out = invoke("import", str(path), "--tenant", "beta")
    assert "6 turns added, 0 already present" in out
    copy = tmp_path / "copy.jsonl"
    invoke("export", "--session", "s-1", "--tenant", "beta", "-o", str(copy))
    copied = [json.loads(line) for line in copy.read_text().splitlines()]
    assert [r for r in copied if r["type"] == "turn"] == turns
    again = invoke("import", str(path), "--tenant", "beta")
    assert "0 turns added, 6 already present" in again
    assert "0 memories added" in again


def test_export_to_stdout_is_clean_jsonl(embedded: Path) -> None:
    seed(embedded)
    result = runner.invoke(app, ["export", "--session", "s-1"])
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert [json.loads(line)["type"] for line in lines] == ["session"] + ["turn"] * 6


def test_export_needs_something_to_export() -> None:
    assert "name at least one --session or --user" in fails("export")


def test_import_of_a_bad_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    session = {"type": "session", "session_id": "s", "user_id": "u", "created_at": T0.isoformat()}
    path.write_text(json.dumps(session) + "\n{broken\n")
    assert "line 2: not JSON" in fails("import", str(path))


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    out = invoke("keys", "create", "acme", "--label", "ci")
    key = next(line for line in out.splitlines() if line.startswith("tm_"))
    store = KeyStore(tmp_path / "keys.json")
    tenant = store.verify(key)
    assert tenant is not None
    assert tenant.id == "acme"
    key_id = tenant.key_id
    assert key_id is not None
    listed = invoke("keys", "list")
    assert key_id in listed
    assert "active" in listed
    assert key not in listed
    invoke("keys", "revoke", key_id)
    assert store.verify(key) is None
    assert "revoked" in invoke("keys", "list")
    assert "no API key with id" in fails("keys", "revoke", "0000000000000000")
    assert "not valid" in fails("keys", "create", "Not A Tenant")


def test_servers_refuse_to_bind_beyond_localhost_without_keys() -> None:
    everywhere = "0.0.0.0"  # noqa: S104 -- the bind that must be refused
    assert "refusing to listen on 0.0.0.0" in fails("serve", "--host", everywhere, "--port", "1")
    out = fails("mcp", "--http", "--host", everywhere, "--port", "1")
    assert "refusing to listen on 0.0.0.0" in out


def test_sweep_hands_off_expired_sessions(monkeypatch: pytest.MonkeyPatch, embedded: Path) -> None:
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "sqlite")  # the hot tier must outlive a process

    async def old_session() -> None:
        clock = FakeClock(datetime.now(UTC) - timedelta(hours=3))
        memory = MemoryService.from_settings(
            TierMemSettings(hot_backend="sqlite", sqlite_path=embedded), clock=clock
        )
        try:
            session = await memory.session("s-old", user_id="u-1")
            await session.add_turn("user", "hello from three hours ago")
        finally:
            await memory.aclose()

    asyncio.run(old_session())
    out = invoke("sweep")
    assert "expired: s-old (1 turns)" in out
    assert "1 sessions handed off" in out
    assert "0 sessions handed off" in invoke("sweep", "--loop", "--rounds", "2", "--interval", "0")


def test_a_real_process_imports_and_exports(embedded: Path, tmp_path: Path) -> None:
    seed(embedded)
    path = tmp_path / "out.jsonl"
    env = {**os.environ, "TIERMEM_SQLITE_PATH": str(embedded), "TIERMEM_HOT_BACKEND": "memory"}
    done = subprocess.run(  # noqa: S603 -- our own interpreter and module
        [sys.executable, "-m", "tiermem", "export", "--user", "u-1", "-o", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr
    other = {**env, "TIERMEM_SQLITE_PATH": str(tmp_path / "other.db")}
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "tiermem", "import", str(path)],
        env=other,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "6 turns added" in done.stdout
