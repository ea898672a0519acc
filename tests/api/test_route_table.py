"""The app's routes are registered on its own router (route_table.py): one flat list,
matched once per request, with what an ``APIRouter`` + ``include_router`` would give."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel

from tiermem.interfaces.api import create_app
from tiermem.interfaces.api.deps import Caller, authenticate
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.tenancy import LOCAL_TENANT, TenantScope
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

from .conftest import ClientFactory, Keys


def test_every_route_is_on_the_apps_own_router(
    app: FastAPI, settings: TierMemSettings, service: MemoryService, keys: Keys
) -> None:
    api_routes = [route for route in app.router.routes if isinstance(route, APIRoute)]
    # Nothing but routes: no node standing for an included router (FastAPI >= 0.165).
    assert all(not hasattr(route, "original_router") for route in app.router.routes)
    assert ("/v1/sessions/{session_id}/turns", frozenset({"POST"})) in {
        (route.path, frozenset(route.methods)) for route in api_routes
    }
    assert len(api_routes) >= 30
    other = create_app(settings, service=service, keystore=keys.store)
    mine = {id(route) for route in api_routes}
    assert not mine & {id(route) for route in other.router.routes}, "apps share route objects"


async def test_dependency_overrides_apply_to_the_apps_routes(
    app: FastAPI, client_for: ClientFactory
) -> None:
    keyless = client_for(None)
    assert (await keyless.post("/v1/sessions", json={"user_id": "u"})).status_code == 401
    app.dependency_overrides[authenticate] = lambda: Caller(LOCAL_TENANT, TenantScope(LOCAL_TENANT))
    opened = await keyless.post("/v1/sessions", json={"user_id": "u"})
    assert opened.status_code == 200, opened.text
    assert opened.json()["metadata"]["user_id"] == "u"


class _Item(BaseModel):
    name: str


async def _item(item_id: str) -> _Item:
    return _Item(name=item_id)


async def _made(item: _Item) -> _Item:
    return item


def _declare(routes: RouteTable | APIRouter) -> None:
    """The same two routes, on a table or on a router (their decorators take the same)."""
    routes.get("/{item_id}", response_model=_Item, tags=["read"], operation_id="item")(_item)
    routes.post(
        "",
        response_model=_Item,
        status_code=201,
        responses={409: {"description": "route's"}},
        operation_id="make",
    )(_made)


def _openapi_both_ways() -> tuple[dict[str, object], dict[str, object]]:
    responses = {404: {"description": "no such item"}, 409: {"description": "router's"}}
    table = RouteTable(prefix="/items", tags=["items"], responses=responses)
    _declare(table)
    by_table = FastAPI()
    table.register(by_table.router)

    router = APIRouter(prefix="/items", tags=["items"], responses=responses)
    _declare(router)
    by_router = FastAPI()
    by_router.include_router(router)
    return by_table.openapi(), by_router.openapi()


async def test_a_table_registers_what_an_api_router_would() -> None:
    by_table, by_router = _openapi_both_ways()
    assert by_table == by_router
    operation = by_table["paths"]["/items/{item_id}"]["get"]  # type: ignore[index]
    assert operation["tags"] == ["items", "read"]
    assert operation["responses"]["409"]["description"] == "router's"
    made = by_table["paths"]["/items"]["post"]  # type: ignore[index]
    assert made["responses"]["409"]["description"] == "route's"

    app = FastAPI()
    table = RouteTable(prefix="/items")
    table.get("/{item_id}", response_model=_Item)(_item)
    table.register(app.router)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://testserver"
    ) as client:
        answer = await client.get("/items/abc")
    assert answer.status_code == 200
    assert answer.json() == {"name": "abc"}
