"""``tiermem demo``: the three-day story through every tier, its printed numbers (computed on
the run: checked here against the store itself), the base install (no API extra imported
without ``--serve``; a clear message with it), and ``--serve`` leaving a server you can
query and stop."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.interfaces.processes import embedded_env, free_port, start_tiermem, stop
from tiermem.interfaces.cli import app
from tiermem.interfaces.cli_demo import DEMO_SESSIONS, DEMO_USER, RECALL_CHECKS, run_story
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

runner = CliRunner()


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    db = tmp_path / "demo.db"
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "memory")
    monkeypatch.setenv("TIERMEM_DURABLE_BACKEND", "sqlite")
    monkeypatch.setenv("TIERMEM_SQLITE_PATH", str(db))
    monkeypatch.setenv("TIERMEM_API_KEYS_FILE", str(tmp_path / "keys.json"))
    return db


async def test_the_story_goes_through_every_tier(tmp_path: Path) -> None:
    settings = TierMemSettings(sqlite_path=tmp_path / "t.db", hot_window=15)
    async with MemoryService.from_settings(settings) as memory:
        result = await run_story(memory)
        day1, day2, day3 = result.sessions
        # Hot window and archive: the long day keeps its newest turns hot, the rest archived.
        assert day1.hot_turns == 15
        assert day1.archived_turns == day1.turns - 15 > 0
        # Rolling summaries and structured memory, read back from the store.
        user = f"local:{DEMO_USER}"
        stored = await memory.session(f"local:{DEMO_SESSIONS[0]}", user_id=user)
        summaries = await stored.summaries()
        assert day1.summary_tiers == {t.tier.value: t.tokens for t in summaries.tiers if t.text}
        assert day1.summary_tiers
        assert day1.summarized_through == summaries.watermarks.summarized_through >= 0
        assert 0 < result.facts_current <= result.facts_planted
        assert day1.reload_source == "reload"  # the hot tier was lost and reloaded
        # Handoff: closed sessions are in long-term memory, with provenance to their turns.
        memories = {content: where for _, content, where in result.memories}
        assert memories["prefers seinen"].startswith("demo-day1 #")
        assert "interaction_summary" in {kind for kind, _, _ in result.memories}
        # Recall in the later session: every fact stated on days 1 and 2 reached day 3's
        # context, from outside day 3's own turns.
        assert result.recalled == dict.fromkeys(RECALL_CHECKS, True)
        assert "recall" in result.context_by_kind
        # The full history, recounted from the store, against day 3's window.
        history = 0
        for name in DEMO_SESSIONS:
            session = await memory.session(f"local:{name}", user_id=user)
            history += sum(t.token_count for t in await session.get_turns(0, None))
        assert result.history_tokens == history
        assert 0 < result.context_tokens < history
        assert result.savings == pytest.approx(1 - result.context_tokens / history)
        assert day2.turns > 0
        assert day3.turns > 0
        # Written as tenant "local" (what the API and inspector serve), not raw ids.
        assert len(await memory.list_sessions(user)) == 3
        assert await memory.list_sessions(DEMO_USER) == []
        assert {(name, calls) for name, _, calls in result.tools} == {
            ("search_catalog", 1),
            ("order_status", 1),
        }


def test_the_cli_prints_the_measured_numbers(embedded: Path) -> None:
    result = runner.invoke(app, ["demo"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.stdout
    out = result.stdout
    found = re.search(
        r"day 3's context \(budget [\d,]+\): ([\d,]+) tokens .*? instead of ([\d,]+) for the "
        r"full history of the three sessions: (\d+)% saved",
        " ".join(out.split()),
    )
    assert found, out
    context, history, saved = (int(g.replace(",", "")) for g in found.groups())
    assert 0 < context < history
    assert saved == round(100 * (1 - context / history))
    assert out.count("✓") == len(RECALL_CHECKS)
    assert "✗" not in out
    assert "served by reload" in " ".join(out.split())
    for name in DEMO_SESSIONS:
        assert name in out
    # What it printed is what the store holds, through the tenant the API serves.
    shown = runner.invoke(app, ["recall", DEMO_USER, "horror"], env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.stdout
    assert "dislikes horror" in shown.stdout


def test_a_rerun_replaces_the_story(embedded: Path) -> None:
    assert runner.invoke(app, ["demo"]).exit_code == 0
    again = runner.invoke(app, ["demo"])
    assert again.exit_code == 0, again.stdout
    listed = runner.invoke(app, ["export", "--user", DEMO_USER])
    assert listed.exit_code == 0, listed.stdout
    sessions = [line for line in listed.stdout.splitlines() if '"session"' in line]
    assert len(sessions) == 3, listed.stdout[:2000]


BLOCK_API = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoApiExtra(importlib.abc.MetaPathFinder):
        # The base install: the 'api' extra's packages are not there.
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoApiExtra())
    sys.argv = ["tiermem", *sys.argv[1:]]
    from tiermem.interfaces.cli import main
    main()
    """
)


def run_without_api(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 -- our own interpreter
        [sys.executable, "-c", BLOCK_API, *args],
        env={**embedded_env(tmp_path), "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_demo_needs_no_extra(tmp_path: Path) -> None:
    done = run_without_api(tmp_path, "demo")
    assert done.returncode == 0, done.stderr
    assert "saved" in done.stdout


def test_serve_without_the_api_extra_says_how_to_install_it(tmp_path: Path) -> None:
    done = run_without_api(tmp_path, "demo", "--serve")
    assert done.returncode == 1
    assert "pip install 'tiermem[api]'" in done.stderr


def test_serve_leaves_the_api_and_inspector_running(tmp_path: Path) -> None:
    port = free_port()
    process = start_tiermem(["demo", "--serve", "--port", str(port)], port, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base) as client:  # keyless: local mode on loopback
            sessions = client.get(f"/inspector/api/users/{DEMO_USER}/sessions").json()
            assert {s["session_id"] for s in sessions["sessions"]} == set(DEMO_SESSIONS)
            hits = client.get(f"/inspector/api/users/{DEMO_USER}/recall", params={"q": "horror"})
            assert any("horror" in h["text"] for h in hits.json()["hits"])
            page = client.get("/inspector/")
            assert page.status_code == 200
            assert "tiermem inspector" in page.text
        log = (tmp_path / "server.log").read_text()
        assert f"{base}/inspector/?user={DEMO_USER}" in log
    finally:
        stop(process)
    assert process.returncode is not None
