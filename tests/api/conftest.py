"""Fixtures of the API tests: the embedded default (in-process hot tier, SQLite in
tmp_path), a keys file with two tenants, and clients through the real ASGI app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


@dataclass
class Keys:
    store: KeyStore
    a: str
    b: str


@pytest.fixture
def settings(tmp_path: Path) -> TierMemSettings:
    return TierMemSettings(
        sqlite_path=tmp_path / "tiermem.db",
        api_keys_file=tmp_path / "keys.json",
        # Generous, so only the rate-limit tests meet the limit.
        api_rate_limit_per_minute=100_000,
        api_rate_limit_burst=10_000,
    )


@pytest.fixture
def keys(settings: TierMemSettings) -> Keys:
    assert settings.api_keys_file is not None
    store = KeyStore(settings.api_keys_file)
    _, a = store.create("tenant-a")
    _, b = store.create("tenant-b")
    return Keys(store, a, b)


@pytest.fixture
async def service(settings: TierMemSettings) -> AsyncIterator[MemoryService]:
    async with MemoryService.from_settings(settings) as svc:
        yield svc


@pytest.fixture
def app(settings: TierMemSettings, service: MemoryService, keys: Keys) -> FastAPI:
    return create_app(settings, service=service, keystore=keys.store)


ClientFactory = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def client_for(app: FastAPI) -> AsyncIterator[ClientFactory]:
    """``client_for(key)``: an httpx client on the ASGI app sending that key (None: none)."""
    opened: list[httpx.AsyncClient] = []

    def make(
        key: str | None, *, target: FastAPI | None = None, **options: Any
    ) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(target or app),
            base_url="http://testserver",
            headers=headers,
            **options,
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        await client.aclose()


@pytest.fixture
def client_a(client_for: ClientFactory, keys: Keys) -> httpx.AsyncClient:
    return client_for(keys.a)


@pytest.fixture
def client_b(client_for: ClientFactory, keys: Keys) -> httpx.AsyncClient:
    return client_for(keys.b)
