"""Opens the DynamoDB backend under test against DynamoDB Local (or a real endpoint).

One table serves the whole pytest session: creating a table with its indexes per test
costs more than the test itself, and the conformance tests use fresh random ids, so they
never see each other's data (the claim tests look only at their own sessions).

One aioboto3 session serves the whole pytest session too: a new session parses botocore's
endpoint and service-model JSON again for its first client (about 0.2 s of CPU, paid by
every DynamoDB test when each made its own), while a session's clients are made per store
inside each test's own event loop. A test that changes a session (registers an event
handler, sets ``user_agent_extra``) takes :func:`fresh_dynamodb_session` instead, so the
change cannot leak into later tests.

Both kinds of session skip loading the CA bundle for a plain ``http://`` endpoint (as
DynamoDB Local's is): botocore loads certifi's ~150 certificates into an SSL context for
every client (~50 ms of CPU) even when the endpoint never speaks TLS.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import aioboto3

from tiermem.clock import FakeClock
from tiermem.store.backends.dynamodb import (
    DynamoDBDurableStore,
    DynamoDBHotStore,
    create_table,
)
from tiermem.testing import BackendUnderTest

__all__ = [
    "dynamodb_session",
    "fresh_dynamodb_session",
    "open_dynamodb_backend",
    "shared_table",
]

_tables: dict[str, str] = {}
_shared: list[aioboto3.Session] = []  # at most one: this pytest process's session


class _TestSession(aioboto3.Session):  # type: ignore[misc]  # aioboto3 has no type hints
    """A session whose clients for a plain-http endpoint load no CA bundle (no TLS there:
    nothing on the wire changes); an https endpoint is verified as usual."""

    def client(self, *args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("endpoint_url") or "").startswith("http://"):
            kwargs.setdefault("verify", False)
        return super().client(*args, **kwargs)


def fresh_dynamodb_session() -> aioboto3.Session:
    """A new session with DynamoDB Local's dummy credentials unless real ones are
    configured: for a test that changes the session it uses."""
    return _TestSession(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    )


def dynamodb_session() -> aioboto3.Session:
    """This pytest process's session (see the module docstring); never change it."""
    if not _shared:
        _shared.append(fresh_dynamodb_session())
    return _shared[0]


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
