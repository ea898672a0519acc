"""CPU of starting DynamoDB-backed services: ``MemoryService.from_settings`` with the
DynamoDB backend, one session opened (the stores' first requests, so their clients are
built), then ``aclose``; ``--services`` of them one after another in one process, as a
worker that builds a service per tenant or per request does.

What it is for: a botocore session parses its endpoint and service-model JSON again for
its first client (the per-session part of a store's start-up), so whether two stores, or
two services, share a session shows here. The table is created first (not counted) with a
session of its own, so the counted part starts from imported modules and nothing cached.

Needs a DynamoDB endpoint (DynamoDB Local: ``TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh``
prints one); dummy credentials are used unless real ones are configured::

    PYTHONPATH=src .venv/bin/python bench/dynamodb_startup_cpu.py \
        --endpoint http://127.0.0.1:8000 [--hot dynamodb|memory] [--services 3] [--sessions 0]

``--sessions K`` also times K bare ``aioboto3.Session()`` + DynamoDB client open/close
(the cost one store paid when it made its own session). Prints one JSON line of CPU
seconds (``time.process_time``). Instruction counts (steadier on a shared machine): run it
under ``valgrind --tool=callgrind`` with ``--services N`` and ``--services 0`` and
subtract.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from typing import Any

import aioboto3

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.dynamodb import create_table


async def _services(settings: TierMemSettings, count: int) -> list[float]:
    spent = []
    for i in range(count):
        start = time.process_time()
        service = MemoryService.from_settings(settings)
        try:
            await service.session(f"bench-start-{uuid.uuid4().hex[:8]}", user_id=f"u-{i}")
        finally:
            await service.aclose()
        spent.append(time.process_time() - start)
    return spent


async def _bare_sessions(endpoint: str, count: int) -> list[float]:
    spent = []
    for _ in range(count):
        start = time.process_time()
        session = aioboto3.Session()
        async with session.client("dynamodb", endpoint_url=endpoint) as client:
            await client.list_tables(Limit=1)
        spent.append(time.process_time() - start)
    return spent


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    table = f"tiermem-bench-{uuid.uuid4().hex[:8]}"
    await create_table(table, endpoint_url=args.endpoint, session=aioboto3.Session())
    settings = TierMemSettings(
        hot_backend=args.hot,
        durable_backend="dynamodb",
        dynamodb_table=table,
        dynamodb_endpoint_url=args.endpoint,
        aws_region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    )
    services = await _services(settings, args.services)
    sessions = await _bare_sessions(args.endpoint, args.sessions)
    return {
        "bench": "dynamodb_startup_cpu",
        "hot": args.hot,
        "services_cpu_s": [round(s, 4) for s in services],
        "bare_session_cpu_s": [round(s, 4) for s in sessions],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=os.environ.get("TIERMEM_TEST_DYNAMODB_URL"))
    parser.add_argument("--hot", choices=["dynamodb", "memory"], default="dynamodb")
    parser.add_argument("--services", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=0)
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("--endpoint (or TIERMEM_TEST_DYNAMODB_URL) is required")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    print(json.dumps(asyncio.run(_main(args))))


if __name__ == "__main__":
    main()
