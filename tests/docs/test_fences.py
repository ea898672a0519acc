"""The rules of tests/docs/fences.py on made-up pages: how blocks become programs."""

from __future__ import annotations

import ast

import pytest

from tests.docs.fences import SHOW, fences, flag_problem, free_names, program, programs

PAGE = """# A page

```python
import contextlib

async with contextlib.AsyncExitStack() as stack:
    opened = [1]
```

## Two

```python continues
opened.append(2)
opened, len(opened)
```

```python continues
late = len(opened)
```

```bash
tiermem doctor
```

```python no-run needs a cloud
await cloud()
```

```python
alone = undefined_name
```
"""


def test_blocks_carry_their_language_flags_section_and_page_line() -> None:
    found = fences("page.md", PAGE)
    assert [(f.lang, f.flags, f.section, f.line) for f in found] == [
        ("python", (), "A page", 4),
        ("python", ("continues",), "Two", 13),
        ("python", ("continues",), "Two", 18),
        ("bash", (), "Two", 22),
        ("python", ("no-run", "needs", "a", "cloud"), "Two", 26),
        ("python", (), "Two", 30),
    ]


def test_each_continuing_block_runs_with_the_block_it_continues_alone() -> None:
    groups = [[f.line for f in group] for group in programs("page.md", PAGE)]
    assert groups == [[4, 13], [4, 18], [30]]


async def test_a_continuing_block_runs_inside_the_with_its_block_ends_with() -> None:
    first, second = fences("page.md", PAGE)[:2]
    module = program([first, second])
    inner = module.body[-1]
    assert isinstance(inner, ast.AsyncWith)
    assert [node.lineno for node in inner.body] == [7, 13, 14]  # the page's line numbers
    shown: dict[str, object] = {}
    code = compile(module, "page.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(code, {SHOW: shown.__setitem__})  # noqa: S307 -- made-up code above
    assert shown == {"opened, len(opened)": ([1, 2], 2)}


def test_free_names_are_what_no_block_of_the_program_binds() -> None:
    found = fences("page.md", PAGE)
    assert free_names(program([found[0], found[1]])) == set()
    assert free_names(program([found[5]])) == {"undefined_name"}


def test_flags_a_block_that_would_escape_the_check() -> None:
    def one(text: str) -> str | None:
        return flag_problem(fences("p.md", text)[0])

    assert one("```python\nx = 1\n```\n") is None
    assert one("```python no-run needs AWS Bedrock\nx = 1\n```\n") is None
    assert "no-run <reason>" in (one("```python no-run\nx = 1\n```\n") or "")
    assert "no-run <reason>" in (one("```python norun why\nx = 1\n```\n") or "")
    assert "write ```python" in (one("```py\nx = 1\n```\n") or "")


def test_an_unclosed_fence_is_an_error() -> None:
    with pytest.raises(AssertionError, match=r"p\.md:2: the fence opened here is never closed"):
        fences("p.md", "text\n```python\nx = 1\n")


def test_a_continuing_block_needs_a_block_before_it() -> None:
    with pytest.raises(AssertionError, match="no block before it"):
        list(programs("p.md", "```python continues\nx = 1\n```\n"))
