"""Opens the DynamoDB backend under test against DynamoDB Local (or a real endpoint).

One table serves the whole pytest session: creating a table with its indexes per test
costs more than the test itself, and the conformance tests use fresh random ids, so they
never see each other's data (the claim tests look only at their own sessions).
"""

from __future__ import annotations

import os
import uuid

import aioboto3

from tiermem.clock import FakeClock
from tiermem.store.backends.dynamodb import (
    DynamoDBDurableStore,
    DynamoDBHotStore,
    create_table,
)
from tiermem.testing import BackendUnderTest

__all__ = ["dynamodb_session", "open_dynamodb_backend", "shared_table"]

_tables: dict[str, str] = {}


def dynamodb_session() -> aioboto3.Session:
    """A session with DynamoDB Local's dummy credentials unless real ones are configured."""
    return aioboto3.Session(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    )


async def shared_table(endpoint_url: str) -> str:
    """The name of this pytest session's table at ``endpoint_url``, created on first use."""
    if endpoint_url not in _tables:
        name = f"tiermem-test-{uuid.uuid4().hex[:8]}"
        await create_table(name, endpoint_url=endpoint_url, session=dynamodb_session())
        _tables[endpoint_url] = name
    return _tables[endpoint_url]


async def open_dynamodb_backend(endpoint_url: str, clock: FakeClock) -> BackendUnderTest:
    table = await shared_table(endpoint_url)
    session = dynamodb_session()
    return BackendUnderTest(
        hot=DynamoDBHotStore(table, clock=clock, endpoint_url=endpoint_url, session=session),
        durable=DynamoDBDurableStore(
            table, clock=clock, endpoint_url=endpoint_url, session=session
        ),
        clock=clock,
    )
