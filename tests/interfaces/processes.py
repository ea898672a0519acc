"""Real server processes on loopback ports for the interface tests (``python -m tiermem``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a server on an embedded SQLite file and keys file in ``tmp_path``."""
    return {
        **os.environ,
        "TIERMEM_SQLITE_PATH": str(tmp_path / "t.db"),
        "TIERMEM_HOT_BACKEND": "memory",
        "TIERMEM_DURABLE_BACKEND": "sqlite",
        "TIERMEM_API_KEYS_FILE": str(tmp_path / "keys.json"),
    }


def start_tiermem(
    args: list[str], port: int, tmp_path: Path, **env: str
) -> subprocess.Popen[bytes]:
    """Start ``python -m tiermem ARGS`` (with ``env`` added to the embedded environment) and
    wait (at most 90 s) until ``port`` accepts."""
    log = (tmp_path / "server.log").open("ab")
    process = subprocess.Popen(  # noqa: S603 -- our own interpreter and module
        [sys.executable, "-m", "tiermem", *args],
        env={**embedded_env(tmp_path), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError((tmp_path / "server.log").read_text())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"tiermem {' '.join(args)} did not listen within 90 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=20)
