"""The one sync facade over the async core, for scripts, notebooks and sync web frameworks.

::

    from tiermem.sync import SyncMemory

    with SyncMemory.from_settings() as memory:
        session = memory.session("s-1", user_id="u-1")
        session.add_turn("user", "I prefer seinen")
        print(session.history())

There is no twin class: :class:`SyncMemory` runs the async :class:`~tiermem.service.
MemoryService` on an event loop in a background thread, and every async method of the
service (and of the sessions it returns) becomes a blocking call with the same name,
arguments and result. Do not use it from inside a running event loop; use the async API.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Self

from tiermem.longterm.memory import LongTermMemory
from tiermem.service import MemoryService, Session
from tiermem.settings import TierMemSettings

__all__ = ["SyncMemory"]

# Objects whose async methods are wrapped in turn when a call returns them.
_WRAPPED = (MemoryService, Session, LongTermMemory)


class _Portal:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tiermem-sync", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class _Blocking:
    """Wraps an object so its coroutine methods block until done."""

    def __init__(self, target: Any, portal: _Portal) -> None:
        self._target = target
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if isinstance(attr, _WRAPPED):
            return _Blocking(attr, self._portal)  # e.g. memory.longterm
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            result = self._portal.run(attr(*args, **kwargs))
            return _Blocking(result, self._portal) if isinstance(result, _WRAPPED) else result

        return call

    def __repr__(self) -> str:
        return f"Sync({self._target!r})"


class SyncMemory(_Blocking):
    """Blocking access to a :class:`MemoryService`. Close it (or use ``with``) when done."""

    def __init__(self, factory: Callable[[], MemoryService]) -> None:
        portal = _Portal()

        async def build() -> MemoryService:
            # Built on the portal's loop, so its clients bind to that loop.
            return factory()

        super().__init__(portal.run(build()), portal)

    @classmethod
    def from_settings(cls, settings: TierMemSettings | None = None, **engines: Any) -> SyncMemory:
        return cls(lambda: MemoryService.from_settings(settings, **engines))

    def close(self) -> None:
        try:
            self._portal.run(self._target.aclose())
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
