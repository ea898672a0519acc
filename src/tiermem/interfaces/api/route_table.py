"""Routes declared once at import and registered on each app's own router
(:class:`RouteTable`).

FastAPI's ``include_router`` keeps an included router as one node (since FastAPI 0.165):
a request is matched against the included router's routes once to pick the node and again
inside it, with scope bookkeeping around every route it tries. A REST add_turn paid ~7 %
of its server CPU for that, ``/healthz`` ~27 % (docs/api.md, "Performance"). Registering
every route on the app's router with ``add_api_route``, FastAPI's public call for it,
leaves one flat list of routes matched once, in every FastAPI version, and each app gets
its own route objects (``app.dependency_overrides`` applies to them as to any route of the
app).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi.routing import APIRouter

__all__ = ["RouteTable"]

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class _Route:
    path: str
    method: str
    endpoint: Callable[..., Any]
    options: dict[str, Any]


@dataclass
class RouteTable:
    """A module's routes, written like an ``APIRouter``'s (``@table.get(path, ...)``):
    ``prefix`` is put before each path, ``tags`` before each route's own and
    ``responses`` under each route's own, as an ``APIRouter`` would."""

    prefix: str = ""
    tags: list[str] = field(default_factory=list)
    responses: dict[int | str, dict[str, Any]] = field(default_factory=dict)
    routes: list[_Route] = field(default_factory=list)

    def get(self, path: str, **options: Any) -> Callable[[_F], _F]:
        return self._route("GET", path, options)

    def post(self, path: str, **options: Any) -> Callable[[_F], _F]:
        return self._route("POST", path, options)

    def put(self, path: str, **options: Any) -> Callable[[_F], _F]:
        return self._route("PUT", path, options)

    def delete(self, path: str, **options: Any) -> Callable[[_F], _F]:
        return self._route("DELETE", path, options)

    def _route(self, method: str, path: str, options: dict[str, Any]) -> Callable[[_F], _F]:
        options = {
            **options,
            "tags": [*self.tags, *options.get("tags", ())],
            "responses": {**self.responses, **options.get("responses", {})},
        }

        def declare(endpoint: _F) -> _F:
            self.routes.append(_Route(self.prefix + path, method, endpoint, options))
            return endpoint

        return declare

    def register(self, router: APIRouter) -> None:
        """Add every route to ``router`` (an app's own: ``app.router``), in declaration
        order."""
        for route in self.routes:
            router.add_api_route(
                route.path, route.endpoint, methods=[route.method], **route.options
            )
