"""What every ``tiermem`` command shares: the consoles, opening the service, mapping the ids a
person types to the tenant's store ids, and turning library errors into a clear exit.

The data commands (inspect, recall, import, export, chat) act as one tenant, ``local`` by
default -- the tenant a loopback server without keys and ``tiermem mcp`` over stdio use --
so what they show is what those interfaces wrote. ``--tenant NAME`` picks another tenant;
``--no-tenant`` works on raw store ids (what the library writes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tiermem.errors import TierMemError
from tiermem.interfaces.tenancy import LOCAL_TENANT, TenantScope
from tiermem.runtime import run as run_on_loop
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

__all__ = [
    "RAW_IDS_OPTION",
    "TENANT_OPTION",
    "Ids",
    "console",
    "err_console",
    "fail",
    "open_memory",
    "run",
]

T = TypeVar("T")

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

TENANT_OPTION = typer.Option(
    LOCAL_TENANT.id, "--tenant", help="act as this tenant (the API's and MCP's id space)"
)
RAW_IDS_OPTION = typer.Option(
    False, "--no-tenant", help="use raw store ids (as the library writes them)"
)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    # The message is text, not markup: "pip install 'tiermem[api]'" must keep its [api].
    err_console.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code=code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on the loop the settings choose (``TIERMEM_EVENT_LOOP``,
    :mod:`tiermem.runtime`); a :class:`TierMemError` becomes an error line and exit 1."""
    try:
        return run_on_loop(coro, event_loop=TierMemSettings().event_loop)
    except TierMemError as exc:
        fail(f"{exc} ({type(exc).__name__})")


@asynccontextmanager
async def open_memory(settings: TierMemSettings | None = None) -> AsyncIterator[MemoryService]:
    """The service the settings (default: the environment) describe, closed on exit."""
    memory = MemoryService.from_settings(settings or TierMemSettings())
    try:
        yield memory
    finally:
        await memory.aclose()


@dataclass(frozen=True)
class Ids:
    """Maps ids typed on the command line to store ids and back (see the module doc)."""

    scope: TenantScope | None

    @classmethod
    def of(cls, tenant: str, raw: bool) -> Ids:
        """Raises: ValidationError for a bad tenant id."""
        return cls(None if raw else TenantScope(tenant))

    def user(self, value: str) -> str:
        return value if self.scope is None else self.scope.scope(value, field="user_id")

    def session(self, value: str) -> str:
        return value if self.scope is None else self.scope.scope(value, field="session_id")

    def show(self, stored: str | None) -> str:
        """The caller's form of a store id ("" for None; foreign ids shown raw)."""
        if stored is None:
            return ""
        if self.scope is None or not self.scope.owns(stored):
            return stored
        return self.scope.unscope(stored)
