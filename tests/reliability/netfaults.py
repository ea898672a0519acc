"""Network faults between tiermem and a real server: a loopback TCP proxy that can go away.

:class:`SeveringProxy` forwards a local port to a real server (DynamoDB Local). ``sever()``
closes its listener and resets every open connection, so a client sees exactly what a
stopped server gives it (connection refused, connections reset mid-request); ``restore()``
listens again on the same port, as a server that came back. The server itself never stops,
so the test pays for no restart and its data is as the server committed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["SeveringProxy"]


class SeveringProxy:
    """A TCP proxy on ``127.0.0.1:<port>`` to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def restore(self) -> None:
        """Listen (again)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def sever(self) -> None:
        """Stop listening and reset every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            transport = writer.transport
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # RST, not a polite FIN: the peer's request is cut off
        self._writers.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                self._writers.discard(dst)
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def aclose(self) -> None:
        await self.sever()
