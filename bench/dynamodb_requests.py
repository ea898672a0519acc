"""CPU per DynamoDB request through the stores' one door (issue #8): ``--pairs`` times a
GetItem and a TransactWriteItems of two puts, through
:class:`~tiermem.store.backends.dynamodb_table.DynamoDBTable` (botocore serialise, endpoint
rules, signing, aiohttp, parse), on a new table of DynamoDB Local::

    PYTHONPATH=src:bench python bench/dynamodb_requests.py --dynamodb-url URL [--pairs 1000]

Prints the process CPU µs per pair. For instructions, ``bench/dynamodb_request_callgrind.sh``
runs it under callgrind at two pair counts (start-up and warm-up cancel out).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from typing import Any

from tiermem.store.backends.dynamodb_table import DynamoDBTable, create_table

WARM_UP = 50


async def measure(url: str, pairs: int) -> float:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")  # DynamoDB Local takes any
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    name = "requests" + secrets.token_hex(4)
    await create_table(name, endpoint_url=url, region_name="us-east-1")
    table = DynamoDBTable(name, endpoint_url=url, region_name="us-east-1")
    key = {"pk": {"S": "S#x"}, "sk": {"S": "M"}}

    def item(i: int) -> dict[str, Any]:
        return {"pk": {"S": "S#x"}, "sk": {"S": f"T#{i:08d}"}, "d": {"S": "hello " * 40}}

    async def pair(i: int) -> None:
        await table.call("get_item", TableName=name, Key=key)
        puts = [{"Put": {"TableName": name, "Item": item(2 * i + j)}} for j in (0, 1)]
        await table.call("transact_write_items", TransactItems=puts)

    try:
        for i in range(WARM_UP):
            await pair(i)
        cpu0 = time.process_time()
        for i in range(WARM_UP, WARM_UP + pairs):
            await pair(i)
        return (time.process_time() - cpu0) / pairs * 1e6
    finally:
        await table.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamodb-url", default=os.environ.get("TIERMEM_TEST_DYNAMODB_URL"))
    parser.add_argument("--pairs", type=int, default=1000)
    args = parser.parse_args()
    if not args.dynamodb_url:
        parser.error("--dynamodb-url (or TIERMEM_TEST_DYNAMODB_URL) is required")
    cpu = asyncio.run(measure(args.dynamodb_url, args.pairs))
    print(f"{cpu:.1f} µs CPU per GetItem + TransactWriteItems pair")


if __name__ == "__main__":
    main()
