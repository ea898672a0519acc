"""The server's HTTP parser (``tiermem.interfaces.api.server.http_protocol``): httptools
with a bound on a request's head, or h11 with its own. Driven over real sockets against a
real uvicorn server on loopback: a head over the bound is refused with a 400 and the
connection closed, whether it comes as many headers (httptools; h11 bounds only a head it
has not yet seen the end of) or as one header that never ends (both); a body is not
charged to the head; keep-alive and pipelined requests go on as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiermem.interfaces.api import create_app, server
from tiermem.interfaces.api.server import MAX_HEAD_BYTES, http_protocol
from tiermem.settings import TierMemSettings

from .conftest import serving

PARSERS = ["httptools", "h11"]


def test_the_api_extra_runs_the_bounded_httptools_parser() -> None:
    parser = http_protocol()
    assert not isinstance(parser, str), "httptools is in the api extra: install it"
    assert parser.__name__ == "HeadBoundedHttpTools"


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def port(parser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A uvicorn server (local mode: no keys, loopback) in a thread, on each parser."""
    if parser == "h11":
        monkeypatch.setattr(server, "http_protocol", lambda: "h11")
    settings = TierMemSettings(
        sqlite_path=tmp_path / "server.db",
        api_keys_file=tmp_path / "keys.json",
        api_max_body_bytes=1024 * 1024,
    )
    assert (server.http_protocol() == "h11") == (parser == "h11")  # what build_server runs
    with serving(create_app(settings, allow_anonymous=True), log_level="error") as port:
        yield port


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and body (Content-Length framed, else up to the close)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    lengths = [
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    ]
    if not lengths:
        return status, await asyncio.wait_for(reader.read(), 10)
    return status, await asyncio.wait_for(reader.readexactly(lengths[0]), 10)


async def _closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 10) == b""


def _get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode()


