"""A client on a private database of the test redis-server, for tests that SCAN or FLUSH.

Database 0 holds every other test's keys: a test that scans the keyspace or flushes it
works in a database of its own (each such module picks a number no other module uses).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis

from tests.conftest import server_url


@contextmanager
def private_db(db: int) -> Iterator[redis.Redis]:
    """A synchronous client on database ``db`` of the suite's redis-server, closed after."""
    url = urlsplit(server_url("redis"))._replace(path=f"/{db}").geturl()
    client = redis.Redis.from_url(url)
    assert client.connection_pool.connection_kwargs["db"] == db
    try:
        yield client
    finally:
        client.close()
