"""What a DynamoDB request costs the client: how many a record write takes, and the header
every request carries (issue #8). Runs against DynamoDB Local (``TIERMEM_TEST_DYNAMODB_URL``).

A record rewrite goes straight to its transaction when the store remembers the session's
META and the record's stamp (version, tag, item count); these tests check that it does, and
that a stale memory (another store wrote) never loses a write or a version check.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore
import pytest

from tests.backends.dynamodb import dynamodb_session, fresh_dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.errors import ConflictError
from tiermem.models import ActiveEntity
from tiermem.store.backends.dynamodb import DynamoDBDurableStore
from tiermem.store.contract import ENTITIES_RECORD, EntityChange
from tiermem.testing.backend import fresh_id, text_turn

pytestmark = pytest.mark.dynamodb

DAY = timedelta(days=1)


class _Requests:
    """DynamoDB requests by operation, counted at aiobotocore's one door
    (``AioBaseClient._make_api_call``), whichever client a store uses."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> _Requests:
    from aiobotocore.client import AioBaseClient

    counter = _Requests()
    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation: str, params: Any) -> Any:
        counter.calls.append(operation)
        return await original(self, operation, params)

    monkeypatch.setattr(AioBaseClient, "_make_api_call", counted)
    return counter


@pytest.fixture
async def table() -> str:
    return await shared_table(server_url("dynamodb"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2030, 1, 1, tzinfo=UTC))


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    async with dynamodb_session().client("dynamodb", endpoint_url=server_url("dynamodb")) as c:
        yield c


def _store(table: str, clock: FakeClock, client: Any) -> DynamoDBDurableStore:
    """A store of its own: another process, with its own memory of the sessions."""
    return DynamoDBDurableStore(table, clock=clock, wall_clock=clock, client=client)


async def test_a_record_rewrite_is_one_request_once_the_store_knows_it(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    store, sid = _store(table, clock, client), fresh_id("s")
    later = clock.now() + DAY
    await store.put_record(sid, "summary", {"n": 1}, expires_at=later)
    assert sorted(requests.take()) == ["GetItem", "GetItem", "TransactWriteItems"]
    for n in (2, 3):
        record = await store.put_record(sid, "summary", {"n": n}, expires_at=later)
        assert record.version == n
        assert requests.take() == ["TransactWriteItems"]
    # A record this store only read is as good as one it wrote.
    other = _store(table, clock, client)
    got = await other.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (3, {"n": 3})
    requests.take()
    written = await other.put_record(sid, "summary", {"n": 4}, expected_version=3)
    assert written.version == 4
    assert requests.take() == ["TransactWriteItems"]
    final = await store.get_record(sid, "summary")
    assert final is not None
    assert (final.version, final.data) == (4, {"n": 4})


async def test_a_stale_memory_of_a_record_never_loses_the_other_write(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"by": "mine"}, expires_at=later)
    await theirs.put_record(sid, "summary", {"by": "theirs"}, expires_at=later)
    requests.take()
    # Mine remembers version 1: its transaction fails on META, then it reads and writes 3.
    record = await mine.put_record(sid, "summary", {"by": "mine again"})
    assert record.version == 3
    assert requests.take() == ["TransactWriteItems", "GetItem", "GetItem", "TransactWriteItems"]
    got = await theirs.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (3, {"by": "mine again"})


async def test_expected_version_is_checked_against_the_table_not_a_stale_memory(
    table: str, clock: FakeClock, client: Any
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "state", {"v": 1}, expires_at=later)
    await theirs.put_record(sid, "state", {"v": 2}, expected_version=1)
    # Mine remembers version 1, the table has 2: the caller who says 2 is right.
    assert (await mine.put_record(sid, "state", {"v": 3}, expected_version=2)).version == 3
    await theirs.put_record(sid, "state", {"v": 4}, expected_version=3)
    with pytest.raises(ConflictError) as conflict:
        await mine.put_record(sid, "state", {"v": 5}, expected_version=3)
    assert conflict.value.actual == 4


async def test_a_remembered_record_of_a_dead_session_does_not_carry_into_its_next_life(
    table: str, clock: FakeClock, client: Any
) -> None:
    store, sid = _store(table, clock, client), fresh_id("s")
    lifetime = clock.now() + DAY
    await store.put_record(sid, "summary", {"life": 1}, expires_at=lifetime)
    await store.put_record(sid, "summary", {"life": 1, "again": True}, expires_at=lifetime)
    clock.advance(2 * DAY)
    record = await store.put_record(sid, "summary", {"life": 2}, expires_at=clock.now() + DAY)
    assert (record.version, record.data) == (1, {"life": 2})
    got = await _store(table, clock, client).get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (1, {"life": 2})


