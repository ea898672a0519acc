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
  :data:`SHOWN` holds what the page says it is, and the test asserts it.
* ``tiermem ...`` commands in ```` ```bash ```` blocks, in inline code and in the command
  table of docs/cli.md name real commands and options (``tiermem COMMAND --help`` lists
  them); docs/jsonl.md's commands also run, and its records import. ```` ```json ````
  blocks parse.

:data:`KNOWN_BROKEN` lists examples of pages other people are editing that fail today; the
test asserts they still fail, so whoever fixes one removes it from the list.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import json
import os
import re
import shlex
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tests.docs.fences import ROOT, SHOW, Fence, fences, free_names, pages, program, programs
from tests.knowledge.files import make_pdf
from tiermem.interfaces.cli import app
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
    ("README.md", "ctx"): lambda ctx: "ORD-12345" in ctx.text and "track_order" in ctx.text,
    ("README.md", "kwargs"): lambda kwargs: {"system", "messages", "tools"} <= set(kwargs),
    ("docs/api.md", "window"): lambda window: window.stats.total_turns == 1,
}
"""What an example's names hold when it ends, as its page (or its comments) says."""

KNOWN_BROKEN: set[str] = set()
"""``page:line`` of examples (on pages this test's author may not edit) that fail today."""


def test_known_broken_entries_name_examples() -> None:
    wheres = {f.where for page in pages() for f in fences(page)}
    assert wheres >= KNOWN_BROKEN, KNOWN_BROKEN - wheres


# ---------------------------------------------------------------- Python blocks


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


def _all_programs() -> list[list[Fence]]:
    return [group for page in pages() for group in programs(page)]


def _id(group: list[Fence]) -> str:
    return group[-1].where


def test_python_fences_are_spelt_so_this_test_finds_them() -> None:
    for page in pages():
        for fence in fences(page):
            assert fence.lang not in {"py", "python3", "pycon", "ipython", "Python"}, (
                f"{fence.where}: write ```python so the example is checked"
            )
            if fence.lang != "python":
                continue
            assert fence.flags in {(), ("continues",)} or (
                fence.flags[0] == "no-run" and len(fence.flags) > 1
            ), f"{fence.where}: flags {fence.flags}: use `continues` or `no-run <reason>`"