async def test_keep_alive_requests_are_answered_in_turn(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            writer.write(_get("/healthz"))
            assert (await _answer(reader))[0] == 200
        # Two requests in one write (pipelined) are both answered.
        writer.write(_get("/healthz") + _get("/healthz"))
        assert [(await _answer(reader))[0] for _ in range(2)] == [200, 200]
    finally:
        writer.close()


@pytest.mark.parametrize("parser", ["httptools"], indirect=True)
async def test_too_many_headers_get_a_400_and_the_connection_closes(port: int) -> None:
    pad = "".join(f"X-Pad-{n}: {'a' * 1000}\r\n" for n in range(MAX_HEAD_BYTES // 1000 + 2))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get("/healthz", pad))
        assert (await _answer(reader))[0] == 400
        assert await _closed(reader)
    finally:
        writer.close()
    # The server goes on serving, and a head just under the bound is fine.
    under = "".join(f"X-Pad-{n}: {'a' * 1000}\r\n" for n in range(MAX_HEAD_BYTES // 1000 - 4))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get("/healthz", under))
        assert (await _answer(reader))[0] == 200
    finally:
        writer.close()


async def _endless(port: int, start: bytes) -> None:
    """Send ``start``, then 4 KiB at a time with no line end, until the server answers or
    4x the bound went: it must answer 400 and close within a few reads of the bound."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent, chunk = 0, b"a" * 4096
    try:
        writer.write(start)
        while sent < 4 * MAX_HEAD_BYTES:
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:
                break  # the server closed it
            sent += len(chunk)
            await asyncio.sleep(0.002)  # separate reads on the server's side
            if reader.at_eof() or len(reader._buffer) > 0:  # type: ignore[attr-defined]
                break
        status, _ = await _answer(reader)
        assert status == 400
        assert await _closed(reader)
        assert sent <= MAX_HEAD_BYTES + 16 * len(chunk), f"cut off only after {sent} bytes"
    finally:
        writer.close()


async def test_a_header_that_never_ends_is_cut_off_near_the_bound(port: int) -> None:
    await _endless(port, b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Endless: ")


async def test_a_body_larger_than_the_head_bound_is_not_charged_to_the_head(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def post(path: str, body: dict[str, object]) -> tuple[int, bytes]:
        raw = json.dumps(body).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        return await _answer(reader)

    try:
        status, opened = await post("/v1/sessions", {"user_id": "u-1"})
        assert status == 200, opened
        session_id = json.loads(opened)["metadata"]["session_id"]
        text = "word " * (3 * MAX_HEAD_BYTES // 5)  # ~3x the head bound
        for _ in range(2):  # and the next request on the connection starts a fresh head
            status, stored = await post(
                f"/v1/sessions/{session_id}/turns", {"role": "user", "content": text}
            )
            assert status == 201, stored[:200]
        writer.write(_get("/healthz"))
        assert (await _answer(reader))[0] == 200
    finally:
        writer.close()


class _Transport(asyncio.Transport):
    """A transport that keeps what is written. A fake, because the test must choose how
    the bytes are split into reads, which the kernel decides on a real socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _body_length(scope: dict[str, object], receive: object, send: object) -> None:
    """An ASGI app answering each request with its body's length."""
    size, more = 0, True
    while more:
        message = await receive()  # type: ignore[operator]
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": str(size).encode()})  # type: ignore[operator]


async def test_a_head_read_with_a_large_body_ahead_of_it_is_not_charged_for_the_body() -> None:
    import uvicorn
    from uvicorn.server import ServerState

    parser = http_protocol()
    assert not isinstance(parser, str)
    config = uvicorn.Config(_body_length, log_level="error")  # type: ignore[arg-type]
    protocol = parser(  # type: ignore[call-arg]
        config=config,
        server_state=ServerState(),
        app_state={},
        _loop=asyncio.get_running_loop(),
    )
    transport = _Transport()
    protocol.connection_made(transport)
    body = b"x" * (3 * MAX_HEAD_BYTES)
    # One read: a request with its whole body, then the start of the next request's head.
    protocol.data_received(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
        + b"GET /next HTTP/1.1\r\nHo"
    )
    protocol.data_received(b"st: test\r\n\r\n")
    for _ in range(50):
        if transport.written.count(b"HTTP/1.1 200") == 2:
            break
        await asyncio.sleep(0.01)
    assert not transport.closed, bytes(transport.written[:200])
    assert transport.written.count(b"HTTP/1.1 200") == 2
    # (chunked: the body's length, then the second request's 0)
    assert b"\r\n%d\r\n" % len(body) in transport.written
    assert bytes(transport.written).endswith(b"\r\n1\r\n0\r\n0\r\n\r\n")
    protocol.connection_lost(None)


async def test_pipelined_requests_past_the_bound_in_one_write_are_all_answered(
    port: int,
) -> None:
    """Many small requests sent at once: each head is small, so none is refused, though
    a read holds far more than the bound of them."""
    count = 2 * MAX_HEAD_BYTES // len(_get("/healthz")) + 10
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get("/healthz") * count)
        statuses = [(await _answer(reader))[0] for _ in range(count)]
        assert statuses == [200] * count
    finally:
        writer.close()


def _chunked_post(path: str, body: bytes, trailers: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
        + b"%x\r\n%s\r\n0\r\n" % (len(body), body)
        + trailers
    )


async def test_trailers_that_never_end_are_cut_off_near_the_bound(port: int) -> None:
    await _endless(port, _chunked_post("/v1/sessions", b'{"user_id": "u-1"}', b"X-Trailer: "))


@pytest.mark.parametrize("parser", ["httptools"], indirect=True)
async def test_one_requests_trailers_do_not_count_against_the_next_head(port: int) -> None:
    trailers = "".join(f"X-T{n}: {'t' * 1000}\r\n" for n in range(MAX_HEAD_BYTES // 1000 - 20))
    head = "".join(f"X-H{n}: {'h' * 1000}\r\n" for n in range(20))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            _chunked_post("/v1/sessions", b'{"user_id": "u-1"}', trailers.encode() + b"\r\n")
        )
        assert (await _answer(reader))[0] == 200
        writer.write(_get("/healthz", head))
        assert (await _answer(reader))[0] == 200
    finally:
        writer.close()