async def test_record_reads_of_a_session_asked_for_together_share_one_request(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    writer, sid = _store(table, clock, client), fresh_id("s")
    later = clock.now() + DAY
    await writer.put_record(sid, "summary", {"k": "summary"}, expires_at=later)
    await writer.put_record(sid, "structured", {"k": "structured"}, expires_at=later)
    reader, elsewhere = _store(table, clock, client), fresh_id("s")
    await writer.put_record(elsewhere, "summary", {"k": "elsewhere"}, expires_at=later)
    requests.take()
    summary, structured, missing, other = await asyncio.gather(
        reader.get_record(sid, "summary"),
        reader.get_record(sid, "structured"),
        reader.get_record(sid, "watermarks"),
        reader.get_record(elsewhere, "summary"),
    )
    assert summary is not None
    assert summary.data == {"k": "summary"}
    assert structured is not None
    assert structured.data == {"k": "structured"}
    assert missing is None
    assert other is not None
    assert other.data == {"k": "elsewhere"}
    # One request per session, not one per record.
    assert requests.take() == ["BatchGetItem", "BatchGetItem"]
    # Asked for one after the other, each read is its own request and sees the last write.
    await writer.put_record(sid, "summary", {"k": "summary 2"})
    again = await reader.get_record(sid, "summary")
    assert again is not None
    assert (again.version, again.data) == (2, {"k": "summary 2"})


async def test_a_record_write_keeps_what_the_store_knows_of_the_entities(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    store, sid = _store(table, clock, client), fresh_id("s")
    later = clock.now() + DAY

    def change(kind: str, value: str, index: int) -> EntityChange:
        entity = ActiveEntity(kind=kind, value=value, turn_index=index, updated_at=clock.now())
        return EntityChange(upsert={kind: entity})

    await store.append_turns(
        sid, [text_turn("Berserk")], expires_at=later, entities=change("series", "Berserk", 0)
    )
    await store.put_record(sid, "summary", {"n": 1}, expires_at=later)
    requests.take()
    # The summary write did not touch the entities record: the merge needs no Query.
    await store.append_turns(
        sid, [text_turn("vol 42")], expires_at=later, entities=change("volume", "42", 1)
    )
    assert requests.take() == ["TransactWriteItems"]
    record = await _store(table, clock, client).get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert (record.version, sorted(record.data)) == (2, ["series", "volume"])


async def test_every_request_carries_the_fixed_user_agent(table: str) -> None:
    """The header is built once (botocore would rebuild it twice per request) and still
    names botocore, aiobotocore and tiermem."""
    session = fresh_dynamodb_session()
    seen: list[str] = []

    def capture(request: Any, **_: Any) -> None:
        value = request.headers["User-Agent"]  # bytes once the request is prepared
        seen.append(value.decode() if isinstance(value, bytes) else value)

    session.events.register("before-send.dynamodb", capture)
    store = DynamoDBDurableStore(table, endpoint_url=server_url("dynamodb"), session=session)
    try:
        sid = fresh_id("s")
        await store.put_record(sid, "summary", {"n": 1})
        await store.get_record(sid, "summary")
    finally:
        await store.aclose()
    assert len(seen) >= 3
    agent = seen[0]
    assert set(seen) == {agent}
    assert agent.startswith(f"Botocore/{botocore.__version__} ")
    assert "md/aiobotocore#" in agent
    assert "lib/tiermem#" in agent


class _HoldingBack:
    """The real DynamoDB Local client, but its first ``BatchGetItem`` answers every key
    unprocessed (what DynamoDB does under throttling or past 16 MB) and, with ``fail``, every
    ``BatchGetItem`` raises. A stub because DynamoDB Local never leaves keys unprocessed
    and cannot be made to fail one request on demand; everything else goes to the server."""

    def __init__(self, real: Any, *, fail: Exception | None = None) -> None:
        self._real = real
        self._fail = fail
        self.held_back = 0
        self.retried: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def batch_get_item(self, **kwargs: Any) -> dict[str, Any]:
        if self._fail is not None:
            await asyncio.sleep(0)
            raise self._fail
        if not self.held_back:
            self.held_back += 1
            return {"Responses": {}, "UnprocessedKeys": kwargs["RequestItems"]}
        self.retried.append(kwargs["RequestItems"])
        response: dict[str, Any] = await self._real.batch_get_item(**kwargs)
        return response


async def test_keys_left_unprocessed_are_read_again_never_taken_as_absent(
    table: str, clock: FakeClock, client: Any
) -> None:
    sid, later = fresh_id("s"), clock.now() + DAY
    await _store(table, clock, client).put_record(sid, "summary", {"n": 1}, expires_at=later)
    stub = _HoldingBack(client)
    got = await _store(table, clock, stub).get_record(sid, "summary")
    assert stub.held_back == 1
    assert got is not None
    assert got.data == {"n": 1}
    # The second request is the unprocessed keys as given back: still strongly consistent.
    assert [r[table]["ConsistentRead"] for r in stub.retried] == [True]


async def test_a_failed_shared_read_reaches_every_reader_and_a_cancelled_one_no_other(
    table: str, clock: FakeClock, client: Any
) -> None:
    from botocore.exceptions import EndpointConnectionError

    from tiermem.errors import BackendUnavailableError

    sid, later = fresh_id("s"), clock.now() + DAY
    writer = _store(table, clock, client)
    await writer.put_record(sid, "summary", {"k": "summary"}, expires_at=later)
    await writer.put_record(sid, "structured", {"k": "structured"}, expires_at=later)
    failing = _store(
        table, clock, _HoldingBack(client, fail=EndpointConnectionError(endpoint_url="x"))
    )
    outcomes = await asyncio.gather(
        failing.get_record(sid, "summary"),
        failing.get_record(sid, "structured"),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [BackendUnavailableError] * 2
    # Cancelling one reader of a shared request leaves the others theirs.
    reader = _store(table, clock, client)
    first = asyncio.ensure_future(reader.get_record(sid, "summary"))
    second = asyncio.ensure_future(reader.get_record(sid, "structured"))
    await asyncio.sleep(0)  # both joined the same request
    first.cancel()
    got = await second
    assert got is not None
    assert got.data == {"k": "structured"}
    assert first.cancelled()


async def test_the_fixed_user_agent_keeps_the_app_id_and_extras(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the fixed header must not drop: the application id an operator configured
    (``AWS_SDK_UA_APP_ID`` / ``sdk_ua_app_id``, AWS's way to attribute requests) and the
    session's ``user_agent_extra``."""
    monkeypatch.setenv("AWS_SDK_UA_APP_ID", "shop-assistant")
    session = fresh_dynamodb_session()
    session._session.user_agent_extra = "extra/1"
    seen: list[str] = []

    def capture(request: Any, **_: Any) -> None:
        value = request.headers["User-Agent"]
        seen.append(value.decode() if isinstance(value, bytes) else value)

    session.events.register("before-send.dynamodb", capture)
    store = DynamoDBDurableStore(table, endpoint_url=server_url("dynamodb"), session=session)
    try:
        await store.get_record(fresh_id("s"), "summary")
    finally:
        await store.aclose()
    assert seen
    assert "app/shop-assistant" in seen[0].split(" ")
    assert "extra/1" in seen[0].split(" ")
    assert "lib/tiermem#" in seen[0]


# A record write and an append that cross (one fails on META; its cancellation returns
# the new META) keep what the store knows of the records and the entities: the next write
# needs no read. A stale stamp still costs only one failed write, never a lost update.


async def test_a_record_write_that_an_append_overtook_goes_again_without_reads(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"n": 1}, expires_at=later)
    await theirs.append_turns(sid, [text_turn("moves META on")], expires_at=later)
    requests.take()
    # Mine's transaction fails on META only; the cancellation carries META and the
    # record's stamp still holds: the retry needs no read.
    record = await mine.put_record(sid, "summary", {"n": 2})
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    assert (record.version, record.data) == (2, {"n": 2})
    got = await theirs.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (2, {"n": 2})
    turns = await theirs.get_turns(sid)
    assert [t.index for t in turns] == [0]
    assert await mine.next_index(sid) == 1


async def test_an_append_that_a_record_write_overtook_keeps_the_record_stamps(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"n": 1}, expires_at=later)
    await mine.append_turns(sid, [text_turn("first")], expires_at=later)
    await theirs.put_record(sid, "structured", {"s": 1}, expires_at=later)
    requests.take()
    appended = await mine.append_turns(sid, [text_turn("second")], expires_at=later)
    assert [t.index for t in appended] == [1]
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    # The summary's stamp survived the failed append: one request, no reads.
    record = await mine.put_record(sid, "summary", {"n": 2})
    assert requests.take() == ["TransactWriteItems"]
    assert record.version == 2
    structured = await mine.get_record(sid, "structured")
    assert structured is not None
    assert (structured.version, structured.data) == (1, {"s": 1})


async def test_a_kept_stamp_that_went_stale_never_loses_the_other_write(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"by": "mine"}, expires_at=later)
    await mine.append_turns(sid, [text_turn("first")], expires_at=later)
    await theirs.put_record(sid, "summary", {"by": "theirs"}, expires_at=later)
    # Mine's append fails on META and keeps its (now stale) stamp of the summary.
    await mine.append_turns(sid, [text_turn("second")], expires_at=later)
    requests.take()
    record = await mine.put_record(sid, "summary", {"by": "mine again"}, expected_version=2)
    assert record.version == 3
    assert "GetItem" in requests.take()  # the stale stamp failed, then it read
    got = await theirs.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (3, {"by": "mine again"})


def _change(clock: FakeClock, kind: str, value: str, index: int) -> EntityChange:
    entity = ActiveEntity(kind=kind, value=value, turn_index=index, updated_at=clock.now())
    return EntityChange(upsert={kind: entity})


async def test_an_entity_change_after_a_crossed_append_merges_without_a_query(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.append_turns(
        sid, [text_turn("Berserk")], expires_at=later, entities=_change(clock, "series", "B", 0)
    )
    await theirs.put_record(sid, "summary", {"n": 1}, expires_at=later)
    requests.take()
    # META moved (a summary), the entities record did not: the retry merges into the
    # remembered record, no Query.
    await mine.append_turns(
        sid, [text_turn("vol 42")], expires_at=later, entities=_change(clock, "volume", "42", 1)
    )
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    record = await theirs.get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert (record.version, sorted(record.data)) == (2, ["series", "volume"])


async def test_a_remembered_entities_record_that_went_stale_is_read_again_not_lost(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.append_turns(
        sid, [text_turn("Berserk")], expires_at=later, entities=_change(clock, "series", "B", 0)
    )
    # Theirs changes the entities record itself (and so META).
    await theirs.append_turns(
        sid, [text_turn("Guts")], expires_at=later, entities=_change(clock, "hero", "Guts", 1)
    )
    await mine.append_turns(
        sid, [text_turn("vol 42")], expires_at=later, entities=_change(clock, "volume", "42", 2)
    )
    assert "Query" in requests.take()  # the remembered record was stale: read, then merged
    record = await theirs.get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert (record.version, sorted(record.data)) == (3, ["hero", "series", "volume"])


async def test_requests_are_signed_by_the_fast_signer_as_botocore_would_sign_them(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store's own client signs with :class:`FastSigV4Auth` (chosen through botocore's
    ``choose-signer`` event), and each request's Authorization header is the one botocore's
    SigV4Auth computes for the same request at the same instant. DynamoDB Local accepts any
    signature: the comparison is what shows AWS would accept these."""
    import copy
    import datetime as dt

    import botocore.auth
    from botocore.credentials import ReadOnlyCredentials

    from tiermem.store.backends import dynamodb_signing
    from tiermem.store.backends.dynamodb_signing import SIGNATURE_VERSION

    if os.environ.get("TIERMEM_TEST_OLDEST_BOTOCORE") == "1":
        # scripts/test.sh's run on the oldest aioboto3 the extra allows (botocore 1.34):
        # the fast signer is not installed there, and botocore's own signs.
        assert not dynamodb_signing.supported()
        await _signed_by_botocore(table)
        return
    instant = dt.datetime(2026, 11, 24, 12, 0, 0)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: instant)
    session = fresh_dynamodb_session()
    unsigned: list[tuple[str, Any]] = []
    sent: list[str] = []

    def before_sign(request: Any, signature_version: str, **_: Any) -> None:
        unsigned.append((signature_version, copy.deepcopy(request)))

    def before_send(request: Any, **_: Any) -> None:
        value = request.headers["Authorization"]
        sent.append(value.decode() if isinstance(value, bytes) else value)

    session.events.register("before-sign.dynamodb", before_sign)
    session.events.register("before-send.dynamodb", before_send)
    await _write_and_read(table, session)
    assert len(sent) >= 2
    assert len(unsigned) == len(sent)
    assert {version for version, _ in unsigned} == {SIGNATURE_VERSION}
    frozen = await session.get_credentials()
    keys = ReadOnlyCredentials(frozen.access_key, frozen.secret_key, frozen.token)
    for (_, request), authorization in zip(unsigned, sent, strict=True):
        botocore.auth.SigV4Auth(keys, "dynamodb", session.region_name).add_auth(request)
        assert request.headers["Authorization"] == authorization


async def _signed_by_botocore(table: str) -> None:
    """On a botocore the fast signer does not support, a store's requests are signed by
    botocore's own SigV4 (``v4``) and succeed."""
    session = fresh_dynamodb_session()
    versions: list[str] = []

    def before_sign(signature_version: str, **_: Any) -> None:
        versions.append(signature_version)

    session.events.register("before-sign.dynamodb", before_sign)
    await _write_and_read(table, session)
    assert versions
    assert set(versions) == {"v4"}


async def _write_and_read(table: str, session: Any) -> None:
    """A record written and read back by a store whose client ``session`` opens."""
    store = DynamoDBDurableStore(table, endpoint_url=server_url("dynamodb"), session=session)
    try:
        sid = fresh_id("s")
        await store.put_record(sid, "summary", {"n": 1})
        got = await store.get_record(sid, "summary")
    finally:
        await store.aclose()
    assert got is not None
    assert got.data == {"n": 1}
