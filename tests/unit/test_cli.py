"""The tiermem command line: version, doctor, demo, and the wiring of every command (the
commands themselves are tested in tests/interfaces/test_cli_commands.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiermem.interfaces.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "memory")
    monkeypatch.setenv("TIERMEM_DURABLE_BACKEND", "sqlite")
    monkeypatch.setenv("TIERMEM_SQLITE_PATH", str(tmp_path / "cli.db"))


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.stdout.strip()[0].isdigit()


def test_doctor_passes_on_the_embedded_default(tmp_path: Path) -> None:
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.stdout
    assert "[ok  ] tokenizer" in result.stdout
    assert "[ok  ] hot (memory)" in result.stdout
    assert f"file {tmp_path / 'cli.db'}" in result.stdout
    assert "all checks passed" in result.stdout


def test_doctor_fails_clearly_when_redis_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "redis")
    monkeypatch.setenv("TIERMEM_REDIS_URL", "redis://127.0.0.1:9/0")  # nothing listens on 9
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert "[FAIL] hot (redis)" in result.stdout
    assert "is redis-server running" in result.stdout


def test_demo_runs() -> None:
    """Only the wiring; the story and its numbers are tested in tests/interfaces/test_demo.py."""
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.stdout
    assert "saved" in result.stdout


def test_every_command_is_wired() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in (
        "version",
        "doctor",
        "create-table",
        "demo",
        "serve",
        "mcp",
        "chat",
        "inspect",
        "recall",
        "import",
        "export",
        "sweep",
        "keys",
    ):
        assert f" {command} " in result.stdout, command
    keys = runner.invoke(app, ["keys", "--help"], env={"COLUMNS": "200"})
    for command in ("create", "revoke", "list"):
        assert f" {command} " in keys.stdout, command


def test_an_error_message_is_printed_as_text_not_markup() -> None:
    """An install hint names its extra in brackets; rich markup would swallow "[api]"."""
    import typer
    from typer.testing import CliRunner

    from tiermem.interfaces.cli_common import fail

    app = typer.Typer()

    @app.command()
    def broken() -> None:
        fail("the REST API needs the 'api' extra: pip install 'tiermem[api]'")

    result = CliRunner().invoke(app, [])
    assert result.exit_code == 1
    assert "pip install 'tiermem[api]'" in result.output
