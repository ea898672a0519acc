"""What every route shares: the app's state, the authenticated caller, and the answer
helper that strips the tenant prefix from every id it returns."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.api.errors import ApiError
from tiermem.interfaces.api.limits import RateLimiter
from tiermem.interfaces.api.metrics import ApiMetrics
from tiermem.interfaces.tenancy import (
    LOCAL_TENANT,
    KeyStore,
    Tenant,
    TenantScope,
    is_loopback_host,
)
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.tools import ToolDispatcher

__all__ = ["ApiState", "Caller", "CallerDep", "answer", "api_state", "open_existing_session"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ID_KEYS = frozenset({"session_id", "user_id", "doc_id", "summary_id"})


@dataclass
class ApiState:
    """Everything the routes need, built once by :func:`create_app`."""

    settings: TierMemSettings
    service: MemoryService
    keystore: KeyStore
    limiter: RateLimiter
    failure_limiter: RateLimiter
    metrics: ApiMetrics
    dispatcher: ToolDispatcher
    allow_anonymous: bool
    owns_service: bool = False
    extras: dict[str, Any] = field(default_factory=dict)


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.tiermem
    return state


@dataclass(frozen=True)
class Caller:
    """The authenticated tenant of a request and its id scope."""

    tenant: Tenant
    scope: TenantScope


def _client_host(request: Request) -> str:
    return request.client.host if request.client is not None else ""


def _unauthorized(state: ApiState, message: str) -> ApiError:
    state.metrics.auth_failures.inc()
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _limit(limiter: RateLimiter, key: str, state: ApiState, *, spend: bool = True) -> None:
    wait = limiter.take(key) if spend else limiter.wait(key)
    if wait is not None:
        state.metrics.rate_limited.inc()
        raise ApiError(
            429,
            "rate_limited",
            f"too many requests; retry in {RateLimiter.retry_after_header(wait)} s",
            headers={"Retry-After": RateLimiter.retry_after_header(wait)},
        )


async def _keys(request: Request, call: Callable[..., T], *args: Any) -> T:
    """A key-store call; a keys file that cannot be read is the server's fault (503, the
    path and parse error only in the log), never the caller's."""
    try:
        return await asyncio.to_thread(call, *args)
    except ValidationError as exc:
        logger.error("API keys unreadable on %s: %s", request.url.path, exc)
        raise ApiError(
            503,
            "unavailable",
            "the server cannot read its API keys; its operator must fix the keys file",
            headers={"Retry-After": "30"},
        ) from None


def _refuse_unknown_query(request: Request) -> None:
    """A query parameter the route does not take is a 422 naming it: a misspelt option
    (``?memory_types=...``, ``?since=...``) must not be silently ignored, as unknown body
    fields are not."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        known.update(param.alias for param in dependant.query_params)
        pending.extend(dependant.dependencies)
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        takes = ", ".join(sorted(known)) if known else "no query parameters"
        raise ApiError(
            422,
            "validation",
            f"unknown query parameter {', '.join(map(repr, unknown))}; this route takes {takes}",
            field=unknown[0],
        )


async def authenticate(request: Request) -> Caller:
    """The caller's tenant from ``Authorization: Bearer <key>``; the ``local`` tenant for
    a keyless request when the server allows it (loopback only, no active keys).

    Raises:
        ApiError: 401 without a valid key, 429 when the key's bucket is empty.
    """
    state = api_state(request)
    header = request.headers.get("authorization")
    tenant: Tenant | None
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized(state, "use 'Authorization: Bearer <api key>'")
        try:
            tenant = state.keystore.cached(token)
        except ValidationError:
            tenant = None  # the keys file is unreadable: verify() below answers 503
        if tenant is None:
            # A wrong key costs an scrypt: a client address that sent too many wrong keys
            # is refused before hashing (only failures are charged).
            failures = f"auth:{_client_host(request)}"
            _limit(state.failure_limiter, failures, state, spend=False)
            tenant = await _keys(request, state.keystore.verify, token)
            if tenant is None:
                state.failure_limiter.take(failures)
        if tenant is None:
            raise _unauthorized(state, "the API key is not valid (unknown, revoked or mistyped)")
    else:
        if not (
            state.allow_anonymous
            and is_loopback_host(_client_host(request))
            and not await _keys(request, state.keystore.has_active_keys)
        ):
            raise _unauthorized(
                state, "an API key is required: send 'Authorization: Bearer <api key>'"
            )
        tenant = LOCAL_TENANT
    _limit(state.limiter, f"key:{tenant.key_id or tenant.id}", state)
    if request.query_params:
        _refuse_unknown_query(request)
    scope = TenantScope(tenant)
    request.state.tenant_prefix = f"{scope.tenant}:"
    return Caller(tenant, scope)


CallerDep = Annotated[Caller, Depends(authenticate)]


@functools.lru_cache(maxsize=1024)
def _session_mention(prefix: str) -> re.Pattern[str]:
    """``Session <prefix>s-1`` / ``session <prefix>s-1`` as recall and profile lines write
    a session's store id; only ids right after the word "session" are rewritten, so a
    user's own text that happens to contain the prefix is left alone."""
    return re.compile(r"(\bsessions?\s+)" + re.escape(prefix), re.IGNORECASE)


def unscope_json(value: Any, prefix: str) -> Any:
    """Strip ``prefix`` from every id field (``session_id``, ``user_id``, ``doc_id``,
    ``summary_id``) of a JSON value, at any depth, and from the session names that context
    assembly writes into recall lines (``"Session <id>"`` in a ``text`` field)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, str):
                if key in _ID_KEYS and item.startswith(prefix):
                    item = item[len(prefix) :]
                elif key == "text" and prefix in item:
                    item = _session_mention(prefix).sub(r"\1", item)
                out[key] = item
            else:
                out[key] = unscope_json(item, prefix)
        return out
    if isinstance(value, list):
        return [unscope_json(item, prefix) for item in value]
    return value


def answer(caller: Caller, body: BaseModel | dict[str, Any], *, status: int = 200) -> JSONResponse:
    """A JSON answer with the tenant prefix removed from every id."""
    data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    data = unscope_json(data, f"{caller.scope.tenant}:")
    return JSONResponse(data, status_code=status)


async def open_existing_session(state: ApiState, caller: Caller, session_id: str) -> Session:
    """A handle on an existing session of the caller's tenant (never creates one).

    Raises:
        InvalidIdError: a bad session id.
        NotFoundError: no such session for this tenant (another tenant's sessions are,
            by construction, other ids: they read as absent too).
    """
    scoped = caller.scope.scope(session_id, field="session_id")
    view = await state.service.tiers.view(scoped)
    if view is None or not caller.scope.owns(view.metadata.user_id):
        raise NotFoundError(f"session {session_id!r} not found")
    return Session(state.service, view)
