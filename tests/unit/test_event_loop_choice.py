"""The event loop of what tiermem runs itself (tiermem.runtime): uvloop wherever it is
installed (the test environment installs it, through the api and mcp extras), asyncio's
when asked for or when uvloop is missing, and a clear error when uvloop is required and
missing. Also: the test lane runs on the loop it names (scripts/test.sh's uvloop lane)."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
from pathlib import Path

import pytest
import uvloop

from tiermem.errors import ValidationError
from tiermem.interfaces import cli_common
from tiermem.runtime import loop_factory, resolve_event_loop, run
from tiermem.settings import TierMemSettings
from tiermem.sync import SyncMemory

MEMORY = TierMemSettings(hot_backend="memory", durable_backend="memory")


def _kind(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"


async def _running_kind() -> str:
    return _kind(asyncio.get_running_loop())


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop not importable. A fake: the suite's environment has uvloop installed, and a
    None entry in sys.modules is how an import fails as it would without the package."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_auto_takes_uvloop_when_it_is_installed() -> None:
    assert resolve_event_loop() == "uvloop"
    assert resolve_event_loop("uvloop") == "uvloop"
    assert run(_running_kind()) == "uvloop"
    loop = loop_factory("auto")()
    try:
        assert _kind(loop) == "uvloop"
    finally:
        loop.close()


def test_asyncio_is_taken_when_asked_for() -> None:
    assert resolve_event_loop("asyncio") == "asyncio"
    assert run(_running_kind(), event_loop="asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_without_uvloop(without_uvloop: None) -> None:
    assert resolve_event_loop("auto") == "asyncio"
    assert run(_running_kind()) == "asyncio"


def test_uvloop_required_but_missing_is_a_clear_error(without_uvloop: None) -> None:
    coro = _running_kind()
    with pytest.raises(ValidationError, match=r"uvloop cannot be imported.*EVENT_LOOP=asyncio"):
        run(coro, event_loop="uvloop")
    assert (
        inspect.getcoroutinestate(coro) == "CORO_CLOSED"
    )  # not left for the collector to warn about


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(ValidationError, match="'auto', 'asyncio' or 'uvloop'"):
        resolve_event_loop("trio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="event_loop"):
        TierMemSettings(event_loop="trio")


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_EVENT_LOOP", "asyncio")
    assert TierMemSettings().event_loop == "asyncio"
    assert cli_common.run(_running_kind()) == "asyncio"  # the CLI's commands follow it
    monkeypatch.delenv("TIERMEM_EVENT_LOOP")
    assert cli_common.run(_running_kind()) == "uvloop"


@pytest.mark.parametrize("choice", ["auto", "asyncio"])
def test_sync_memory_runs_its_service_on_the_chosen_loop(choice: str) -> None:
    settings = MEMORY.model_copy(update={"event_loop": choice})
    with SyncMemory.from_settings(settings) as memory:
        assert _kind(memory.loop) == ("uvloop" if choice == "auto" else "asyncio")
        session = memory.session(user_id="u-loop")
        session.add_turn("user", "I prefer seinen")
        assert [t.text for t in session.history()] == ["I prefer seinen"]


def test_sync_memory_without_uvloop_when_required_fails_before_starting_a_thread(
    without_uvloop: None,
) -> None:
    built: list[int] = []

    def factory() -> object:
        built.append(1)
        raise AssertionError("not reached")

    threads = threading.active_count()
    with pytest.raises(ValidationError, match="uvloop"):
        SyncMemory(factory, event_loop="uvloop")  # type: ignore[arg-type]
    assert built == []
    assert threading.active_count() == threads  # no portal thread left behind


@pytest.mark.parametrize(("choice", "expected"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_the_rest_server_runs_on_the_chosen_loop(
    choice: str, expected: str, tmp_path: Path
) -> None:
    from tiermem.interfaces.api.app import create_app
    from tiermem.interfaces.api.server import build_server, http_protocol

    settings = MEMORY.model_copy(update={"api_keys_file": tmp_path / "keys.json"})
    server = build_server(create_app(settings), "127.0.0.1", 0, event_loop=choice)  # type: ignore[arg-type]
    assert server.config.loop == expected
    # the parser whose head bound tests/api/test_http_head_limit.py checks
    assert server.config.http is http_protocol()


async def test_the_lane_runs_on_the_loop_it_names() -> None:
    """scripts/test.sh runs a lane with TIERMEM_TEST_LOOP=uvloop: its async tests must run on
    uvloop, or the lane tests nothing the main run does not."""
    assert await _running_kind() == os.environ.get("TIERMEM_TEST_LOOP", "asyncio")


def test_the_asyncio_choice_ignores_a_global_uvloop_policy() -> None:
    """After ``uvloop.install()`` (or an old uvicorn's ``loop="uvloop"``), the global policy
    makes uvloop loops: ``asyncio`` still means the standard library's own loop."""
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        assert run(_running_kind(), event_loop="asyncio") == "asyncio"
    finally:
        asyncio.set_event_loop_policy(previous)


@pytest.mark.parametrize(("choice", "expected"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_the_rest_client_facade_runs_on_the_chosen_loop(choice: str, expected: str) -> None:
    from tiermem.client import TierMemClient

    with TierMemClient("http://127.0.0.1:9", event_loop=choice) as client:  # type: ignore[arg-type]
        assert _kind(client._portal.loop) == expected


@pytest.mark.parametrize(("choice", "expected"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_tiermem_serve_runs_uvicorn_on_the_settings_loop(
    choice: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_server`` (``tiermem serve``) hands the setting to uvicorn: the server's
    ``run`` is replaced by a probe that records the loop uvicorn was configured with."""
    import uvicorn

    from tiermem.interfaces.api.server import run_server

    seen: list[str] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: seen.append(self.config.loop))
    monkeypatch.setattr("tiermem.interfaces.api.server.freeze_startup_heap", lambda: 0)
    settings = MEMORY.model_copy(
        update={"event_loop": choice, "api_keys_file": tmp_path / "keys.json"}
    )
    run_server(settings, "127.0.0.1", 0)
    assert seen == [expected]


@pytest.mark.parametrize("http", [False, True])
@pytest.mark.parametrize(("choice", "expected"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_tiermem_mcp_runs_on_the_settings_loop(
    http: bool, choice: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_stdio`` and ``run_http`` (``tiermem mcp [--http]``) start anyio on the loop the
    setting picks: anyio's ``run`` is replaced by a probe that makes a loop with the
    factory it was given (and runs nothing)."""
    from tiermem.interfaces import mcp_http, mcp_server

    seen: list[str] = []

    def probe(main: object, *, backend_options: dict[str, object]) -> None:
        factory = backend_options["loop_factory"]
        loop = factory()  # type: ignore[operator]
        try:
            seen.append(_kind(loop))
        finally:
            loop.close()

    module = mcp_http if http else mcp_server
    monkeypatch.setattr(module.anyio, "run", probe)
    settings = MEMORY.model_copy(
        update={"event_loop": choice, "api_keys_file": tmp_path / "keys.json"}
    )
    if http:
        mcp_http.run_http(settings)
    else:
        mcp_server.run_stdio(settings)
    assert seen == [expected]
