"""The inspector as a person uses it: Playwright (Python) driving Debian's headless Chromium
(from apt -- scripts/test.sh installs it; never a browser Playwright downloads) against a real
server process, ``tiermem demo --serve`` (``tiermem serve`` with the demo's story loaded and
the store's tools registered, so every view has data). The keys file holds a key, so the
page refuses to show anything until the key is entered.

What the page shows is checked against the API's own JSON for the same session, so the test
fails if the page drops or garbles data, not only if it shows nothing. A screenshot is saved
as ``inspector.png`` in the test's tmp_path, and in ``$TIERMEM_TEST_ARTIFACTS`` when set.

Without chromium the test fails in CI (``TIERMEM_REQUIRE_BACKENDS=1``) and is skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_backends
from tests.interfaces.processes import free_port, start_tiermem, stop
from tiermem.interfaces.tenancy import KeyStore

pytestmark = pytest.mark.slow  # a server process and a browser

HOT_WINDOW = 12
"""Set on the server, so the hot/archived split the page shows is the server's setting."""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Debian's chromium is not installed (apt-get install chromium)"
        if require_backends():
            pytest.fail(message)
        pytest.skip(message)
    return found


def playwright_api() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        message = "playwright is not installed (pip install -e '.[dev]')"
        if require_backends():
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


def test_a_person_walks_the_demo_in_the_inspector(tmp_path: Path) -> None:
    browser_path = chromium()
    sync_playwright = playwright_api()
    _, key = KeyStore(tmp_path / "keys.json").create("local", label="browser test")
    port = free_port()
    process = start_tiermem(
        ["demo", "--serve", "--port", str(port)],
        port,
        tmp_path,
        TIERMEM_HOT_WINDOW=str(HOT_WINDOW),
        PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as api:
            day1 = api.get("/inspector/api/sessions/demo-day1").raise_for_status().json()
            context = api.get("/inspector/api/sessions/demo-day1/context").json()
            tools = api.get("/inspector/api/tools").raise_for_status().json()["tools"]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=browser_path,
                headless=True,
                args=["--no-sandbox", "--disable-gpu"],  # root in CI containers
            )
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                walk(page, base, key, day1, context, tools, tmp_path)
            finally:
                browser.close()
    finally:
        stop(process)


def walk(
    page: Any,
    base: str,
    key: str,
    day1: dict[str, Any],
    context: dict[str, Any],
    tools: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/inspector/")
    # Without the key nothing is shown: the server holds a key, so keyless is refused.
    page.fill("#user", "manga-fan")
    page.click("#who button[type=submit]")
    expect(page.locator("#status")).to_contain_text("401")
    assert page.locator("#session-list li").count() == 0
    # Enter the key; the user's sessions and memories load.
    page.fill("#key", key)
    page.click("#who button[type=submit]")
    expect(page.locator("#status")).to_contain_text("3 sessions")
    # Pick a session: its hot turns after its archived ones, as the server split them.
    page.click("#session-list li[data-session=demo-day1]")
    expect(page.locator("#session-title")).to_contain_text("demo-day1")
    hot = page.locator("#turns tr.hot")
    expect(hot).to_have_count(HOT_WINDOW)
    turns = day1["metadata"]["turn_count"]
    expect(page.locator("#turns tr.archived")).to_have_count(turns - HOT_WINDOW)
    assert hot.first.get_attribute("id") == f"turn-{turns - HOT_WINDOW}"
    # Summaries by tier, with the watermark.
    page.click("button[data-tab=summaries]")
    tiers = day1["summaries"]["tiers"]
    assert tiers, "the demo's long day-1 session has summaries"
    rows = page.locator("#summaries tbody tr")
    expect(rows).to_have_count(len(tiers))
    for i, tier in enumerate(tiers):
        expect(rows.nth(i)).to_contain_text(tier["tier"])
        expect(rows.nth(i)).to_contain_text(tier["text"][:40])
    through = day1["summaries"]["watermarks"]["summarized_through"]
    expect(page.locator("#watermarks")).to_contain_text(f"summarized through turn {through}")
    # Structured memory: every slot's latest value, superseded values shown as earlier.
    page.click("button[data-tab=structured]")
    structured = page.locator("#structured")
    slots = {**day1["structured"]["entities"], **day1["structured"]["facts"]}
    assert slots
    for fact in slots.values():
        expect(structured).to_contain_text(fact["value"])
        for old in fact["previous"]:
            expect(structured.locator("td.old", has_text=old)).not_to_have_count(0)
    # Active entities, state and tool health.
    page.click("button[data-tab=derived]")
    for entity in day1["entities"]:
        expect(page.locator("#entities")).to_contain_text(str(entity["value"]))
    expect(page.locator("#state")).to_contain_text("ORD-20417")
    for tool in tools:
        row = page.locator("#tools tbody tr", has_text=tool["name"])
        expect(row).to_contain_text(tool["breaker"])
        expect(row.locator("td.num").first).to_have_text(str(tool["calls"]))
    assert {t["name"] for t in tools} == {"search_catalog", "order_status"}
    # Context stats with the token-usage chart: the window against the full history.
    page.click("button[data-tab=context]")
    stats = context["stats"]
    summary = page.locator("#context-summary")
    expect(summary).to_contain_text(f"{stats['total_tokens']} of {stats['budget_tokens']} tokens")
    expect(summary).to_contain_text(f"full history is {context['history_tokens']} tokens")
    saved = re.search(r"(\d+)% saved", summary.inner_text())
    assert saved
    assert int(saved.group(1)) > 0
    bars = page.locator("#context-chart span")
    kinds = [k for k, v in stats["tokens_by_tier"].items() if v]
    expect(bars).to_have_count(len(kinds))
    context_width = page.locator("#context-chart").bounding_box()["width"]
    history_width = page.locator("#history-chart").bounding_box()["width"]
    assert 0 < context_width < history_width  # one scale: the saving is visible
    shoot(page, tmp_path, "inspector-context.png")
    # Memories with provenance links to their turns.
    memory_row = page.locator("#memories tbody tr", has_text="prefers seinen")
    link = memory_row.locator("a.prov")
    expect(link).to_have_text(re.compile(r"demo-day1 #\d+"))
    turn = int(link.inner_text().split("#")[1].split(",")[0])
    page.click("#session-list li[data-session=demo-day3]")
    expect(page.locator("#session-title")).to_contain_text("demo-day3")
    link.click()
    expect(page.locator("#session-title")).to_contain_text("demo-day1")
    target = page.locator(f"#turn-{turn}")
    expect(target).to_have_class(re.compile("flash"))
    expect(target).to_contain_text("I prefer seinen")
    # A recall search.
    page.fill("#recall-query", "horror")
    page.click("#recall-form button")
    hits = page.locator("#recall-hits li")
    expect(hits.first).to_contain_text("horror")
    shoot(page, tmp_path, "inspector.png")


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    """Save a full-page screenshot in tmp_path and, when set, $TIERMEM_TEST_ARTIFACTS."""
    places = [tmp_path]
    if os.environ.get("TIERMEM_TEST_ARTIFACTS"):
        places.append(Path(os.environ["TIERMEM_TEST_ARTIFACTS"]))
    for place in places:
        place.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(place / name), full_page=True)
        assert (place / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
