"""Request limits: a body-size cap (413) and a token bucket per API key (429).

Both answer with the API's error shape before any handler runs. The size cap trusts
neither the client's ``Content-Length`` nor its absence: a body that streams past the cap
is cut off and answered with 413 as well.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimitMiddleware", "RateLimiter"]


class _BodyTooLargeError(Exception):
    pass


def _too_large_body(limit: int) -> bytes:
    message = (
        f"the request body is larger than the limit of {limit} bytes; send less "
        "(split a long document, or raise TIERMEM_API_MAX_BODY_BYTES on the server)"
    )
    body = {"error": {"code": "too_large", "message": message, "field": None}}
    return json.dumps(body).encode()


class BodyLimitMiddleware:
    """Answer 413 to any HTTP request whose body exceeds ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        received = 0
        exceeded = False
        answered = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if exceeded:
                # The app turned the cut-off body into an answer of its own (FastAPI: 400
                # "error parsing the body"): answer 413 instead, once.
                if not answered:
                    answered = True
                    await self._reject(send)
                return
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLargeError:
            if not answered:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = _too_large_body(self.max_bytes)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets per key: ``burst`` requests at once, refilled at ``per_minute``.

    The map of buckets is bounded (``max_keys``, least recently used evicted first): an
    evicted key starts again with a full bucket, which only ever errs towards admitting.
    ``monotonic`` is injectable so tests advance time instead of sleeping.
    """

    def __init__(
        self,
        *,
        per_minute: int,
        burst: int,
        max_keys: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_minute < 1 or burst < 1 or max_keys < 1:
            raise ValueError("per_minute, burst and max_keys must be positive")
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.max_keys = max_keys
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: str) -> _Bucket:
        now = self._monotonic()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        return bucket

    def take(self, key: str) -> float | None:
        """Spend one token of ``key``'s bucket; None if admitted, else the seconds to wait
        until a token is there (for ``Retry-After``)."""
        bucket = self._bucket(key)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.rate

    def wait(self, key: str) -> float | None:
        """What :meth:`take` would answer, without spending a token (to refuse work that
        is only charged when it fails, such as a wrong key)."""
        bucket = self._bucket(key)
        return None if bucket.tokens >= 1.0 else (1.0 - bucket.tokens) / self.rate

    @staticmethod
    def retry_after_header(wait: float) -> str:
        """Whole seconds, rounded up, at least 1 (``Retry-After`` takes integers)."""
        return str(max(1, math.ceil(wait)))
