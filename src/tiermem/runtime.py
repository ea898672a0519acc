"""Process-level tuning for a long-running tiermem process.

:func:`freeze_startup_heap` moves every object alive now (imported modules, pydantic
schemas, the tokenizer's tables, the service's clients) out of the garbage collector's
view, so a full collection later only walks what the process allocated since. Without
it a full collection in a service walks ~50,000 start-up objects: 15–20 ms of CPU on a
quiet core and 90–150 ms of pause on a loaded one, which is what set the embedded
default's p99 at 50 concurrent sessions (~100 ms with, ~20 ms without; ``bench/turns.py
--gc-freeze``). The library never calls it on import: the collector is the application's.
``tiermem serve`` and ``tiermem mcp`` call it once their app is built.

:func:`loop_factory` and :func:`run` choose the event loop of the processes and threads
tiermem starts itself (``tiermem serve``, ``tiermem mcp``, the CLI, :class:`~tiermem.SyncMemory`):
uvloop's wherever it is installed (the ``api`` and ``mcp`` extras bring it), else asyncio's.
A turn's round trips are mostly the loop's own work (a wake-up, a socket read, a future, a
task step), and uvloop does it in C: a plain Redis + Redis turn costs ~17 % fewer client
instructions on it (docs/performance.md, session 22). An application that runs the library
in its own loop chooses that loop itself (uvicorn picks uvloop when it is installed).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from tiermem.errors import ValidationError

__all__ = ["EventLoopChoice", "freeze_startup_heap", "loop_factory", "resolve_event_loop", "run"]

EventLoopChoice = Literal["auto", "asyncio", "uvloop"]
"""``auto``: uvloop when it can be imported (never on Windows, where it does not exist),
else asyncio; ``asyncio``: the standard library's loop; ``uvloop``: uvloop or an error."""

T = TypeVar("T")


def resolve_event_loop(choice: EventLoopChoice = "auto") -> Literal["asyncio", "uvloop"]:
    """Which loop ``choice`` means on this machine.

    Raises:
        ValidationError: ``choice`` is ``uvloop`` and uvloop cannot be imported, or
            ``choice`` is none of the three names.
    """
    if choice == "asyncio":
        return "asyncio"
    if choice not in ("auto", "uvloop"):
        raise ValidationError(f"event_loop must be 'auto', 'asyncio' or 'uvloop', got {choice!r}")
    if sys.platform == "win32" and choice == "auto":
        return "asyncio"
    try:
        import uvloop  # noqa: F401 -- its presence is the answer
    except ImportError as exc:
        if choice == "auto":
            return "asyncio"
        raise ValidationError(
            f"event_loop is 'uvloop' but uvloop cannot be imported ({exc}): install it "
            "(pip install uvloop, or the 'api' or 'mcp' extra), or set "
            "TIERMEM_EVENT_LOOP=asyncio"
        ) from exc
    return "uvloop"


def loop_factory(choice: EventLoopChoice = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A function making a new loop of the kind :func:`resolve_event_loop` picks (for
    :class:`asyncio.Runner`, ``anyio.run``'s ``loop_factory``, a thread's own loop)."""
    if resolve_event_loop(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return _standard_loop


def _standard_loop() -> asyncio.AbstractEventLoop:
    """The standard library's own loop, whatever global policy a process has set (after
    ``uvloop.install()``, ``asyncio.new_event_loop`` would make a uvloop loop)."""
    return asyncio.DefaultEventLoopPolicy().new_event_loop()


def run(coro: Coroutine[Any, Any, T], *, event_loop: EventLoopChoice = "auto") -> T:
    """:func:`asyncio.run` on the loop ``event_loop`` picks.

    Raises:
        ValidationError: as :func:`resolve_event_loop` (``coro`` is closed first).
    """
    try:
        factory = loop_factory(event_loop)
    except ValidationError:
        coro.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def freeze_startup_heap() -> int:
    """Collect once, then freeze the survivors (:func:`gc.freeze`); returns how many
    objects were frozen. Call it once, after start-up (imports done, the service built)
    and before serving; frozen objects are never collected, so do not call it in a loop
    (``gc.unfreeze()`` undoes it)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
