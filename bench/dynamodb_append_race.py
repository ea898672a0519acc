"""Appends of one session racing from K processes on DynamoDB: transactions sent per
committed append, and the most transactions one append needed (the limit is
``dynamodb_table.MAX_ATTEMPTS``; past it the append fails with "lost to concurrent writers").

Each "process" is a :class:`DynamoDBDurableStore` of its own (its own lane and header
memory, so its appends race the others' by condition, as separate processes do), all in one
event loop, each appending ``--appends`` single turns to one session as fast as it can.
Needs a DynamoDB endpoint (``TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh`` prints one)::

    PYTHONPATH=src .venv/bin/python bench/dynamodb_append_race.py \
        --endpoint http://127.0.0.1:8000 [--processes 4] [--appends 30]

Prints one JSON line. Results vary from run to run (scheduling decides who wins a round):
compare several runs of the old and new code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections import defaultdict
from typing import Any

import aioboto3

from tiermem.errors import BackendError
from tiermem.store.backends import dynamodb_durable
from tiermem.store.backends.dynamodb import DynamoDBDurableStore, create_table
from tiermem.testing.backend import text_turn


async def _race(endpoint: str, processes: int, appends: int) -> dict[str, Any]:
    session = aioboto3.Session()
    table = f"tiermem-race-{uuid.uuid4().hex[:8]}"
    await create_table(table, endpoint_url=endpoint, session=session)
    tries: dict[asyncio.Task[Any] | None, int] = defaultdict(int)
    sent = 0
    original = dynamodb_durable.DynamoDBDurableStore._commit

    async def counted(self: DynamoDBDurableStore, *args: Any, **kwargs: Any) -> None:
        # Every transaction an append sends goes through _commit: counted per task.
        nonlocal sent
        tries[asyncio.current_task()] += 1
        sent += 1
        await original(self, *args, **kwargs)

    dynamodb_durable.DynamoDBDurableStore._commit = counted  # type: ignore[method-assign]
    session_id = f"race-{uuid.uuid4().hex[:8]}"
    worst = committed = failed = 0

    async def process(p: int) -> None:
        nonlocal worst, committed, failed
        async with session.client("dynamodb", endpoint_url=endpoint) as client:
            store = DynamoDBDurableStore(table, client=client)
            for i in range(appends):
                task = asyncio.current_task()
                tries[task] = 0
                try:
                    await store.append_turns(session_id, [text_turn(f"p{p} turn {i}")])
                    committed += 1
                except BackendError:
                    failed += 1
                worst = max(worst, tries[task])

    start = time.monotonic()
    await asyncio.gather(*(process(p) for p in range(processes)))
    return {
        "bench": "dynamodb_append_race",
        "processes": processes,
        "appends_each": appends,
        "committed": committed,
        "gave_up": failed,
        "transactions": sent,
        "worst_transactions_one_append": worst,
        "wall_s": round(time.monotonic() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=os.environ.get("TIERMEM_TEST_DYNAMODB_URL"))
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--appends", type=int, default=30)
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("--endpoint (or TIERMEM_TEST_DYNAMODB_URL) is required")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    print(json.dumps(asyncio.run(_race(args.endpoint, args.processes, args.appends))))


if __name__ == "__main__":
    main()