def test_no_run_blocks_compile() -> None:
    no_run = [f for p in pages() for f in fences(p) if f.lang == "python" and not f.runs]
    for fence in no_run:
        compile(fence.code, fence.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_there_are_examples_to_run() -> None:
    assert {_id(g) for g in _all_programs()} >= {"README.md:86", "docs/api.md:153"}


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


# ---------------------------------------------------------------- the command line

_ROOT_COMMAND = get_command(app)
_INLINE = re.compile(r"`((?:\.venv/bin/)?tiermem [^`]+)`")
_SEPARATORS = {"&&", "||", ";", "|", ">", ">>", "<", "2>", "&"}


def _words(line: str) -> list[list[str]]:
    """The ``tiermem`` invocations of a shell line, each without the program name."""
    calls: list[list[str]] = []
    current: list[str] | None = None
    for word in shlex.split(line, comments=True):
        if word in _SEPARATORS:
            current = None
        elif current is not None:
            current.append(word)
        elif word == "tiermem" or word.endswith("/tiermem"):
            current = []
            calls.append(current)
    return calls


def _placeholder(word: str) -> bool:
    return word.isupper() or word.startswith("<") or "…" in word


def check_command(words: list[str], where: str) -> None:
    """``tiermem <words>`` names a command that exists, with options it has."""
    command: Any = _ROOT_COMMAND  # typer's own click: a group is what has `commands`
    path = ["tiermem"]
    rest = list(words)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        if _placeholder(rest[0]):
            return
        name = rest.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, (
            f"{where}: `{' '.join(path)} {name}` is no command; {' '.join(path)} has "
            f"{sorted(command.commands)}"
        )
        command, path = sub, [*path, name]
    options = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for word in rest:
        if word.startswith("-") and word != "-":
            option = word.split("=", 1)[0]
            assert option in options, (
                f"{where}: `{' '.join(path)}` has no option {option}; it has {sorted(options)}"
            )


def _shell_commands() -> Iterator[tuple[str, list[str]]]:
    for page in pages():
        for fence in fences(page):
            if fence.lang not in {"bash", "sh", "shell", "console"}:
                continue
            joined = fence.code.replace("\\\n", " ")
            for offset, line in enumerate(joined.splitlines()):
                line = line.removeprefix("$ ")
                for words in _words(line):
                    yield f"{fence.where}+{offset}", words
        text = (ROOT / page).read_text(encoding="utf-8")
        for match in _INLINE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            for words in _words(match.group(1)):
                yield f"{page}:{line}", words


def test_the_docs_name_tiermem_commands_and_options_that_exist() -> None:
    commands = list(_shell_commands())
    assert len(commands) > 30, commands  # the docs name many; a parser slip finds none
    failures = []
    for where, words in commands:
        try:
            check_command(words, where)
        except AssertionError as exc:
            failures.append(str(exc))
    broken = {f.split(":")[0] + ":" + f.split(":")[1].split("+")[0] for f in failures}
    assert not failures or broken <= KNOWN_BROKEN, "\n".join(failures)


def test_the_cli_pages_command_table_names_commands_and_options_that_exist() -> None:
    text = (ROOT / "docs/cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z][^`]*)` \|", text, flags=re.MULTILINE)
    assert len(rows) >= 12, rows
    for row in rows:
        first, *alternatives = (re.sub(r"[\[\]]", " ", part).split() for part in row.split(" / "))
        check_command(first, f"docs/cli.md `{row}`")
        for words in alternatives:  # another subcommand of the group, or other options
            check_command([first[0], *words], f"docs/cli.md `{row}`")


def test_the_command_checker_finds_a_misspelt_command_and_option() -> None:
    with pytest.raises(AssertionError, match="no command"):
        check_command(["recal", "u-1", "x"], "here")
    with pytest.raises(AssertionError, match="no option --top"):
        check_command(["recall", "u-1", "x", "--top", "3"], "here")
    with pytest.raises(AssertionError, match="no command"):
        check_command(["keys", "remove", "k"], "here")
    check_command(["keys", "create", "acme", "--label", "ci"], "here")


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


def test_the_jsonl_pages_commands_run_as_stated(embedded: Path) -> None:
    """docs/jsonl.md's block, line by line through the CLI, after seeding tenant ``local``'s
    user u-1 with sessions s-1 and s-2; the second import says what its comment says."""
    from tiermem.service import MemoryService

    async def seed() -> None:
        async with MemoryService.from_settings() as memory:
            for sid in ("s-1", "s-2"):
                session = await memory.session(f"local:{sid}", user_id="local:u-1")
                await session.add_turn("user", "I prefer seinen")
                await session.add_turn("assistant", "Noted.")

    asyncio.run(seed())
    block = next(f for f in fences("docs/jsonl.md") if f.lang == "bash")
    runner = CliRunner()
    outputs = []
    for line in block.code.splitlines():
        for words in _words(line):
            result = runner.invoke(app, words)
            assert result.exit_code == 0, (line, result.output, result.exception)
            outputs.append((line, result.output))
    assert (embedded / "u1.jsonl").exists()
    again = next(out for line, out in outputs if "again:" in line)
    stated = re.search(r'again: "(.*)"', block.code)
    assert stated is not None
    pattern = re.escape(stated.group(1)).replace("N", r"\d+")
    assert re.search(pattern, again), again


# ---------------------------------------------------------------- names in inline code

_PATH = re.compile(r"`((?:src|tests|bench|deploy|scripts|docs|\.ci)/[^`\s]+)`")
_DOTTED = re.compile(r"`(tiermem(?:\.\w+)+)(?:\(\))?`")
_FROM = re.compile(r"`from (tiermem[\w.]*) import ([\w, ]+)`")


def _inline(pattern: re.Pattern[str]) -> Iterator[tuple[str, re.Match[str]]]:
    for page in pages():
        text = (ROOT / page).read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            yield f"{page}:{text.count(chr(10), 0, match.start()) + 1}", match


def _failures(check: Callable[[re.Match[str]], str | None], pattern: re.Pattern[str]) -> str:
    found = [(where, check(match)) for where, match in _inline(pattern)]
    assert found, f"no {pattern.pattern} in the docs: has the parser broken?"
    failed = {where: problem for where, problem in found if problem is not None}
    assert set(failed) >= KNOWN_BROKEN & {w for w, _ in found}, "KNOWN_BROKEN passes now"
    return "\n".join(f"{w}: {p}" for w, p in failed.items() if w not in KNOWN_BROKEN)


def test_repository_paths_in_the_docs_exist() -> None:
    def check(match: re.Match[str]) -> str | None:
        path, _, test = match.group(1).partition("::")
        if not (ROOT / path).exists():
            return f"{path} does not exist"
        if test and f"def {test.split('[')[0]}(" not in (ROOT / path).read_text("utf-8"):
            return f"{path} has no test {test}"
        return None

    problems = _failures(check, _PATH)
    assert not problems, problems


def test_tiermem_names_in_the_docs_import() -> None:
    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        for split in range(len(parts), 0, -1):
            try:
                target: object = importlib.import_module(".".join(parts[:split]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[split:]:
                if not hasattr(target, attribute):
                    return f"{dotted}: {'.'.join(parts[:split])} has no {attribute}"
                target = getattr(target, attribute)
            return None
        return f"{dotted}: no such module"

    def check(match: re.Match[str]) -> str | None:
        if match.re is _FROM:
            names = [n.strip() for n in match.group(2).split(",")]
            return next(
                (p for n in names if (p := resolve(f"{match.group(1)}.{n}")) is not None), None
            )
        return resolve(match.group(1))

    problems = _failures(check, _DOTTED) + _failures(check, _FROM)
    assert not problems, problems


def test_the_chat_transcript_of_the_cli_page_is_what_chat_prints(embedded: Path) -> None:
    """docs/cli.md's ```text transcript, replayed: its `$` line's arguments, its `you>`
    lines as input; every other line appears in the output in order (``…`` elides)."""
    fence = next(f for f in fences("docs/cli.md") if f.section == "`tiermem chat`")
    lines = fence.code.splitlines()
    assert lines[0].startswith("$ tiermem chat"), lines[0]
    [arguments] = _words(lines[0].removeprefix("$ "))
    typed = [line.removeprefix("you> ") for line in lines if line.startswith("you> ")]
    result = CliRunner().invoke(app, arguments, input="\n".join([*typed, "/quit", ""]))
    assert result.exit_code == 0, (result.output, result.exception)
    position = 0
    for line in lines[1:]:
        if line.startswith("you> "):
            continue
        for fragment in filter(None, (part.strip() for part in line.split("…"))):
            found = result.output.find(fragment, position)
            assert found >= 0, f"docs/cli.md: chat printed no {fragment!r}:\n{result.output}"
            position = found + len(fragment)


def test_scripts_the_shell_blocks_run_exist_with_the_options_they_pass() -> None:
    """A repository path in a ```bash block exists; options given to a Python script of
    the repository (``bench/soak.py --minutes 5``) appear in its source."""
    checked = 0
    for page in pages():
        for fence in fences(page):
            if fence.lang != "bash":
                continue
            for line in fence.code.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                for position, word in enumerate(words):
                    if not re.match(r"(scripts|bench|deploy|tests|docs|\.ci)/", word):
                        continue
                    checked += 1
                    assert (ROOT / word).exists(), f"{fence.where}: {word} does not exist"
                    if not word.endswith(".py"):
                        continue
                    source = (ROOT / word).read_text(encoding="utf-8")
                    for option in words[position + 1 :]:
                        if option in _SEPARATORS:
                            break
                        if option.startswith("--"):
                            assert f'"{option.split("=")[0]}"' in source, (
                                f"{fence.where}: {word} takes no {option}"
                            )
    assert checked >= 3


def test_tiermem_environment_variables_in_the_docs_exist() -> None:
    """Each ``TIERMEM_*`` a page names is a setting (TierMemSettings) or, for the test
    runner's own variables, is read by scripts/ or tests/."""
    from tiermem.settings import TierMemSettings

    settings = {f"TIERMEM_{name.upper()}" for name in TierMemSettings.model_fields}
    harness = "".join(
        path.read_text(encoding="utf-8")
        for folder in ("scripts", "tests")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".py", ".sh", ""}
        and path.is_file()
        and not {"__pycache__", "docs"} & set(path.relative_to(ROOT).parts)
    )
    for where, match in _inline(re.compile(r"TIERMEM_[A-Z0-9_]*[A-Z0-9]")):
        name = match.group(0)
        if name in settings:
            continue
        assert name.startswith(("TIERMEM_TEST_", "TIERMEM_REQUIRE")), (
            f"{where}: {name} is not a setting of TierMemSettings"
        )
        assert re.search(rf"\b{name}\b", harness), (
            f"{where}: nothing in scripts/ or tests/ reads {name}"
        )
