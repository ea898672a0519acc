"""Counting round trips: every call that crosses from the event loop to a server or to a
store's worker thread, for the round-trip tests and ``bench/turns.py``.

:class:`RoundTrips` wraps the clients at their one door while it is active:

* redis-py: ``Redis.execute_command`` (a command, a script call) and ``Pipeline.execute``
  (a whole pipeline or transaction is one round trip), and the Redis stores' own
  ``DirectLane.roundtrip`` (one command, or several sent at once);
* aiobotocore: ``AioBaseClient._make_api_call`` (one DynamoDB request);
* SQLite: ``SQLiteDatabase.read`` / ``write`` (one hand-off to the store's thread; group
  commit may share its transaction with other callers').

The clients are patched on their classes (a store builds its own client), so count one
service at a time. Libraries that are not installed are skipped.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

__all__ = ["RoundTrips"]


class RoundTrips:
    """Counts round trips by kind (``redis``, ``redis_pipeline``, ``dynamodb:<Operation>``,
    ``sqlite_read``, ``sqlite_write``) while :meth:`counting` is active."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_backend(self) -> dict[str, int]:
        """Totals per backend: ``redis``, ``dynamodb``, ``sqlite``."""
        out: Counter[str] = Counter()
        for kind, n in self.counts.items():
            out[kind.split(":")[0].split("_")[0]] += n
        return dict(out)

    def reset(self) -> Counter[str]:
        """The counts so far; counting restarts from zero."""
        counts, self.counts = self.counts, Counter()
        return counts

    @contextmanager
    def counting(self) -> Iterator[RoundTrips]:
        with ExitStack() as stack:
            for patch in (self._redis, self._dynamodb, self._sqlite):
                stack.enter_context(patch())
            yield self

    def _wrap(
        self, owner: type, name: str, kind: Callable[[tuple[Any, ...]], str | None]
    ) -> Iterator[None]:
        original = owner.__dict__[name]

        @functools.wraps(original)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            label = kind(args)
            if label is not None:
                self.counts[label] += 1
            return await original(*args, **kwargs)

        setattr(owner, name, counted)
        try:
            yield
        finally:
            setattr(owner, name, original)

    @contextmanager
    def _redis(self) -> Iterator[None]:
        try:
            from redis.asyncio.client import Pipeline, Redis
        except ImportError:
            yield
            return
        with ExitStack() as stack:
            # Pipeline overrides execute_command to queue: only a real send is counted.
            stack.enter_context(
                contextmanager(self._wrap)(
                    Redis,
                    "execute_command",
                    lambda a: None if isinstance(a[0], Pipeline) else "redis",
                )
            )
            stack.enter_context(
                contextmanager(self._wrap)(Pipeline, "execute", _always("redis_pipeline"))
            )
            # The Redis stores' direct lane (standalone clients): one packed send of
            # ``count`` commands, labelled as redis-py's own door would be.
            from tiermem.store.backends.redis_scripts import DirectLane

            stack.enter_context(
                contextmanager(self._wrap)(
                    DirectLane,
                    "roundtrip",
                    lambda a: "redis" if a[2] == 1 else "redis_pipeline",
                )
            )
            yield

    @contextmanager
    def _dynamodb(self) -> Iterator[None]:
        try:
            from aiobotocore.client import AioBaseClient
        except ImportError:
            yield
            return
        with contextmanager(self._wrap)(
            AioBaseClient, "_make_api_call", lambda a: f"dynamodb:{a[1]}"
        ):
            yield

    @contextmanager
    def _sqlite(self) -> Iterator[None]:
        from tiermem.store.backends.sqlite._connection import SQLiteDatabase

        with ExitStack() as stack:
            for name in ("read", "write"):
                stack.enter_context(
                    contextmanager(self._wrap)(SQLiteDatabase, name, _always(f"sqlite_{name}"))
                )
            yield


def _always(label: str) -> Callable[[tuple[Any, ...]], str]:
    return lambda _: label
