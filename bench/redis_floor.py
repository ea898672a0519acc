"""The floor under a Redis turn (issue #8): the CPU one bare round trip costs the client
process and redis-server on this machine, before any of tiermem's work.

A plain Redis + Redis turn makes two round trips on its response path (the append script,
then ``history()``'s load script), which the issue sets as the target. Whatever tiermem
does, each of them costs the client a ``send``, a wake-up and a ``recv``, and costs
redis-server a wake-up, a read, a command and a write. This bench times exactly that, with
nothing of tiermem around it, so that a turn's measured CPU can be split into "the floor
of its round trips" and "tiermem's own work"::

    python bench/redis_floor.py --redis-url redis://127.0.0.1:6379/0 [--n 20000]

Modes (each on fresh connections, ``--n`` round trips in all, shared by ``c`` clients
that each wait for their reply before sending again):

- ``socket``: a blocking socket, ``sendall`` then ``recv`` (c=1 only): the least a
  Python process can pay;
- ``asyncio`` / ``uvloop``: ``asyncio.open_connection`` streams and a hiredis reader on
  that event loop: the least an asyncio client pays (tiermem's lane adds its pool and
  deadlines, ``bench/redis_lane_roundtrip.py``);
- each with ``PING`` and with ``EVALSHA`` of a script that returns 1 (the fixed cost of a
  script call on the server).

Client CPU is this process's CPU time; redis-server's is ``used_cpu_sys`` +
``used_cpu_user`` from ``INFO cpu`` (its whole process), read before and after. Writes
``bench/results/redis_floor.json``. µs figures move with the host's load; run it beside
the turn benches it is compared with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hiredis

from workload import RESULTS, write_results

SCRIPT = "return 1"


def pack(*args: str) -> bytes:
    return hiredis.pack_command(args)


def ask(sock: socket.socket, *args: str) -> Any:
    """One command on a blocking socket, and its reply."""
    sock.sendall(pack(*args))
    reader = hiredis.Reader()
    while (reply := reader.gets()) is False:
        reader.feed(sock.recv(65536))
    return reply


def server_cpu_s(sock: socket.socket) -> float:
    """redis-server's process CPU seconds (user + sys), from INFO cpu."""
    reply = ask(sock, "INFO", "cpu")
    fields = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
    return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])


def blocking_rounds(host: str, port: int, command: bytes, n: int) -> None:
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = hiredis.Reader()
        for _ in range(n):
            sock.sendall(command)
            while reader.gets() is False:
                reader.feed(sock.recv(65536))


async def stream_rounds(host: str, port: int, command: bytes, n: int, clients: int) -> None:
    async def one(count: int) -> None:
        stream, writer = await asyncio.open_connection(host, port)
        reader = hiredis.Reader()
        try:
            for _ in range(count):
                writer.write(command)
                while reader.gets() is False:
                    reader.feed(await stream.read(65536))
        finally:
            writer.close()

    share, extra = divmod(n, clients)
    await asyncio.gather(*(one(share + (i < extra)) for i in range(clients)))


def run_loop(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def measure(
    host: str, port: int, probe: socket.socket, mode: str, command: str, n: int, clients: int
) -> dict[str, Any]:
    packed = pack("PING") if command == "PING" else pack("EVALSHA", sha(probe), "0")
    # warm: connect once and run a few round trips, so first-use costs are not counted
    if mode == "socket":
        blocking_rounds(host, port, packed, 200)
    else:
        run_loop(mode, lambda: stream_rounds(host, port, packed, 200, clients))
    server0, client0, wall0 = server_cpu_s(probe), time.process_time(), time.perf_counter()
    if mode == "socket":
        blocking_rounds(host, port, packed, n)
    else:
        run_loop(mode, lambda: stream_rounds(host, port, packed, n, clients))
    client, wall = time.process_time() - client0, time.perf_counter() - wall0
    server = server_cpu_s(probe) - server0
    return {
        "mode": mode,
        "command": command,
        "clients": clients,
        "round_trips": n,
        "client_cpu_us_per_round_trip": round(client / n * 1e6, 1),
        "server_cpu_us_per_round_trip": round(server / n * 1e6, 1),
        "round_trips_per_s": round(n / wall),
    }


def sha(probe: socket.socket) -> str:
    return str(ask(probe, "SCRIPT", "LOAD", SCRIPT).decode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--n", type=int, default=20000, help="round trips per measurement")
    parser.add_argument("--clients", default="1,50", help="concurrent clients, comma-separated")
    parser.add_argument("--modes", default="socket,asyncio,uvloop")
    parser.add_argument("--out", type=Path, default=RESULTS / "redis_floor.json")
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("--redis-url (or TIERMEM_TEST_REDIS_URL) is required")
    url = urlsplit(args.redis_url)
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    results = []
    with socket.create_connection((host, port)) as probe:
        for clients in (int(c) for c in args.clients.split(",")):
            for mode in args.modes.split(","):
                if mode == "socket" and clients != 1:
                    continue
                for command in ("PING", "EVALSHA"):
                    row = measure(host, port, probe, mode, command, args.n, clients)
                    results.append(row)
                    print(
                        f"{mode:8s} {command:8s} c={clients:<3d} client "
                        f"{row['client_cpu_us_per_round_trip']:6.1f} µs  server "
                        f"{row['server_cpu_us_per_round_trip']:6.1f} µs  "
                        f"{row['round_trips_per_s']:7d} round trips/s"
                    )
    write_results(args.out, results, redis_url_host=host, load_average_1_5_15=os.getloadavg())


if __name__ == "__main__":
    main()
