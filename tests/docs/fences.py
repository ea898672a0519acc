"""Fenced code blocks of the README and docs/*.md, and the Python programs they make.

A fence's info string is its language and then flags: ```` ```python no-run needs AWS
Bedrock ```` (GitHub highlights by the first word and shows none of the rest). The rules
that turn a page's ``python`` blocks into programs are in tests/docs/test_examples.py.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOW = "__show__"
"""The name an example's bare expression statements are handed to (see :func:`program`)."""

KNOWN_BROKEN: set[str] = set()
"""``page:line`` of examples that fail today on pages someone else is editing; each test
asserts its entries still fail, so whoever fixes one must remove it."""


_OPEN = re.compile(r"^(`{3,})\s*([^`\s]*)(.*)$")


@dataclass(frozen=True)
class Fence:
    """One fenced block: ``line`` is the page's line number of its first code line."""

    page: str
    line: int
    lang: str
    flags: tuple[str, ...]
    section: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return not self.flags or self.flags[0] != "no-run"

    @property
    def continues(self) -> bool:
        return self.flags == ("continues",)


def pages() -> list[str]:
    """The pages whose examples are checked, relative to the repository root."""
    return ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]


def fences(page: str, text: str | None = None) -> list[Fence]:
    """Every fenced block of ``page`` (or of ``text``, named ``page``), in order. An
    unclosed fence is an error."""
    if text is None:
        text = (ROOT / page).read_text(encoding="utf-8")
    lines = text.splitlines()
    found: list[Fence] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        opened = _OPEN.match(line)
        if opened is None:
            i += 1
            continue
        ticks, lang, rest = opened.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page}:{i + 1}: the fence opened here is never closed")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Fence(page, i + 2, lang, tuple(rest.split()), section, code))
        i = end + 1
    return found


class _Show(ast.NodeTransformer):
    """``a.b, c  # stated result`` -> ``__show__("a.b, c", (a.b, c))``: a bare expression
    that is not a call (or an await, or a constant) is in an example to show its value."""

    def __init__(self, code: str) -> None:
        self.code = code

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if isinstance(node.value, ast.Call | ast.Await | ast.Constant):
            return node
        text = ast.get_source_segment(self.code, node.value)
        assert text is not None, ast.dump(node)
        call = ast.Call(ast.Name(SHOW, ast.Load()), [ast.Constant(text), node.value], [])
        return ast.copy_location(ast.Expr(call), node)


def program(blocks: list[Fence]) -> ast.Module:
    """One program of a block and the ``continues`` block after it (if any): the continuing
    block runs after the first block's statements, inside the ``with``/``async with`` the
    first block ends with (so what it opened is still open). Line numbers are the page's,
    so a traceback points at the Markdown line."""
    assert 1 <= len(blocks) <= 2, blocks
    assert not blocks[0].continues, blocks
    module = ast.Module(body=[], type_ignores=[])
    into = module.body
    for fence in blocks:
        tree = _Show(fence.code).visit(ast.parse(fence.code, filename=fence.page))
        ast.increment_lineno(tree, fence.line - 1)
        into.extend(tree.body)
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.With | ast.AsyncWith):
            into = last.body
    return ast.fix_missing_locations(module)


def flag_problem(fence: Fence) -> str | None:
    """What is wrong with a block's language and flags, if anything: a Python block this
    test would not see, a flag it does not know, a ``no-run`` without its reason."""
    if fence.lang in {"py", "python3", "pycon", "ipython", "Python"}:
        return f"{fence.where}: write ```python so the example is checked"
    if fence.lang != "python" or fence.flags in {(), ("continues",)}:
        return None
    if fence.flags[0] == "no-run" and len(fence.flags) > 1:
        return None
    return f"{fence.where}: flags {' '.join(fence.flags)!r}: use `continues` or `no-run <reason>`"


def programs(page: str, text: str | None = None) -> Iterator[list[Fence]]:
    """The page's runnable ``python`` blocks as programs: a block alone, or, when blocks
    after it continue it, the block with each of them (so continuing blocks are
    independent of each other)."""
    base: Fence | None = None
    continued = False
    for fence in fences(page, text):
        if fence.lang != "python" or not fence.runs:
            continue
        if fence.continues:
            assert base is not None, f"{fence.where}: a `continues` block with no block before it"
            continued = True
            yield [base, fence]
            continue
        if base is not None and not continued:
            yield [base]
        base, continued = fence, False
    if base is not None and not continued:
        yield [base]


def free_names(module: ast.Module) -> set[str]:
    """Names the program reads but never binds (nor are builtins): what its reader must
    supply. Scopes are not told apart; examples are flat enough for that."""
    bound: set[str] = {SHOW}
    read: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
    return read - bound - set(dir(builtins))
