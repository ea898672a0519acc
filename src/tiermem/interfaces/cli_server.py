"""The server commands: ``serve`` (REST API + inspector), ``mcp`` (stdio or streamable
HTTP) and ``keys`` (create, revoke, list API keys)."""

from __future__ import annotations

from rich.table import Table

from tiermem.errors import TierMemError
from tiermem.interfaces.cli_common import console, err_console, fail
from tiermem.interfaces.tenancy import KeyStore, check_bind_allowed
from tiermem.runtime import freeze_startup_heap
from tiermem.settings import TierMemSettings

__all__ = ["create_key", "list_keys", "revoke_key", "serve_api", "serve_mcp"]


def serve_api(settings: TierMemSettings, host: str, port: int) -> None:
    """Run the REST API (and the inspector at /inspector/) until interrupted."""
    try:
        from tiermem.interfaces.api.server import run_server
    except ImportError as exc:
        fail(f"the REST API needs the 'api' extra: pip install 'tiermem[api]' ({exc})")
    try:
        check_bind_allowed(host, KeyStore.from_settings(settings))
    except TierMemError as exc:
        fail(str(exc))
    err_console.print(
        f"tiermem API on http://{host}:{port}  (inspector: http://{host}:{port}/inspector/)"
    )
    run_server(settings, host, port)


def serve_mcp(settings: TierMemSettings, *, http: bool, host: str, port: int, tenant: str) -> None:
    """Serve the MCP tools over stdio (as ``tenant``) or streamable HTTP (tenant keys)."""
    try:
        from tiermem.interfaces import mcp_http, mcp_server
    except ImportError as exc:
        fail(f"the MCP server needs the 'mcp' extra: pip install 'tiermem[mcp]' ({exc})")
    freeze_startup_heap()  # imports done: full collections walk only what serving adds
    try:
        if http:
            keys = KeyStore.from_settings(settings)
            check_bind_allowed(host, keys)
            err_console.print(f"tiermem MCP (streamable HTTP) on http://{host}:{port}/mcp")
            mcp_http.run_http(settings, host=host, port=port, keystore=keys)
        else:
            mcp_server.run_stdio(settings, tenant=tenant)
    except TierMemError as exc:
        fail(str(exc))


def create_key(settings: TierMemSettings, tenant: str, label: str | None) -> None:
    """Create a key and print it once."""
    store = KeyStore.from_settings(settings)
    try:
        key_id, plaintext = store.create(tenant, label=label)
    except TierMemError as exc:
        fail(str(exc))
    console.print(f"created key {key_id} for tenant {tenant} in {store.path}")
    console.print("the key (shown once, store it now):")
    console.print(plaintext, soft_wrap=True)


def revoke_key(settings: TierMemSettings, key_id: str) -> None:
    store = KeyStore.from_settings(settings)
    try:
        info = store.revoke(key_id)
    except TierMemError as exc:
        fail(str(exc))
    console.print(f"revoked key {info.key_id} of tenant {info.tenant}")


def list_keys(settings: TierMemSettings) -> None:
    store = KeyStore.from_settings(settings)
    try:
        keys = store.list()
    except TierMemError as exc:
        fail(str(exc))
    table = Table(title=f"API keys in {store.path}", title_justify="left")
    for column in ("key id", "tenant", "label", "created", "status"):
        table.add_column(column)
    for info in keys:
        status = "active" if info.active else f"revoked {info.revoked_at:%Y-%m-%d %H:%M}"
        table.add_row(
            info.key_id, info.tenant, info.label or "", f"{info.created_at:%Y-%m-%d %H:%M}", status
        )
    console.print(table)
