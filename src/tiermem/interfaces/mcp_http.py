"""The MCP server over streamable HTTP: bearer-key auth to a tenant per request, the REST
API's body cap and rate limits, and serving under uvicorn (see :mod:`~.mcp_server` for the
tools and the tenant rules, ``docs/mcp.md`` for the behaviour).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from tiermem.errors import UnsupportedCapabilityError
from tiermem.interfaces.mcp_server import build_mcp_server
from tiermem.interfaces.tenancy import (
    LOCAL_TENANT,
    KeyStore,
    Tenant,
    TenantScope,
    check_bind_allowed,
    is_loopback_host,
)
from tiermem.runtime import loop_factory
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

if TYPE_CHECKING:
    from tiermem.interfaces.api.limits import RateLimiter

__all__ = [
    "FAILED_AUTH_PER_MINUTE",
    "MCP_PATH",
    "TENANT_SCOPE_KEY",
    "http_app",
    "request_tenant",
    "run_http",
    "serve_http",
]

MCP_PATH = "/mcp"
TENANT_SCOPE_KEY = "tiermem.tenant"
"""The ASGI scope key where the auth layer leaves the caller's :class:`Tenant`."""


def request_tenant(ctx: Context) -> TenantScope:
    """The tenant the HTTP auth layer resolved for the request carrying this call.

    Raises:
        ToolError: the call did not come through :class:`_BearerAuth` (a wiring bug).
    """
    request = ctx.request_context.request
    tenant = getattr(request, "scope", {}).get(TENANT_SCOPE_KEY)
    if not isinstance(tenant, Tenant):
        raise ToolError("this call carries no authenticated tenant")
    return TenantScope(tenant)


class _BearerAuth:
    """ASGI middleware: resolve ``Authorization: Bearer <key>`` to a tenant or answer 401.

    The tenant is left in the scope (``TENANT_SCOPE_KEY``) and as the SDK's authenticated
    user (client id ``tenant/key id``), which binds each MCP session to its key. Failed key
    checks (each an scrypt) are limited per client address, requests per key (429 with
    Retry-After), as in the REST API.
    """

    def __init__(
        self,
        app: ASGIApp,
        keystore: KeyStore,
        *,
        local_allowed: bool,
        requests: RateLimiter,
        failures: RateLimiter,
    ) -> None:
        self.app = app
        self.keystore = keystore
        self.local_allowed = local_allowed
        self.requests = requests
        self.failures = failures

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = ""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
        client = scope.get("client") or ("", 0)
        wait: float | None
        tenant: Tenant | None
        tenant, wait = await self._tenant(header, f"auth:{client[0]}")
        if wait is None and tenant is not None:
            wait = self.requests.take(f"key:{tenant.key_id or tenant.id}")
        if wait is not None:
            await _refuse(send, 429, "rate_limited", "too many requests", wait)
            return
        if tenant is None:
            message = (
                "the API key is not valid (unknown, revoked or malformed)"
                if header
                else "this MCP server requires an API key: send 'Authorization: Bearer <key>' "
                "(create one with `tiermem keys create <tenant>`)"
            )
            await _refuse(send, 401, "unauthorized", message, None)
            return
        token = AccessToken(
            token="",  # never keep the key itself around
            client_id=f"{tenant.id}/{tenant.key_id or '-'}",
            scopes=[],
        )
        scope = {**scope, TENANT_SCOPE_KEY: tenant, "user": AuthenticatedUser(token)}
        await self.app(scope, receive, send)

    async def _tenant(self, header: str, client: str) -> tuple[Tenant | None, float | None]:
        """The caller's tenant (None: refuse with 401), or a wait when rate limited."""
        if not header:
            if self.local_allowed and not await anyio.to_thread.run_sync(
                self.keystore.has_active_keys
            ):
                return LOCAL_TENANT, None
            return None, None
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None, None
        cached = self.keystore.cached(key)
        if cached is not None:
            return cached, None
        wait = self.failures.wait(client)
        if wait is not None:
            return None, wait
        tenant = await anyio.to_thread.run_sync(self.keystore.verify, key)
        if tenant is None:
            self.failures.take(client)
        return tenant, None


async def _refuse(send: Send, status: int, error: str, message: str, wait: float | None) -> None:
    body = json.dumps({"error": error, "message": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tiermem"'))
    if wait is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(wait))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


FAILED_AUTH_PER_MINUTE = 30
"""Failed key checks allowed per client address and minute (each costs an scrypt)."""


def http_app(
    memory: MemoryService,
    keystore: KeyStore,
    *,
    host: str = "127.0.0.1",
    settings: TierMemSettings | None = None,
) -> ASGIApp:
    """The streamable HTTP app (path ``/mcp``) behind bearer-key auth, the REST API's body
    cap (413) and rate limits (429); ``settings`` gives the limits (defaults otherwise).

    ``host`` is where it will listen: only a loopback host lets keyless callers in as the
    ``local`` tenant, and only while the keys file has no active key.

    Raises:
        UnsupportedCapabilityError: the ``api`` extra (whose limits this uses) is missing.
    """
    try:
        from tiermem.interfaces.api.limits import BodyLimitMiddleware, RateLimiter
    except ImportError as exc:
        raise UnsupportedCapabilityError(
            f"MCP over HTTP needs the 'api' extra: pip install 'tiermem[api]' ({exc})"
        ) from exc
    limits = settings or TierMemSettings()
    server = build_mcp_server(memory, request_tenant)
    inner = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    authed = _BearerAuth(
        inner,
        keystore,
        local_allowed=is_loopback_host(host),
        requests=RateLimiter(
            per_minute=limits.api_rate_limit_per_minute, burst=limits.api_rate_limit_burst
        ),
        failures=RateLimiter(per_minute=FAILED_AUTH_PER_MINUTE, burst=FAILED_AUTH_PER_MINUTE),
    )
    return BodyLimitMiddleware(authed, max_bytes=limits.api_max_body_bytes)


async def serve_http(
    memory: MemoryService,
    keystore: KeyStore,
    *,
    host: str,
    port: int,
    settings: TierMemSettings | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``memory`` over streamable HTTP at ``http://host:port/mcp`` until stopped.

    Raises:
        ValidationError: ``host`` is beyond loopback and there is no active key.
    """
    import uvicorn

    check_bind_allowed(host, keystore)
    app = http_app(memory, keystore, host=host, settings=settings)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, proxy_headers=False, server_header=False
    )
    await uvicorn.Server(config).serve()


def run_http(
    settings: TierMemSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    keystore: KeyStore | None = None,
) -> None:
    """Open the service the settings describe and serve MCP over HTTP (blocks).

    Raises:
        ValidationError: binding beyond loopback without keys.
    """
    factory = loop_factory(settings.event_loop)
    keys = keystore or KeyStore.from_settings(settings)
    check_bind_allowed(host, keys)

    async def main() -> None:
        memory = MemoryService.from_settings(settings)
        try:
            await serve_http(memory, keys, host=host, port=port, settings=settings)
        finally:
            await memory.aclose()

    anyio.run(main, backend_options={"loop_factory": factory})
