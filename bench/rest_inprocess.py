"""The REST app's own server-side cost per request, with no socket and no HTTP parser
(issue #8): the ASGI app built by ``create_app`` (embedded default, summaries on, auth
on) called directly, as uvicorn would call it, once per request::

    PYTHONPATH=src:bench python bench/rest_inprocess.py --requests 2000 \
        [--scenarios healthz,add_turn,library]

Scenarios: ``healthz``; ``add_turn`` (``POST /v1/sessions/{id}/turns``, the bench's six
messages in turn); ``library``, the same turns through the library as the endpoint makes
them (the session read of ``open_existing_session``, then ``Session.add_turn``), so that
``add_turn`` minus ``library`` is what the framework costs. Prints process CPU µs per
request. CPU moves with the host; for instructions, run it under ``valgrind
--tool=callgrind`` at two request counts and divide the difference
(``bench/rest_callgrind.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from workload import MESSAGES

SCENARIOS = ("healthz", "add_turn", "library")
WARM_UP = 50


async def request(
    app: FastAPI, method: str, path: str, key: str, payload: dict[str, Any] | None = None
) -> int:
    """One request through the ASGI app; answers its status."""
    body = json.dumps(payload).encode() if payload is not None else b""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer " + key.encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    received = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the request runs
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(scope, receive, send)
    return status


async def run(requests: int, scenarios: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.json"
        _, key = KeyStore(keys).create("bench")
        settings = TierMemSettings(
            sqlite_path=Path(tmp) / "bench.db",
            api_keys_file=keys,
            api_rate_limit_per_minute=10**6,
            api_rate_limit_burst=10**6,
        )
        app = create_app(settings)
        service = app.state.tiermem.service
        async with app.router.lifespan_context(app):
            status = await request(
                app, "POST", "/v1/sessions", key, {"user_id": "u", "session_id": "s"}
            )
            assert status == 200, status
            scoped = "bench:s"  # the tenant's scope of the id (tenancy.TenantScope)

            def turn(i: int) -> dict[str, Any]:
                return {"role": "user", "content": MESSAGES[i % len(MESSAGES)]}

            async def healthz(i: int) -> None:
                assert await request(app, "GET", "/healthz", key) == 200

            async def add_turn(i: int) -> None:
                assert await request(app, "POST", "/v1/sessions/s/turns", key, turn(i)) == 201

            async def library(i: int) -> None:
                view = await service.tiers.view(scoped)
                assert view is not None, "the tenant's scoped id changed: update this bench"
                await Session(service, view).add_turn("user", MESSAGES[i % len(MESSAGES)])

            calls: dict[str, Callable[[int], Awaitable[None]]] = {
                "healthz": healthz,
                "add_turn": add_turn,
                "library": library,
            }
            for i in range(WARM_UP):
                await add_turn(i)
                await healthz(i)
            await service.drain()
            for name in scenarios:
                call = calls[name]
                start = time.process_time()
                for i in range(requests):
                    await call(i)
                await service.drain()
                spent = time.process_time() - start
                print(f"{name:10s} {spent / requests * 1e6:8.1f} µs CPU per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; choose from {SCENARIOS}")
    asyncio.run(run(args.requests, scenarios))


if __name__ == "__main__":
    main()
