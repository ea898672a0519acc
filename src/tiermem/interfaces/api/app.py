"""The FastAPI application: :func:`create_app` wires settings, the service, keys, limits,
metrics, error handlers and routes (``/v1/...``, ``/healthz``, ``/readyz``, ``/metrics``;
the OpenAPI schema at ``/openapi.json``).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiermem.interfaces.api import routes_ops, routes_sessions, routes_users
from tiermem.interfaces.api.deps import ApiState
from tiermem.interfaces.api.errors import install_error_handlers
from tiermem.interfaces.api.limits import BodyLimitMiddleware, RateLimiter
from tiermem.interfaces.api.metrics import ApiMetrics
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.tools import ToolRegistry

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

FAILED_AUTH_PER_MINUTE = 30
"""Failed key checks allowed per client address (each costs an scrypt)."""


class _TimingMiddleware:
    """Observe each request's latency under its route template (bounded label values)."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            operation = getattr(route, "path", None) or "unmatched"
            self.metrics.latency.labels(operation=operation, status=str(status)).observe(
                time.perf_counter() - start
            )


def _version() -> str:
    try:
        return package_version("tiermem")
    except PackageNotFoundError:
        return "0"


def create_app(
    settings: TierMemSettings | None = None,
    *,
    service: MemoryService | None = None,
    keystore: KeyStore | None = None,
    tools: ToolRegistry | None = None,
    allow_anonymous: bool = False,
    monotonic: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The REST API over ``service`` (built from ``settings`` when not given, and then
    closed when the app shuts down; a given service is the caller's to close).

    ``keystore`` defaults to the keys file the settings name. ``allow_anonymous`` lets
    keyless requests from loopback addresses act as the ``local`` tenant while the keys
    file holds no active key; :func:`run_server` sets it only when binding loopback.
    ``tools`` is the registry whose tools and breakers ``/v1/tools`` reports.
    ``monotonic`` drives the rate limiters (tests pass a fake one).
    """
    settings = settings or TierMemSettings()
    owns = service is None
    service = service or MemoryService.from_settings(settings)
    metrics = ApiMetrics(service)
    state = ApiState(
        settings=settings,
        service=service,
        keystore=keystore or KeyStore.from_settings(settings),
        limiter=RateLimiter(
            per_minute=settings.api_rate_limit_per_minute,
            burst=settings.api_rate_limit_burst,
            monotonic=monotonic,
        ),
        failure_limiter=RateLimiter(
            per_minute=FAILED_AUTH_PER_MINUTE, burst=FAILED_AUTH_PER_MINUTE, monotonic=monotonic
        ),
        metrics=metrics,
        dispatcher=service.tools(tools or ToolRegistry()),
        allow_anonymous=allow_anonymous,
        owns_service=owns,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if state.owns_service:
                await state.service.aclose()

    app = FastAPI(
        title="tiermem",
        version=_version(),
        description=(
            "Tiered memory and state for conversational LLM agents. Every id is scoped to "
            "the API key's tenant. See docs/api.md."
        ),
        lifespan=lifespan,
        # Swagger UI and ReDoc load their scripts from a CDN: the schema is published at
        # /openapi.json for any viewer, and the server's pages make no outside requests.
        docs_url=None,
        redoc_url=None,
    )
    app.state.tiermem = state
    install_error_handlers(app)
    # On the app's own router, not include_router's nodes (route_table.py says why).
    for table in (routes_sessions.router, routes_users.router, routes_ops.router):
        table.register(app.router)
    _mount_inspector(app)
    # Outermost last: timing sees 413s too; the size cap runs before any parsing.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(_TimingMiddleware, metrics=metrics)
    return app


def _mount_inspector(app: FastAPI) -> None:
    """Add the web inspector's routes when that module provides them."""
    try:
        inspector = importlib.import_module("tiermem.interfaces.inspector")
    except ModuleNotFoundError as exc:
        if exc.name != "tiermem.interfaces.inspector":
            raise  # the inspector exists but misses a dependency: say so
        return
    table = getattr(inspector, "router", None)
    if isinstance(table, RouteTable):
        table.register(app.router)
