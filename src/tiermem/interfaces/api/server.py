"""``tiermem serve``: run the API under uvicorn, refusing to bind beyond loopback without
API keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiermem.interfaces.tenancy import KeyStore, check_bind_allowed, is_loopback_host
from tiermem.runtime import EventLoopChoice, freeze_startup_heap, resolve_event_loop
from tiermem.settings import TierMemSettings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

__all__ = ["build_server", "run_server"]


def build_server(
    app: FastAPI,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    event_loop: EventLoopChoice = "auto",
) -> uvicorn.Server:
    """A uvicorn server for ``app`` (not started). Request bodies are capped by the app;
    uvicorn's own limits keep slow or endless headers from holding a worker. ``run()`` runs
    it on the loop ``event_loop`` picks (:func:`~tiermem.runtime.resolve_event_loop`);
    ``serve()`` runs on the caller's.

    Raises:
        ValidationError: ``event_loop`` is ``uvloop`` and uvloop is not installed.
    """
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=False,  # client addresses decide local mode: never trust a header
        server_header=False,
        timeout_keep_alive=5,
        # h11 whatever else is installed: uvicorn's "auto" takes httptools when present,
        # and the header limit below is h11's (httptools measured no faster here).
        http="h11",
        h11_max_incomplete_event_size=64 * 1024,
        lifespan="on",
        loop=resolve_event_loop(event_loop),
    )
    return uvicorn.Server(config)


def run_server(
    settings: TierMemSettings, host: str = "127.0.0.1", port: int = 8080, *, log_level: str = "info"
) -> None:
    """Serve the API until interrupted.

    Keyless requests are served as the ``local`` tenant only when ``host`` is loopback and
    the keys file has no active key.

    Raises:
        ValidationError: ``host`` is beyond loopback and the keys file holds no active key
            (the message says how to create one).
    """
    from tiermem.interfaces.api.app import create_app

    resolve_event_loop(settings.event_loop)  # a missing uvloop fails before anything opens
    keystore = KeyStore.from_settings(settings)
    check_bind_allowed(host, keystore)
    app = create_app(settings, keystore=keystore, allow_anonymous=is_loopback_host(host))
    freeze_startup_heap()
    build_server(app, host, port, log_level=log_level, event_loop=settings.event_loop).run()
