"""What the pages name beyond their Python examples (the rules are at the top of
tests/docs/test_examples.py): ``tiermem`` commands and options in ```bash blocks, inline
code and docs/cli.md's command table; docs/jsonl.md's commands and docs/cli.md's chat
transcript, run; repository paths, ``tiermem.*`` names and ``TIERMEM_*`` variables."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tests.docs.fences import KNOWN_BROKEN, ROOT, fences, pages
from tiermem.interfaces.cli import app

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
    """``(where, words)`` of every ``tiermem`` command in a shell block (``where`` is the
    block's) or in inline code (``where`` is the line's)."""
    for page in pages():
        for fence in fences(page):
            if fence.lang not in {"bash", "sh", "shell", "console"}:
                continue
            for line in fence.code.replace("\\\n", " ").splitlines():
                for words in _words(line.removeprefix("$ ")):
                    yield fence.where, words
        text = (ROOT / page).read_text(encoding="utf-8")
        for match in _INLINE.finditer(text):
            line_number = text.count("\n", 0, match.start()) + 1
            for words in _words(match.group(1)):
                yield f"{page}:{line_number}", words


def test_the_docs_name_tiermem_commands_and_options_that_exist() -> None:
    commands = list(_shell_commands())
    assert len(commands) > 30, commands  # the docs name many; a parser slip finds none
    failures: dict[str, str] = {}
    for where, words in commands:
        try:
            check_command(words, where)
        except AssertionError as exc:
            failures.setdefault(where, str(exc).splitlines()[0])
    unexpected = {w: f for w, f in failures.items() if w not in KNOWN_BROKEN}
    assert not unexpected, "\n".join(unexpected.values())
    fixed = (KNOWN_BROKEN & {w for w, _ in commands}) - set(failures)
    assert not fixed, f"{sorted(fixed)} pass now: remove them from KNOWN_BROKEN"


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


def test_the_api_pages_keys_and_serve_comments_hold(embedded: Path) -> None:
    """docs/api.md: ``tiermem keys create acme  # prints the key once: tm_<key_id>_<secret>``
    (16 hex characters, then 43 URL-safe ones), and ``tiermem serve --host 0.0.0.0`` refuses
    to start without an active key."""
    block = next(f for f in fences("docs/api.md") if f.lang == "bash")
    create, serve = (words for line in block.code.splitlines()[:2] for words in _words(line))
    runner = CliRunner()
    refused = runner.invoke(app, serve)
    assert refused.exit_code == 1, refused.output
    assert "tiermem keys create" in refused.output, refused.output
    created = runner.invoke(app, create)
    assert created.exit_code == 0, created.output
    keys = re.findall(r"tm_[0-9a-f]{16}_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])", created.output)
    assert len(keys) == 1, created.output


def test_the_readmes_demo_saves_what_it_says(embedded: Path) -> None:
    """README "Set up": `tiermem demo` prints the day-3 context's tokens against the full
    history's, "about N % fewer"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"the full history \(about (\d+) % fewer\)", readme)
    assert stated is not None
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, (result.output, result.exception)
    saved = re.search(r"full history of the three sessions: (\d+)% saved", result.output)
    assert saved is not None, result.output
    assert abs(int(saved.group(1)) - int(stated.group(1))) <= 2, (saved[0], stated[0])


def test_mcp_client_configurations_in_the_docs_start_a_real_command() -> None:
    """A ```json ``mcpServers`` configuration runs ``tiermem`` with arguments it takes."""
    configs = [
        (fence.where, server)
        for page in pages()
        for fence in fences(page)
        if fence.lang == "json" and "mcpServers" in fence.code
        for server in json.loads(fence.code)["mcpServers"].values()
    ]
    assert configs
    for where, server in configs:
        assert server["command"] == "tiermem", (where, server)
        check_command(list(server["args"]), where)
