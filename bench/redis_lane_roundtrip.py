"""Client CPU of one round trip on the Redis direct lane, against the floor (issue #8).

Times ``N`` sequential ``PING`` round trips three ways on one connection: raw asyncio
(write to the stream, read it, parse with hiredis: the floor any asyncio client pays),
the same with an ``asyncio.timeout`` around each read (what the lane did before its
shared read deadlines), and :meth:`DirectLane.roundtrip
<tiermem.store.backends.redis_scripts.DirectLane.roundtrip>`. CPU time moves with the
machine's load; instruction counts do not: run it under ``valgrind --tool=callgrind``
twice with different ``--n`` and divide the difference, for each ``--mode``::

    PYTHONPATH=src python bench/redis_lane_roundtrip.py --redis-url redis://127.0.0.1:6379/0
    valgrind --tool=callgrind python bench/redis_lane_roundtrip.py --mode lane --n 1000 ...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable

from tiermem.store.backends.redis_scripts import RedisIO, client_from_url, pack_commands

PING = pack_commands([("PING",)])


async def run(url: str, modes: list[str], n: int) -> None:
    client = client_from_url(url)
    lane = RedisIO(client)._direct
    assert lane is not None, "the lane takes standalone clients built by client_from_url"
    await lane.roundtrip(PING, 1)
    conn = lane._idle[-1]
    parser = conn._parser
    writer, stream, reader = conn._writer, parser._stream, parser._reader  # type: ignore[attr-defined]

    async def raw() -> None:
        writer.write(PING)
        while True:
            reader.feed(await stream.read(65536))
            if reader.gets() is not False:
                return

    async def raw_timeout() -> None:
        async with asyncio.timeout(10):
            await raw()

    async def on_lane() -> None:
        await lane.roundtrip(PING, 1)

    calls: dict[str, Callable[[], Awaitable[None]]] = {
        "raw": raw,
        "raw_timeout": raw_timeout,
        "lane": on_lane,
    }
    try:
        for mode in modes:
            call = calls[mode]
            start = time.process_time()
            for _ in range(n):
                await call()
            spent = time.process_time() - start
            print(f"{mode:12s} {spent / n * 1e6:7.1f} µs CPU per round trip")
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TIERMEM_TEST_REDIS_URL"))
    parser.add_argument("--mode", default="raw,raw_timeout,lane")
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    if not args.redis_url:
        raise SystemExit("pass --redis-url or set TIERMEM_TEST_REDIS_URL")
    asyncio.run(run(args.redis_url, args.mode.split(","), args.n))


if __name__ == "__main__":
    main()
