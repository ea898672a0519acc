"""``tiermem serve``: run the API under uvicorn, refusing to bind beyond loopback without
API keys."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from tiermem.interfaces.tenancy import KeyStore, check_bind_allowed, is_loopback_host
from tiermem.runtime import EventLoopChoice, freeze_startup_heap, resolve_event_loop
from tiermem.settings import TierMemSettings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

__all__ = ["MAX_HEAD_BYTES", "build_server", "http_protocol", "run_server"]

MAX_HEAD_BYTES = 64 * 1024
"""The most a request's line and headers may take; past it the connection gets a 400 and
is closed, as uvicorn does for any malformed request."""


@functools.cache
def http_protocol() -> type[asyncio.Protocol] | str:
    """The HTTP/1.1 parser the server runs: httptools (C, the ``api`` extra installs it)
    with :data:`MAX_HEAD_BYTES` enforced, else h11 (pure Python, with its own limit).

    httptools takes ~0.4 ms less server CPU per request than h11 on this machine
    (docs/api.md, "Performance"), but uvicorn puts no bound on an httptools request's
    head: a client could send headers without end and the server would keep them all.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed
        return "h11"

    class HeadBoundedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol, refusing a request head (or a chunked body's
        trailers) over MAX_HEAD_BYTES.

        Two counts, each held to the bound. The URL and header lines the parser has handed
        on since the message began (exact). And the reads that go wholly into one head or
        trailer section: httptools keeps a line it has not finished in a buffer of its own,
        which the first count cannot see, so a read that starts and ends inside the same
        open section is charged to it whole. A read in which a section opens or closes is
        not charged (its finished lines are in the first count), so what the buffer can
        hold is the bound plus one read, and pipelined requests, bodies and chunk framing
        are never charged.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._section_open = False  # reading a head, or a chunked body's trailers
            self._section_moved = False  # a section opened or closed during this read
            self._unfinished = 0  # reads charged to the open section
            self._parsed_bytes = 0  # its URL and header lines, as handed on

        def data_received(self, data: bytes) -> None:
            spans = self._section_open
            self._section_moved = False
            super().data_received(data)
            if not (spans and self._section_open and not self._section_moved):
                return
            if self.transport.is_closing():
                return
            self._unfinished += len(data)
            if self._unfinished > MAX_HEAD_BYTES:
                message = "Request line and headers too large."
                self.logger.warning("%s (%d bytes unfinished)", message, self._unfinished)
                self.send_400_response(message)

        def _open(self) -> None:
            self._section_open, self._section_moved, self._unfinished = True, True, 0

        def _close(self) -> None:
            if self._section_open:
                self._section_open, self._section_moved, self._unfinished = False, True, 0

        def on_message_begin(self) -> None:
            self._parsed_bytes = 0
            self._open()
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._parsed(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._parsed(len(name) + len(value) + 4)  # ': ' and CRLF
            super().on_header(name, value)

        def _parsed(self, size: int) -> None:
            self._parsed_bytes += size
            if self._parsed_bytes > MAX_HEAD_BYTES:
                self.logger.warning("Request line and headers too large (%d bytes).", size)
                # Raised inside the parser's callback, it reaches data_received as an
                # httptools.HttpParserError: uvicorn answers 400 and closes.
                raise ValueError("request line and headers too large")

        def on_headers_complete(self) -> None:
            self._close()
            super().on_headers_complete()

        def on_chunk_header(self) -> None:
            # A chunk's data, or after the last chunk the trailers, follow.
            self._open()

        def on_chunk_complete(self) -> None:
            self._close()

        def on_body(self, body: bytes) -> None:
            self._close()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._close()
            super().on_message_complete()

    return HeadBoundedHttpTools


def build_server(
    app: FastAPI,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    event_loop: EventLoopChoice = "auto",
) -> uvicorn.Server:
    """A uvicorn server for ``app`` (not started). Request bodies are capped by the app, a
    request's head by :data:`MAX_HEAD_BYTES` (:func:`http_protocol`). ``run()`` runs
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
        http=http_protocol(),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,  # when h11 runs
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
