"""The command line answers bad input with an error line and exit 1, never a traceback
(session 14's audit). Before: ``export -o`` into a missing directory and ``import`` of a
file that is not UTF-8 printed a traceback (FileNotFoundError, UnicodeDecodeError), and
``recall USER ''`` exited 0 with "nothing recalled"."""

from __future__ import annotations

import json
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


def _turn(index: int, text: str) -> bytes:
    return json.dumps(
        {
            "type": "turn",
            "session_id": "s-9",
            "index": index,
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "timestamp": f"2026-01-01T00:00:0{index}+00:00",
        }
    ).encode()


def _refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    # Rich wraps long lines (a path may break anywhere): compare without whitespace.
    assert "".join(message.split()) in "".join(result.output.split()), result.output


def test_export_to_a_missing_directory_is_an_error_line(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "out.jsonl"
    _refused(
        ["export", "--user", "u-1", "-o", str(target)],
        f"error: cannot write {target}: No such file or directory",
    )


def test_recall_with_an_empty_query_is_an_error() -> None:
    _refused(["recall", "u-1", "  "], "error: the query is empty")


def test_a_line_that_is_not_utf8_is_named_and_the_lines_before_it_are_imported(
    tmp_path: Path,
) -> None:
    session = json.dumps(
        {
            "type": "session",
            "session_id": "s-9",
            "user_id": "u-9",
            "created_at": "2026-01-01T00:00:00+00:00",
        }
    ).encode()
    path = tmp_path / "latin1.jsonl"
    latin1 = _turn(1, "cafe latte").replace(b"cafe", b"caf\xe9")  # é in Latin-1
    path.write_bytes(b"\n".join([session, _turn(0, "first"), latin1]) + b"\n")
    _refused(["import", str(path)], "line 3: not UTF-8 text (byte")
    shown = runner.invoke(app, ["inspect", "s-9"])
    assert shown.exit_code == 0, shown.output
    assert "first" in shown.output
