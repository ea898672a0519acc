"""Operational routes: tools and breakers, service stats, liveness, readiness, metrics.

None of them returns tenant data: tools are the server's configuration, stats and metrics
are process-wide counters. Tool answers leave out the last error text of a breaker (it may
quote another tenant's call).
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tiermem.errors import TierMemError
from tiermem.interfaces.api.deps import CallerDep, answer, api_state, authenticate
from tiermem.interfaces.api.errors import ErrorBody
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.api.schemas import (
    HealthResponse,
    ReadyResponse,
    ServiceStats,
    ToolInfo,
    ToolListResponse,
)
from tiermem.tools import ToolStatus

__all__ = ["public_tool_message", "router"]

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0
_PROBE_ID = "_readyz"  # '_' cannot start a tenant id, so no tenant's data is ever read

router = RouteTable(
    responses={401: {"model": ErrorBody}, 429: {"model": ErrorBody}, 503: {"model": ErrorBody}}
)


def public_tool_message(status: ToolStatus) -> str | None:
    """A tool's degradation sentence without the breaker's last error text: breakers are
    shared by every tenant, and an error text may quote another tenant's call."""
    if status.message is None or not status.last_error:
        return status.message
    return status.message.replace(f" (last error: {status.last_error})", "")


@router.get("/v1/tools", response_model=ToolListResponse, tags=["tools"], operation_id="tools")
async def tools(caller: CallerDep, request: Request) -> JSONResponse:
    """Registered tools with their shared breaker state and this process's call counts."""
    statuses = await api_state(request).dispatcher.statuses()
    infos = [
        ToolInfo(
            name=s.name,
            description=s.description,
            health=s.health,
            breaker=s.breaker,
            recent_failures=s.recent_failures,
            since=s.since,
            retry_at=s.retry_at,
            fallbacks=list(s.fallbacks),
            message=public_tool_message(s),
            calls=s.stats.calls,
            failures=s.stats.errors + s.stats.timeouts,
        )
        for s in statuses
    ]
    return answer(caller, ToolListResponse(tools=infos))


@router.get("/v1/stats", response_model=ServiceStats, tags=["ops"], operation_id="service_stats")
async def service_stats(caller: CallerDep, request: Request) -> JSONResponse:
    """Process-wide counters: tier hits and reloads, background failures."""
    state = api_state(request)
    m = state.service.metrics
    stats = ServiceStats(
        hot_hits=m.hot_hits,
        reloads=m.reloads,
        bypasses=m.bypasses,
        hot_resyncs=m.hot_resyncs,
        flushes=m.flushes,
        flushed_turns=m.flushed_turns,
        lost_turns=m.lost_turns,
        index_failures=state.service.index_failures,
        auto_detect_failures=state.service.auto_detect_failures,
        hot_backend=state.settings.hot_backend,
        durable_backend=state.settings.durable_backend,
    )
    return answer(caller, stats)


@router.get("/healthz", response_model=HealthResponse, tags=["ops"], operation_id="healthz")
async def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse(status="ok")


async def _probe(name: str, read: asyncio.Future[object] | object) -> tuple[str, str]:
    try:
        await asyncio.wait_for(read, READY_TIMEOUT_SECONDS)  # type: ignore[arg-type]
    except TimeoutError:
        return name, "timeout"
    except (TierMemError, OSError) as exc:
        return name, f"unavailable ({type(exc).__name__})"
    return name, "ok"


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    tags=["ops"],
    operation_id="readyz",
    responses={503: {"model": ReadyResponse}},
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: one cheap read of each backend; 503 when one cannot be reached."""
    tiers = api_state(request).service.tiers
    results = await asyncio.gather(
        _probe("hot", tiers.hot.load(_PROBE_ID)),
        _probe("durable", tiers.durable.get_session(_PROBE_ID)),
    )
    backends = dict(results)
    ready = all(v == "ok" for v in backends.values())
    body = ReadyResponse(status="ready" if ready else "unavailable", backends=backends)
    headers = {} if ready else {"Retry-After": "1"}
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503, headers=headers)


@router.get("/metrics", tags=["ops"], operation_id="metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format. Needs a key whenever the server has keys."""
    await authenticate(request)
    state = api_state(request)
    try:
        state.metrics.set_breakers(await state.dispatcher.statuses())
    except TierMemError as exc:
        # Breaker gauges keep their last values; the rest of the scrape still answers.
        logger.warning("breaker states could not be read for /metrics: %s", exc)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")
