"""DynamoDB faults seen through the REST API and the library, against real DynamoDB Local.

* Unreachable: the durable store talks to DynamoDB Local through a loopback proxy that the
  test severs (listener closed, open connections reset: what a stopped server gives a
  client) and restores. Over REST that is a 503 with ``Retry-After`` and a clear error, no
  half-written turn, and the next request after recovery succeeds at the next index.
* Throttling: DynamoDB Local never throttles, whatever a table's capacity, so the throttle
  is injected on the real client through botocore's ``before-send`` event (the request is
  answered with DynamoDB's own 400 ``ProvisionedThroughputExceededException`` /
  ``ThrottlingException`` body instead of being sent); parsing, retries and backoff are
  botocore's and tiermem's real code paths.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import httpx
import pytest
from aiobotocore.awsrequest import AioAWSResponse

from tests.backends.dynamodb import dynamodb_session, fresh_dynamodb_session, shared_table
from tests.conftest import server_url
from tests.reliability.netfaults import SeveringProxy
from tiermem.client import AsyncTierMemClient
from tiermem.errors import BackendError
from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.dynamodb import DynamoDBDurableStore
from tiermem.store.backends.memory import MemoryHotStore

pytestmark = pytest.mark.dynamodb

TURNS = 6
"""Turns under injected throttling: botocore's own backoff for a throttle is up to a second,
so six are enough to see every throttled request retried without slowing CI."""


@dataclass
class Rest:
    client: httpx.AsyncClient
    service: MemoryService
    durable: DynamoDBDurableStore
    key: str
    app: Any
    tenant: str

    def stored(self, session_id: str) -> str:
        return f"{self.tenant}:{session_id}"


@pytest.fixture
async def proxy() -> AsyncIterator[SeveringProxy]:
    target = urlparse(server_url("dynamodb"))
    assert target.hostname is not None
    assert target.port is not None
    opened = SeveringProxy(target.hostname, target.port)
    await opened.restore()
    try:
        yield opened
    finally:
        await opened.aclose()


async def _rest(endpoint: str, tmp_path: Path, session: Any = None) -> Rest:
    table = await shared_table(server_url("dynamodb"))
    durable = DynamoDBDurableStore(
        table, endpoint_url=endpoint, session=session or dynamodb_session()
    )
    service = MemoryService(MemoryHotStore(), durable)
    keystore = KeyStore(tmp_path / "keys.json")
    # The table is the pytest session's: a tenant of this test's own keeps its ids apart.
    tenant = f"t{uuid.uuid4().hex[:12]}"
    _, key = keystore.create(tenant)
    settings = TierMemSettings(
        sqlite_path=tmp_path / "unused.db",
        api_rate_limit_per_minute=1_000_000,
        api_rate_limit_burst=100_000,
    )
    app = create_app(settings, service=service, keystore=keystore)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app),
        base_url="http://testserver",
        headers={"Authorization": f"Bearer {key}"},
    )
    return Rest(client, service, durable, key, app, tenant)


async def _close(rest: Rest) -> None:
    await rest.client.aclose()
    await rest.service.aclose()


def _is_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    error = r.json()["error"]
    assert error["code"] == "unavailable"
    assert "dynamodb" in error["message"]
    assert "127.0.0.1" not in error["message"]  # where the backend lives stays in the log


async def test_dynamodb_unreachable_is_a_503_with_nothing_half_written_then_recovers(
    proxy: SeveringProxy, tmp_path: Path
) -> None:
    rest = await _rest(proxy.url, tmp_path)
    client = rest.client
    try:
        r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
        assert r.status_code == 200, r.text
        for n in range(3):
            r = await client.post(
                "/v1/sessions/s-1/turns", json={"role": "user", "content": f"t{n}"}
            )
            assert r.status_code == 201, r.text
        await rest.service.drain()

        await proxy.sever()
        _is_unavailable(
            await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "lost"})
        )
        _is_unavailable(
            await client.post("/v1/sessions", json={"user_id": "u-2", "session_id": "s-2"})
        )
        _is_unavailable(await client.get("/v1/sessions/s-1/turns"))
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        # "timeout" when botocore's retries of the refused connection outlast the probe.
        assert ready.json()["backends"]["durable"].startswith(("unavailable", "timeout"))

        await proxy.restore()
        assert (await client.get("/readyz")).status_code == 200
        r = await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "back"})
        assert r.status_code == 201, r.text
        assert r.json()["index"] == 3  # the refused turn took no index
        turns = (await client.get("/v1/sessions/s-1/turns")).json()["turns"]
        assert [t["content"][0]["text"] for t in turns] == ["t0", "t1", "t2", "back"]
        # The refused session open left no trace either: it opens fresh now.
        r = await client.post("/v1/sessions", json={"user_id": "u-2", "session_id": "s-2"})
        assert r.status_code == 200
        assert r.json()["stats"]["turn_count"] == 0
    finally:
        await _close(rest)


async def test_outages_during_a_load_through_the_sdk_lose_nothing(
    proxy: SeveringProxy, tmp_path: Path
) -> None:
    """Connections reset mid-request while eight SDK clients write: the SDK retries 503s and
    lost answers with its idempotency key, so every turn lands exactly once."""
    rest = await _rest(proxy.url, tmp_path)
    sdk = AsyncTierMemClient(
        "http://testserver",
        api_key=rest.key,
        transport=httpx.ASGITransport(rest.app),
        max_retries=20,
        max_retry_wait=0.2,
    )
    per_session = 25
    acked: dict[str, list[int]] = {}
    try:

        async def load(session_id: str) -> None:
            session = await sdk.open_session("u-1", session_id)
            mine = acked.setdefault(session_id, [])
            for n in range(per_session):
                turn = await session.add_turn("user", f"{session_id} {n}")
                mine.append(turn.index)

        async def faults() -> None:
            for _ in range(2):
                await asyncio.sleep(0.3)
                await proxy.sever()
                await asyncio.sleep(0.3)
                await proxy.restore()

        await asyncio.gather(faults(), *(load(f"s-{n}") for n in range(8)))
        for session_id, indexes in acked.items():
            assert indexes == list(range(per_session)), session_id
            archived = await rest.durable.get_turns(rest.stored(session_id), 0, None)
            texts = [t.text for t in archived]
            assert texts == [f"{session_id} {n}" for n in range(per_session)], session_id
    finally:
        await sdk.aclose()
        await _close(rest)


class InjectedThrottle:
    """Answers chosen DynamoDB requests with a throttling error instead of sending them.

    ``throttle(n)`` decides from the running count of sends whether send ``n`` is refused.
    """

    BODY: ClassVar[dict[str, tuple[str, str]]] = {
        "ProvisionedThroughputExceededException": (
            "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            "The level of configured provisioned throughput for the table was exceeded.",
        ),
        "ThrottlingException": (
            "com.amazon.coral.availability#ThrottlingException",
            "Rate of requests exceeds the allowed throughput.",
        ),
    }

    def __init__(self, throttle: Callable[[int], bool], code: str) -> None:
        self.throttle = throttle
        self.code = code
        self.sends = 0
        self.throttled = 0

    def __call__(self, request: Any, **_: Any) -> AioAWSResponse | None:
        n, self.sends = self.sends, self.sends + 1
        if not self.throttle(n):
            return None
        self.throttled += 1
        kind, message = self.BODY[self.code]
        body = json.dumps({"__type": kind, "message": message}).encode()
        return AioAWSResponse(
            request.url,
            400,
            {"content-type": "application/x-amz-json-1.0", "x-amzn-requestid": f"t{n}"},
            _Raw(body),
        )


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def stream(self, **_: Any) -> Any:  # pragma: no cover - only for streaming operations
        raise NotImplementedError


def _throttled_session(hook: InjectedThrottle) -> Any:
    session = fresh_dynamodb_session()
    # The botocore session under aioboto3's: every client made from it emits this event.
    session._session.register("before-send.dynamodb", hook)
    return session


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
async def test_throttled_requests_are_retried_with_backoff_and_nothing_is_lost(
    code: str, tmp_path: Path
) -> None:
    # Every third send is throttled: each throttled request succeeds on botocore's retry.
    hook = InjectedThrottle(lambda n: n % 3 == 0, code)
    rest = await _rest(server_url("dynamodb"), tmp_path, session=_throttled_session(hook))
    client = rest.client
    try:
        r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
        assert r.status_code == 200, r.text
        for n in range(TURNS):
            r = await client.post(
                "/v1/sessions/s-1/turns", json={"role": "user", "content": f"t{n}"}
            )
            assert r.status_code == 201, r.text
            assert r.json()["index"] == n
        await rest.service.drain()
        assert hook.throttled >= TURNS // 2  # the throttles happened and were absorbed
        archived = await rest.durable.get_turns(rest.stored("s-1"), 0, None)
        assert [t.text for t in archived] == [f"t{n}" for n in range(TURNS)]

        # Throttled past botocore's attempts: a retryable error, a 503, nothing written.
        hook.throttle = lambda n: True
        r = await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "x"})
        _is_unavailable(r)
        with pytest.raises(BackendError) as info:
            await rest.durable.get_turns(rest.stored("s-1"), 0, None)
        assert info.value.retryable
        assert "throttled" in str(info.value)
        hook.throttle = lambda n: False
        archived = await rest.durable.get_turns(rest.stored("s-1"), 0, None)
        assert len(archived) == TURNS
        r = await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "y"})
        assert r.json()["index"] == TURNS
    finally:
        await _close(rest)
