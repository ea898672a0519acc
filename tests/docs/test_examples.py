"""Every code example of README.md and docs/*.md runs as written (tests/docs/fences.py
reads the fences).

The rules, which the Markdown follows:

* A ```` ```python ```` block runs in a fresh temporary directory with the embedded default
  settings (``TIERMEM_SQLITE_PATH`` and ``TIERMEM_API_KEYS_FILE`` there, every other
  ``TIERMEM_*`` setting unset). Top-level ``await`` and ``async with`` are allowed: the
  block is compiled with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and awaited.
* A block whose info string is ```` ```python continues ```` continues the last block
  before it on the page that does not, as a reader pastes it at the end of that example:
  after its last statement, inside the ``async with``/``with`` it ends with (so ``memory``
  and ``session`` are still open). Each continuing block runs with that block alone, not
  after the other continuing blocks (the README's sections each continue "Use it"). Any
  other block is a program of its own.
* ```` ```python no-run <reason> ```` marks a block that cannot run here (a cloud service,
  a real key); it must still compile, and the reason is required.
* A block may read only the names its program binds, builtins, and the names of
  :data:`GIVEN`: what the reader brings (their tools, their document), with the value the
  test supplies. A name missing from both (a forgotten import) fails before anything runs.
* An example that talks to ``http://127.0.0.1:8080`` talks to a real API server (uvicorn,
  embedded default, a free loopback port) that the test starts, at that server's address.
* A bare expression statement (``turn.index, turn.importance  # 0, 0.9``) shows a value:
  :data:`SHOWN` holds what the page says it is, and the test asserts it; every shown
  expression needs an entry. :data:`AFTER` does the same for names an example leaves
  behind (``history  # the hot window, oldest first``).
* ```` ```json ```` blocks parse, and docs/jsonl.md's records import; a ``curl`` in a
  ```` ```bash ```` block gets a 2xx from the API app. Error examples (docs/api.md's JSON,
  docs/mcp.md's tool error) are what the API and the MCP tool answer.
* tests/docs/test_commands.py checks what the pages name beyond Python: ``tiermem ...``
  commands and their options, docs/jsonl.md's commands and docs/cli.md's chat transcript
  (run), repository paths, ``tiermem.*`` names and ``TIERMEM_*`` variables.

:data:`~tests.docs.fences.KNOWN_BROKEN` lists examples of pages other people are editing
that fail today; the tests assert they still fail, so whoever fixes one removes it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import shlex
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.docs.fences import (
    KNOWN_BROKEN,
    ROOT,
    SHOW,
    Fence,
    fences,
    flag_problem,
    free_names,
    pages,
    program,
    programs,
)
from tests.knowledge.files import make_pdf
from tiermem.models.turns import Entity
from tiermem.tools import FunctionInvoker, ToolRegistry, ToolSpec

SERVER = "http://127.0.0.1:8080"
"""The address the docs' client examples use; the test's server takes its place."""

GIVEN: dict[str, dict[str, str]] = {
    "README.md": {
        "registry": "the reader's tools (a ToolRegistry): here a `search` tool",
        "run": "the reader's code that runs a task step: here it returns the step's id",
        "tool_specs": "the reader's tool definitions for the model: here the `search` spec",
        "pdf_bytes": "the reader's PDF: here a one-page one",
    },
    "docs/api.md": {"key": "a key from `tiermem keys create`: here one of the test's server"},
}


def _given(page: str, key: str | None) -> dict[str, Any]:
    search = ToolSpec(
        "search",
        "Search the catalogue",
        {"type": "object", "properties": {"query": {"type": "string"}}},
    )

    async def catalogue(arguments: Any, emit: Any) -> str:
        return f"Berserk vol 42: in stock ({arguments['query']})"

    async def run(step: Any) -> Any:
        return {"ran": step.step_id}

    registry = ToolRegistry()
    registry.register(search, FunctionInvoker({"search": catalogue}))
    values: dict[str, Any] = {
        "registry": registry,
        "run": run,
        "tool_specs": [search],
        "pdf_bytes": make_pdf([["Returns are accepted within 30 days of delivery."]]),
        "key": key,
    }
    return {name: values[name] for name in GIVEN.get(page, {})}


SHOWN: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("README.md", "turn.index, turn.importance, turn.entities"): lambda v: (
        v == (0, 0.9, (Entity(kind="genre", value="seinen"), Entity(kind="volume", value="42")))
    ),
    ("README.md", "result.text, result.tool, result.degraded, result.agent_note"): lambda v: (
        v == ("Berserk vol 42: in stock (Berserk)", "search", False, None)
    ),
    ("README.md", "window.stats.total_tokens, window.prefix_fingerprint"): lambda v: (
        isinstance(v[0], int) and v[0] > 0 and isinstance(v[1], str) and len(v[1]) > 0
    ),
    ("docs/llm.md", "reply.data, reply.attempts"): lambda v: (
        v == ({"facts": ["prefers seinen"]}, 2)
    ),
}
"""What each shown expression of a page is, as the page states it (or, where it states
nothing, a sanity check of the value's shape)."""

AFTER: dict[tuple[str, str], Callable[[Any], bool]] = {
    # "the hot window, oldest first"; "any archived turn, by index"
    ("README.md", "history"): lambda turns: [t.index for t in turns] == [0],
    ("README.md", "old"): lambda turn: (turn.index, turn.text[:15]) == (0, "I prefer seinen"),
    # the memory just remembered is what "what does she collect?" finds
    ("README.md", "hits"): lambda hits: (
        [h.text for h in hits][:1] == ["collects first editions of Akira"]
    ),
    ("README.md", "block"): lambda block: "favorite_genre: seinen" in block.text,
    # "text + provenance": the state the coordinator was given, within the budget
    ("README.md", "ctx"): lambda ctx: (
        ("ORD-12345" in ctx.text and "track_order" in ctx.text and 0 < ctx.tokens <= 300)
        and bool(ctx.sources)
    ),
    ("README.md", "kwargs"): lambda kwargs: {"system", "messages", "tools"} <= set(kwargs),
    ("docs/api.md", "window"): lambda window: window.stats.total_turns == 1,
}
"""What an example's names hold when it ends, as its page (or its comments) says."""


def test_known_broken_entries_name_examples() -> None:
    wheres = {f.where for page in pages() for f in fences(page)}
    assert wheres >= KNOWN_BROKEN, KNOWN_BROKEN - wheres


# ---------------------------------------------------------------- Python blocks


def _all_programs() -> list[list[Fence]]:
    return [group for page in pages() for group in programs(page)]


def _id(group: list[Fence]) -> str:
    return group[-1].where


def test_python_fences_are_spelt_so_this_test_finds_them() -> None:
    problems = [flag_problem(f) for page in pages() for f in fences(page)]
    assert not [p for p in problems if p], problems


def test_no_run_blocks_compile() -> None:
    no_run = [f for p in pages() for f in fences(p) if f.lang == "python" and not f.runs]
    for fence in no_run:
        compile(fence.code, fence.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_there_are_examples_to_run() -> None:
    pages_run = [group[0].page for group in _all_programs()]
    assert pages_run.count("README.md") >= 3, pages_run
    assert {"docs/api.md", "docs/llm.md"} <= set(pages_run), pages_run
    no_run = [f.where for p in pages() for f in fences(p) if f.lang == "python" and not f.runs]
    assert no_run, "no `no-run` block: is the flag still read?"


@pytest.mark.parametrize("group", _all_programs(), ids=_id)
def test_an_example_reads_only_what_it_binds_or_is_given(group: list[Fence]) -> None:
    page = group[0].page
    free = free_names(program(group))
    given = set(GIVEN.get(page, {}))
    assert free <= given, (
        f"{_id(group)} reads {sorted(free - given)}, which no block of it binds: import or "
        "define them in the example (or, when the reader brings them, add them to GIVEN)"
    )
    used = {n for g in programs(page) for n in free_names(program(g))}
    assert given <= used, f"GIVEN[{page!r}] names {sorted(given - used)} no example reads"


@contextmanager
def _api_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real uvicorn server on a free loopback port, in a thread: (url, key)."""
    from tiermem.interfaces.api import create_app
    from tiermem.interfaces.api.server import build_server
    from tiermem.interfaces.tenancy import KeyStore
    from tiermem.settings import TierMemSettings

    keys = tmp_path / "server-keys.json"
    _, key = KeyStore(keys).create("acme")
    settings = TierMemSettings(sqlite_path=tmp_path / "server.db", api_keys_file=keys)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = build_server(create_app(settings), "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):  # up to 10 s to start
        if server.started:
            break
        thread.join(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", key
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


async def _run(group: list[Fence], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the program; what it showed (by expression) and its names afterwards."""
    page = group[0].page
    module = program(group)
    served = SERVER in ast.unparse(module)
    shown: dict[str, Any] = {}
    with _api_server(tmp_path) if served else _no_server() as (url, key):
        if served:
            module = _Readdress(url).visit(module)
        code = compile(module, str(ROOT / page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        namespace = {"__name__": "__example__", SHOW: shown.__setitem__, **_given(page, key)}
        result = eval(code, namespace)  # noqa: S307 -- the repository's own examples
        if inspect.iscoroutine(result):
            await asyncio.wait_for(result, timeout=60)
    return shown, namespace


@contextmanager
def _no_server() -> Iterator[tuple[str, str | None]]:
    yield "", None


class _Readdress(ast.NodeTransformer):
    def __init__(self, url: str) -> None:
        self.url = url

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and SERVER in node.value:
            return ast.copy_location(ast.Constant(node.value.replace(SERVER, self.url)), node)
        return node


@pytest.mark.parametrize("group", _all_programs(), ids=_id)
async def test_a_python_example_runs_and_shows_what_its_page_says(
    group: list[Fence], embedded: Path
) -> None:
    page = group[0].page
    if _id(group) in KNOWN_BROKEN:
        with pytest.raises(Exception):  # noqa: B017,PT011 -- any failure: still broken
            await _run(group, embedded)
        return
    shown, namespace = await _run(group, embedded)
    for (where, name), holds in AFTER.items():
        if where == page and name in namespace:
            assert holds(namespace[name]), f"{_id(group)}: {name} is {namespace[name]!r}"
    for (where, text), check in SHOWN.items():
        if where != page or not any(text in fence.code for fence in group):
            continue
        assert text in shown, f"{_id(group)}: `{text}` was never evaluated"
        assert check(shown[text]), f"{page}: `{text}` is {shown[text]!r}, not what the page says"
    stated = {t for (p, t) in SHOWN if p == page}
    assert {t for t in shown} <= stated, (
        f"{_id(group)} shows {sorted(set(shown) - stated)}: add what the page says to SHOWN"
    )


def test_every_entry_of_the_tables_is_on_its_page() -> None:
    for page, text in SHOWN:
        assert any(text in f.code for f in fences(page) if f.lang == "python"), (page, text)
    for page, name in AFTER:
        bound = {
            node.id
            for group in programs(page)
            for node in ast.walk(program(group))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
        }
        assert name in bound, (page, name)


# ---------------------------------------------------------------- JSON and JSONL


def test_json_blocks_parse() -> None:
    blocks = [f for p in pages() for f in fences(p) if f.lang == "json"]
    assert len(blocks) >= 5
    for fence in blocks:
        try:
            json.loads(fence.code)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{fence.where}: not JSON: {exc}") from exc


async def test_the_jsonl_pages_records_import(embedded: Path) -> None:
    from tiermem.interfaces.jsonl import import_lines
    from tiermem.service import MemoryService

    records = [json.loads(f.code) for f in fences("docs/jsonl.md") if f.lang == "json"]
    assert [r["type"] for r in records] == ["session", "turn", "memory"]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    async with MemoryService.from_settings() as memory:
        await import_lines(memory, lines)
        session = await memory.session("s-1", user_id="u-1")
        turn = await session.get_turn(0)
        assert turn.text == records[1]["content"][0]["text"]
        assert turn.timestamp.isoformat().startswith("2025-03-01T09:30:00")
        memories = await memory.longterm.list("u-1")
        assert [m.content for m in memories] == ["prefers seinen"]
        again = await import_lines(memory, lines)
        assert again.turns_added == 0


async def test_the_jsonl_pages_records_are_what_export_writes(embedded: Path) -> None:
    """docs/jsonl.md's records show the fields export writes; its turn is the exported
    turn of its text, field for field, and its memory the preference detected from it."""
    from tiermem.interfaces.jsonl import export_user
    from tiermem.service import MemoryService

    records = [json.loads(f.code) for f in fences("docs/jsonl.md") if f.lang == "json"]
    doc = {r["type"]: r for r in records}
    session_doc, turn_doc, memory_doc = doc["session"], doc["turn"], doc["memory"]
    async with MemoryService.from_settings() as memory:
        session = await memory.session(
            session_doc["session_id"],
            user_id=session_doc["user_id"],
            user_tier=session_doc["user_tier"],
            locale=session_doc["locale"],
        )
        await session.add_turn(
            "user",
            turn_doc["content"][0]["text"],
            timestamp=datetime.fromisoformat(turn_doc["timestamp"]),
        )
        await memory.drain()
        exported = {r["type"]: r async for r in export_user(memory, session_doc["user_id"])}
    for kind, record in doc.items():
        assert set(record) == set(exported[kind]), (kind, set(record) ^ set(exported[kind]))
    assert turn_doc == exported["turn"]
    assert (session_doc["user_tier"], session_doc["locale"]) == (
        exported["session"]["user_tier"],
        exported["session"]["locale"],
    )
    when = {"created_at", "valid_from"}  # the write's time: a timestamp on both sides
    assert all(isinstance(exported["memory"][k], str) for k in when)
    stated = {k: v for k, v in memory_doc.items() if k not in when}
    got = {k: v for k, v in exported["memory"].items() if k not in when}
    prefix = stated.pop("memory_id").removesuffix("…")
    assert got.pop("memory_id").startswith(prefix)
    assert stated == got


async def test_the_api_pages_error_example_is_what_the_api_answers(embedded: Path) -> None:
    import httpx

    from tiermem.interfaces.api import create_app
    from tiermem.service import MemoryService
    from tiermem.settings import TierMemSettings

    [example] = [f for f in fences("docs/api.md") if f.section == "Errors" and f.lang == "json"]
    stated = json.loads(example.code)
    async with MemoryService.from_settings() as memory:
        app = create_app(TierMemSettings(), service=memory, allow_anonymous=True)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answer = await http.post("/v1/sessions", json={"user_id": "u-1\n"})
    assert answer.status_code == 422
    assert answer.json() == stated


async def test_the_mcp_pages_error_example_is_what_the_tool_answers(embedded: Path) -> None:
    from mcp import Client

    from tiermem.interfaces.mcp_server import build_mcp_server, fixed_tenant
    from tiermem.service import MemoryService

    [example] = [f for f in fences("docs/mcp.md") if f.section == "Errors are tool errors"]
    stated = example.code.strip()
    user, memory_id = re.findall(r"'([^']+)'", stated)
    async with MemoryService.from_settings() as memory:
        server = build_mcp_server(memory, fixed_tenant("local"))
        async with Client(server) as client:
            result = await client.call_tool("forget", {"user_id": user, "memory_id": memory_id})
    assert result.is_error
    assert [block.text for block in result.content] == [stated]  # type: ignore[union-attr]


def test_the_readmes_inline_examples_hold(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README "Use it": the blocking facade as its sentence writes it, and a series
    catalogue as its paragraph writes it, found in English and Japanese turns."""
    from tiermem.sync import SyncMemory

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`with SyncMemory.from_settings() as memory: memory.session(...).add_turn(...)`" in (
        readme
    )
    catalogue = re.search(
        r"`TIERMEM_SERIES_CATALOGUE=([\w.]+)`, a JSON object of alias to title \(`(\{[^`]+\})`\)",
        readme,
    )
    assert catalogue is not None
    (embedded / catalogue.group(1)).write_text(catalogue.group(2), encoding="utf-8")
    monkeypatch.setenv("TIERMEM_SERIES_CATALOGUE", catalogue.group(1))
    with SyncMemory.from_settings() as memory:
        session = memory.session("s-1", user_id="u-1")
        for text in ("Is berserk vol 42 in stock?", "ベルセルクの42巻はありますか?"):
            turn = session.add_turn("user", text)
            assert Entity(kind="series", value="Berserk") in turn.entities, (text, turn.entities)


async def test_the_docs_curl_commands_get_an_answer_from_the_api(embedded: Path) -> None:
    """Each ``curl`` of a ```bash block, sent to the API app as written (``$KEY`` is a key
    of the test's keys file): a 2xx answer."""
    import httpx

    from tiermem.interfaces.api import create_app
    from tiermem.interfaces.tenancy import KeyStore
    from tiermem.service import MemoryService
    from tiermem.settings import TierMemSettings

    _, key = KeyStore(embedded / "api_keys.json").create("acme")
    calls = [
        (fence.where, shlex.split(line.replace("$KEY", key), comments=True))
        for page in pages()
        for fence in fences(page)
        if fence.lang == "bash"
        for line in fence.code.replace("\\\n", " ").splitlines()
        if line.startswith("curl ")
    ]
    assert calls
    async with MemoryService.from_settings() as memory:
        app = create_app(TierMemSettings(), service=memory)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport) as http:
            for where, words in calls:
                headers, body, method, url = {}, None, "GET", ""
                pairs = iter(words[1:])
                for word in pairs:
                    if word == "-H":
                        name, _, value = next(pairs).partition(":")
                        headers[name.strip()] = value.strip()
                    elif word in {"-d", "--data"}:
                        body, method = next(pairs), "POST"
                    elif word == "-X":
                        method = next(pairs)
                    else:
                        assert not word.startswith("-"), f"{where}: curl option {word}"
                        url = word
                answer = await http.request(method, url, headers=headers, content=body)
                assert answer.is_success, (where, answer.status_code, answer.text)
