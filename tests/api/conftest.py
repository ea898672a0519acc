"""Fixtures of the API tests: the embedded default (in-process hot tier, SQLite in
tmp_path), a keys file with two tenants, and clients through the real ASGI app."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tiermem.interfaces.api import create_app
from tiermem.interfaces.api.server import build_server
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


@pytest.fixture(scope="session")
def keys_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A keys file with the two tenants' keys, written once: each :meth:`KeyStore.create`
    hashes with scrypt (~50 ms of CPU), and ~100 API tests want the same two tenants."""
    path = tmp_path_factory.mktemp("api-keys") / "keys.json"
    store = KeyStore(path)
    _, a = store.create("tenant-a")
    _, b = store.create("tenant-b")
    return path, a, b


@pytest.fixture
def keys(settings: TierMemSettings, keys_template: tuple[Path, str, str]) -> Keys:
    """The two tenants' keys in a copy of the template file that is this test's own (a test
    may revoke, add or break keys); its KeyStore is fresh, so it verifies each key once."""
    assert settings.api_keys_file is not None
    template, a, b = keys_template
    shutil.copy2(template, settings.api_keys_file)  # keeps the file's 0600 mode
    return Keys(KeyStore(settings.api_keys_file), a, b)


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


@contextmanager
def serving(app: Any, *, log_level: str = "warning") -> Iterator[int]:
    """``app`` served by ``build_server`` (uvicorn, as ``tiermem serve`` runs it) on a free
    loopback port, in a thread; yields the port, and stops the server after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    uvicorn_server = build_server(app, "127.0.0.1", port, log_level=log_level)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):  # up to 10 s for the server to start
        if uvicorn_server.started:
            break
        thread.join(0.05)
    assert uvicorn_server.started, "uvicorn did not start"
    try:
        yield port
    finally:
        uvicorn_server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive()
