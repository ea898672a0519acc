"""The one sync facade over the async core, for scripts, notebooks and sync web frameworks.

::

    from tiermem.sync import SyncMemory

    with SyncMemory.from_settings() as memory:
        session = memory.session("s-1", user_id="u-1")
        session.add_turn("user", "I prefer seinen")
        print(session.history())
        memory.knowledge.add_document("u-1", "notes.md", b"# Notes", format="md")

There is no twin class: :class:`SyncMemory` runs the async :class:`~tiermem.service.
MemoryService` on an event loop in a background thread (the *portal*), and wraps it
generically. Through the facade:

* every coroutine method becomes a blocking call with the same name, arguments and result
  (an async generator method returns a plain iterator);
* every other method runs on the portal's loop too (so the service is only ever touched
  from one thread, and methods that need a running loop have one), and a coroutine it
  returns is awaited there;
* an asyncio future or task that a call returns (``memory.background.submit(...)``) comes
  back as a :class:`concurrent.futures.Future`: ``result()`` waits for it;
* every public attribute, property or result that holds an object with public coroutine
  methods — ``memory.longterm``, ``memory.knowledge``, ``memory.access``, ``memory.tiers``,
  the :class:`~tiermem.session.Session` that ``memory.session(...)`` returns — is wrapped
  the same way; other values (models, numbers, the clock) are returned as they are;
* setting an attribute sets it on the wrapped object.

The wrapped object is ``facade.__wrapped__``. Do not use the facade from inside a running
event loop (use the async API there); calling it from its own portal thread raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

from tiermem.errors import TierMemError
from tiermem.runtime import EventLoopChoice, loop_factory
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

__all__ = ["SyncMemory"]

T = TypeVar("T")


class _Portal:
    """An event loop running forever in a daemon thread."""

    def __init__(self, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.loop = new_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tiermem-sync", daemon=True
        )
        self._thread.start()
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal's loop and wait for its result."""
        if self.closed:
            coro.close()
            raise TierMemError("this SyncMemory is closed; open a new one to continue")
        if threading.current_thread() is self._thread:
            coro.close()
            raise TierMemError(
                "the sync facade was called from its own event loop (a callback or task of "
                "the service); use the async API there"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def _has_coroutine_methods(value: Any) -> bool:
    """Whether ``value`` is an object (not a class or function) with a public coroutine or
    async generator method: one the facade must wrap."""
    if isinstance(value, type) or inspect.isroutine(value) or inspect.ismodule(value):
        return False
    cls = type(value)
    known = _ASYNC_CLASSES.get(cls)
    if known is None:
        known = _ASYNC_CLASSES[cls] = _async_methods(cls)
    return known


_ASYNC_CLASSES: dict[type, bool] = {}


def _async_methods(cls: type) -> bool:
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        if inspect.iscoroutinefunction(attr) or inspect.isasyncgenfunction(attr):
            return True
    return False


async def _settle(value: Any) -> Any:
    """A call's result as a sync caller can use it: a coroutine (the call's work) is awaited;
    an asyncio future or task (a handle on work that goes on) becomes a
    :class:`concurrent.futures.Future`, whose ``result()`` blocks."""
    if isinstance(value, asyncio.Future):
        return _concurrent(value)
    if inspect.isawaitable(value):
        return await _settle(await value)
    return value


def _concurrent(future: asyncio.Future[T]) -> concurrent.futures.Future[T]:
    """A future for other threads that follows ``future`` (call on its loop); cancelling
    it cancels ``future``."""
    mirror: concurrent.futures.Future[T] = concurrent.futures.Future()
    loop = future.get_loop()

    def copy(done: asyncio.Future[T]) -> None:
        if mirror.done():
            return
        if done.cancelled():
            mirror.cancel()
        elif (error := done.exception()) is not None:
            mirror.set_exception(error)
        else:
            mirror.set_result(done.result())

    def cancel(ended: concurrent.futures.Future[T]) -> None:
        if ended.cancelled() and not loop.is_closed():
            loop.call_soon_threadsafe(future.cancel)

    future.add_done_callback(copy)
    mirror.add_done_callback(cancel)
    return mirror


class _Blocking:
    """A blocking view of an async object (see the module docstring)."""

    __slots__ = ("__wrapped__", "_portal")

    def __init__(self, target: Any, portal: _Portal) -> None:
        object.__setattr__(self, "__wrapped__", target)
        object.__setattr__(self, "_portal", portal)

    def _wrap(self, value: Any) -> Any:
        return _Blocking(value, self._portal) if _has_coroutine_methods(value) else value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.__wrapped__, name)
        if inspect.isasyncgenfunction(attr):
            return self._iterating(attr)
        if inspect.iscoroutinefunction(attr) or inspect.ismethod(attr):
            return self._blocking(attr)
        return self._wrap(attr)

    def _blocking(self, method: Callable[..., Any]) -> Callable[..., Any]:
        portal = self._portal

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            async def on_the_loop() -> Any:
                return await _settle(method(*args, **kwargs))

            return self._wrap(portal.run(on_the_loop()))

        return call

    def _iterating(self, method: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        portal = self._portal

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Iterator[Any]:
            iterator = method(*args, **kwargs)

            async def step() -> tuple[bool, Any]:
                try:
                    return True, await anext(iterator)
                except StopAsyncIteration:
                    return False, None

            while True:
                more, item = portal.run(step())
                if not more:
                    return
                yield self._wrap(item)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.__wrapped__)) | {"__wrapped__"})

    def __repr__(self) -> str:
        return f"Sync({self.__wrapped__!r})"


class SyncMemory(_Blocking):
    """Blocking access to a :class:`MemoryService`. Close it (or use ``with``) when done."""

    __slots__ = ()

    def __init__(
        self, factory: Callable[[], MemoryService], *, event_loop: EventLoopChoice = "auto"
    ) -> None:
        """Build the service with ``factory`` on the portal, a thread running a loop of the
        kind ``event_loop`` picks (``auto``: uvloop when installed, :mod:`tiermem.runtime`).

        Raises:
            ValidationError: ``event_loop`` is ``uvloop`` and uvloop is not installed.
        """
        portal = _Portal(loop_factory(event_loop))

        async def build() -> MemoryService:
            # Built on the portal's loop, so its clients bind to that loop.
            return factory()

        try:
            service = portal.run(build())
        except BaseException:
            portal.stop()
            raise
        super().__init__(service, portal)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The portal's event loop, where the service lives. For adapters called on another
        loop (a framework's async hooks), which hand coroutines of the service to it with
        ``asyncio.run_coroutine_threadsafe`` instead of blocking their own loop."""
        loop: asyncio.AbstractEventLoop = self._portal.loop
        return loop

    @classmethod
    def from_settings(cls, settings: TierMemSettings | None = None, **engines: Any) -> SyncMemory:
        """A facade over :meth:`MemoryService.from_settings` (same arguments), on the loop
        ``settings.event_loop`` picks."""
        settings = settings or TierMemSettings()
        return cls(
            lambda: MemoryService.from_settings(settings, **engines),
            event_loop=settings.event_loop,
        )

    def close(self) -> None:
        """Close the service (waiting for its background work), then stop the portal."""
        if self._portal.closed:
            return
        try:
            self._portal.run(self.__wrapped__.aclose())
        finally:
            self._portal.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
