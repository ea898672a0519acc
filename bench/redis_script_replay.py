"""redis-server's instructions per Lua script change, without the client's noise (issue #8).

``capture`` runs ``bench/turn_cpu.py``'s plain turn (``add_turn`` then ``history()``,
background drained) on a Redis + Redis service (``--dynamodb-url``: Redis + DynamoDB, the
hot tier's calls) and records every round trip of the direct lane, as the bytes it
wrote; ``replay`` writes them again, in order, to a fresh server, after loading every
script of the tree on ``PYTHONPATH``: ``--variant NAME=FILE`` loads FILE as script NAME
instead (its SHA1 replaces the former one in the recorded calls) and ``--skip NAME``
leaves out the calls of NAME. Replies are not compared; errors are counted and printed.
Recorded arguments hold the capture's clock (``now``), so a replay runs the same branches
each time: under callgrind, two replays of captures of N and M turns give the server's
instructions per turn, ``(I(M) - I(N)) / (M - N)``, for the scripts as they are and as
changed, without running the client under valgrind::

    PYTHONPATH=src:bench python bench/redis_script_replay.py capture \\
        --redis-url redis://127.0.0.1:6379/0 --turns 2500 --out /tmp/c2500.pkl
    bench/redis_script_replay.sh "$PWD" /tmp/c2500.pkl /tmp/rp-2500 [--variant ...]

(The server's cron, ``serverCron``, runs by wall time, ~50x more often per command under
valgrind: subtract it, as ``redis_script_replay.sh`` does.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import importlib
import json
import socket
import struct
import uuid
from pathlib import Path
from typing import Any

import hiredis

SCRIPT_MODULES = (
    "tiermem.store.backends.redis_scripts",
    "tiermem.longterm.index_redis_scripts",
    "tiermem.store.backends.redis_append",
    "tiermem.store.backends.redis_hot",
    "tiermem.store.backends.redis_durable",
)


def scripts() -> dict[str, Any]:
    """Every LuaScript the library defines, by name."""
    from tiermem.store.backends.redis_scripts import LuaScript

    found = {}
    for module in SCRIPT_MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, LuaScript):
                found[value.name] = value
    return found


def capture(
    url: str, turns: int, out: Path, workload: str, dynamodb_url: str | None = None
) -> None:
    import turn_cpu
    from tiermem.service import MemoryService
    from tiermem.settings import TierMemSettings
    from tiermem.store.backends import redis_scripts
    from workload import redis_dynamodb_settings

    log: list[tuple[bytes, int]] = []
    lane = redis_scripts.DirectLane
    original = lane.roundtrip

    async def recorded(self: Any, packed: bytes, count: int, *, coalesce: bool = True) -> Any:
        log.append((packed, count))
        return await original(self, packed, count, coalesce=coalesce)

    lane.roundtrip = recorded  # type: ignore[method-assign]
    prefix = f"rp{uuid.uuid4().hex[:6]}"
    if dynamodb_url is None:
        settings = TierMemSettings(
            hot_backend="redis", durable_backend="redis", redis_url=url, redis_prefix=prefix
        )
    else:  # Redis + DynamoDB: only the hot tier's round trips are Redis's
        settings = asyncio.run(redis_dynamodb_settings(url, dynamodb_url, prefix))

    def service(pairing: str, tmp: Path, *, summaries: bool = False) -> MemoryService:
        return MemoryService.from_settings(settings, auto_summarize=summaries)

    turn_cpu._service = service
    asyncio.run(turn_cpu.measure("redis+redis", turns, workload=workload))
    # The scripts' SHA1s by name (a replay maps them to its tree's), then each round trip
    # as its length and reply count (u32 each) and the bytes written.
    head = json.dumps({name: script.sha for name, script in scripts().items()}).encode()
    body = b"".join(struct.pack("<II", len(p), n) + p for p, n in log)
    out.write_bytes(struct.pack("<I", len(head)) + head + body)
    print(f"{len(log)} round trips recorded in {out}")


def replay(path: str, recorded: Path, variants: dict[str, str], skip: list[str]) -> None:
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    reader = hiredis.Reader()

    def roundtrip(packed: bytes, count: int) -> list[Any]:
        conn.sendall(packed)
        replies: list[Any] = []
        while len(replies) < count:
            reply = reader.gets()
            if reply is False:
                reader.feed(conn.recv(1 << 20))
            else:
                replies.append(reply)
        return replies

    data = recorded.read_bytes()
    (size,) = struct.unpack_from("<I", data)
    captured: dict[str, str] = json.loads(data[4 : 4 + size])
    at, calls = 4 + size, []
    swap: dict[bytes, bytes] = {}
    for name, script in scripts().items():
        source = Path(variants[name]).read_text() if name in variants else script.source
        roundtrip(hiredis.pack_command(("SCRIPT", "LOAD", source)), 1)
        sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        if name in captured and sha != captured[name]:
            swap[captured[name].encode()] = sha.encode()
    skipped = [captured[name].encode() for name in skip]
    errors: collections.Counter[str] = collections.Counter()
    while at < len(data):
        size, count = struct.unpack_from("<II", data, at)
        calls.append((data[at + 8 : at + 8 + size], count))
        at += 8 + size
    for packed, count in calls:
        if packed.startswith(b"*3\r\n$6\r\nSCRIPT") or any(s in packed for s in skipped):
            continue
        for old, new in swap.items():
            packed = packed.replace(old, new)
        for reply in roundtrip(packed, count):
            for part in reply if isinstance(reply, list) else [reply]:
                if isinstance(part, hiredis.ReplyError):
                    errors[str(part)[:80]] += 1
    print(f"replayed {len(calls)} round trips; errors: {dict(errors)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("--redis-url", required=True)
    cap.add_argument("--turns", type=int, required=True)
    cap.add_argument("--out", type=Path, required=True)
    cap.add_argument("--workload", default="bench")
    cap.add_argument(
        "--dynamodb-url", help="capture a Redis + DynamoDB service (the hot tier's calls)"
    )
    rep = sub.add_parser("replay")
    rep.add_argument("--socket", required=True, help="the fresh server's unix socket")
    rep.add_argument("--capture", type=Path, required=True)
    rep.add_argument("--variant", action="append", default=[], help="NAME=FILE")
    rep.add_argument("--skip", action="append", default=[], help="a script's name")
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.redis_url, args.turns, args.out, args.workload, args.dynamodb_url)
    else:
        variants = dict(v.split("=", 1) for v in args.variant)
        replay(args.socket, args.capture, variants, args.skip)


if __name__ == "__main__":
    main()
