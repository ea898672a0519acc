"""The one blocking facade of the REST client, built like :class:`tiermem.sync.SyncMemory`:
the async client runs on a portal loop in a background thread and is wrapped generically,
so every coroutine method (the client's and a :class:`RemoteSession`'s) is a blocking call
with the same name and arguments."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from tiermem.client._async import AsyncTierMemClient
from tiermem.runtime import EventLoopChoice, loop_factory
from tiermem.sync import _Blocking, _Portal

__all__ = ["TierMemClient"]


class TierMemClient(_Blocking):
    """Blocking :class:`AsyncTierMemClient` (same arguments, plus ``event_loop``: the
    portal thread's loop, ``auto`` taking uvloop when installed; :mod:`tiermem.runtime`).
    Close it, or use ``with``."""

    __slots__ = ()

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        event_loop: EventLoopChoice = "auto",
        **options: Any,
    ) -> None:
        portal = _Portal(loop_factory(event_loop))

        async def build() -> AsyncTierMemClient:
            # Built on the portal's loop: httpx's pool binds to the loop that uses it.
            return AsyncTierMemClient(base_url, api_key, **options)

        try:
            client = portal.run(build())
        except BaseException:
            portal.stop()
            raise
        super().__init__(client, portal)

    def close(self) -> None:
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
