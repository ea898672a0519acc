"""What only the DynamoDB backend promises, beyond the shared contract.

Item sizes, the CloudFormation template, no Scan, BatchWriteItem retries, TTL attributes,
the transaction limit and error mapping. Runs against DynamoDB Local
(``TIERMEM_TEST_DYNAMODB_URL``), except where a fake client is the only way to produce a
fault (said in the test).
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiobotocore.config import AioConfig

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.errors import BackendError, BackendUnavailableError, ValidationError
from tiermem.models import MemoryRecord, SessionMetadata, SessionRef
from tiermem.store.backends.dynamodb import (
    TTL_ATTRIBUTE,
    DynamoDBDurableStore,
    DynamoDBHotStore,
    create_table,
    table_definition,
)
from tiermem.store.contract import DEFAULT_GC_GRACE
from tiermem.testing.backend import fresh_id, text_turn

pytestmark = pytest.mark.dynamodb

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "dynamodb.yaml"
ITEM_LIMIT = 400 * 1024


class _CloudFormationLoader(yaml.SafeLoader):
    """Reads CloudFormation's short-form tags (!Ref, !Sub, !GetAtt...) as plain values."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return {suffix: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {suffix: loader.construct_sequence(node)}
    return {suffix: loader.construct_mapping(node)}  # type: ignore[arg-type]


_CloudFormationLoader.add_multi_constructor("!", _tag)


def _item_size(item: dict[str, Any]) -> int:
    """An upper bound of DynamoDB's item size: attribute names plus values."""
    total = 0
    for name, value in item.items():
        total += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "B":
            total += len(raw)
        elif kind in ("S", "N"):
            total += len(str(raw).encode())
        else:
            total += len(json.dumps(raw, default=str).encode())
    return total


@pytest.fixture
async def table() -> str:
    return await shared_table(server_url("dynamodb"))


@pytest.fixture
async def raw_client() -> AsyncIterator[Any]:
    """A low-level client, to look at the items the stores wrote."""
    async with dynamodb_session().client("dynamodb", endpoint_url=server_url("dynamodb")) as client:
        yield client


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(
    table: str, clock: FakeClock
) -> AsyncIterator[tuple[DynamoDBHotStore, DynamoDBDurableStore]]:
    url = server_url("dynamodb")
    # The wall clock is a fake too, so TTL attributes can be checked exactly.
    wall = FakeClock(datetime(2026, 6, 1, tzinfo=UTC))
    hot = DynamoDBHotStore(
        table, clock=clock, wall_clock=wall, endpoint_url=url, session=dynamodb_session()
    )
    durable = DynamoDBDurableStore(
        table, clock=clock, wall_clock=wall, endpoint_url=url, session=dynamodb_session()
    )
    yield hot, durable
    await hot.aclose()
    await durable.aclose()


async def _partition(client: Any, table: str, pk: str) -> list[dict[str, Any]]:
    response = await client.query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    )
    return list(response["Items"])


async def test_large_turn_is_compressed_and_split_into_items_under_400kb(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, _ = stores
    sid = fresh_id("s")
    rng = random.Random(7)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(700_000))
    await hot.append_turns(
        sid, [text_turn(text)], window=5, expires_at=clock.now() + timedelta(hours=1)
    )
    items = await _partition(raw_client, table, f"H#{sid}")
    turn_items = [i for i in items if i["sk"]["S"].startswith("T#")]
    assert len(turn_items) >= 2, "a 700 KB turn must be split over several items"
    assert all("B" in i["d"] for i in turn_items), "a large turn must be stored compressed"
    assert all(_item_size(i) < ITEM_LIMIT for i in items)
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.turns[0].text == text


async def test_large_record_and_archived_turn_stay_under_400kb(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
) -> None:
    _, durable = stores
    sid = fresh_id("s")
    rng = random.Random(3)
    facts = ["".join(rng.choice("abcdefghij ") for _ in range(100)) for _ in range(9000)]
    await durable.put_record(sid, "structured", {"facts": facts})
    big = "".join(rng.choice("あいうえおかきくけこabc123 ") for _ in range(250_000))
    await durable.append_turns(sid, [text_turn(big)])
    items = await _partition(raw_client, table, f"S#{sid}")
    assert all(_item_size(i) < ITEM_LIMIT for i in items)
    record_items = [i for i in items if i["sk"]["S"].startswith("REC#")]
    assert all("B" in i["d"] for i in record_items)
    got = await durable.get_record(sid, "structured")
    assert got is not None
    assert got.data == {"facts": facts}
    assert (await durable.get_turn(sid, 0)).text == big


async def test_ttl_attributes_are_expiry_plus_grace_on_the_wall_clock(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, durable = stores
    sid = fresh_id("s")
    await hot.append_turns(
        sid, [text_turn("a")], window=5, expires_at=clock.now() + timedelta(minutes=30)
    )
    wall_expiry = datetime(2026, 6, 1, tzinfo=UTC) + timedelta(minutes=30) + DEFAULT_GC_GRACE
    items = {i["sk"]["S"]: i for i in await _partition(raw_client, table, f"H#{sid}")}
    assert int(items["META"][TTL_ATTRIBUTE]["N"]) == int(wall_expiry.timestamp())
    # Children outlive META, so a long-lived session's old turns are not collected under it.
    assert int(items["T#000000000000"][TTL_ATTRIBUTE]["N"]) > int(wall_expiry.timestamp())

    await durable.append_turns(
        sid, [text_turn("kept a day")], expires_at=clock.now() + timedelta(days=1)
    )
    await durable.append_turns(sid, [text_turn("kept forever")])
    archived = {i["sk"]["S"]: i for i in await _partition(raw_client, table, f"S#{sid}")}
    day = datetime(2026, 6, 2, tzinfo=UTC) + DEFAULT_GC_GRACE
    assert int(archived["TURN#000000000000"][TTL_ATTRIBUTE]["N"]) == int(day.timestamp())
    assert TTL_ATTRIBUTE not in archived["TURN#000000000001"]
    assert TTL_ATTRIBUTE not in archived["META"]


async def test_turns_leaving_the_window_and_old_generations_are_deleted(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, _ = stores
    sid = fresh_id("s")
    for i in range(7):
        await hot.append_turns(
            sid, [text_turn(f"t{i}")], window=3, expires_at=clock.now() + timedelta(minutes=1)
        )
    await hot.put_state(sid, "dialogue", {"x": 1}, expires_at=clock.now() + timedelta(minutes=1))
    sks = sorted(i["sk"]["S"] for i in await _partition(raw_client, table, f"H#{sid}"))
    assert sks == ["META", "ST#dialogue", "T#000000000004", "T#000000000005", "T#000000000006"]
    clock.advance(61)
    await hot.append_turns(
        sid,
        [text_turn("new")],
        window=3,
        first_index=7,
        expires_at=clock.now() + timedelta(minutes=1),
    )
    sks = sorted(i["sk"]["S"] for i in await _partition(raw_client, table, f"H#{sid}"))
    assert sks == ["META", "T#000000000007"]


async def test_far_expiry_raises_the_ttl_of_old_children_first(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, _ = stores
    sid = fresh_id("s")
    await hot.append_turns(
        sid, [text_turn("old")], window=5, expires_at=clock.now() + timedelta(minutes=30)
    )
    await hot.put_state(sid, "dialogue", {"x": 1}, expires_at=clock.now() + timedelta(minutes=30))
    # A session kept alive for a month: its first turn and state must not be collected.
    assert await hot.touch(sid, expires_at=clock.now() + timedelta(days=30)) is True
    items = {i["sk"]["S"]: i for i in await _partition(raw_client, table, f"H#{sid}")}
    meta_ttl = int(items["META"][TTL_ATTRIBUTE]["N"])
    assert int(items["T#000000000000"][TTL_ATTRIBUTE]["N"]) >= meta_ttl
    assert int(items["ST#dialogue"][TTL_ATTRIBUTE]["N"]) >= meta_ttl
    await hot.append_turns(
        sid, [text_turn("later")], window=5, expires_at=clock.now() + timedelta(days=60)
    )
    items = {i["sk"]["S"]: i for i in await _partition(raw_client, table, f"H#{sid}")}
    meta_ttl = int(items["META"][TTL_ATTRIBUTE]["N"])
    assert all(int(i[TTL_ATTRIBUTE]["N"]) >= meta_ttl for i in items.values())
    snap = await hot.load(sid)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["old", "later"]


async def test_load_never_returns_a_session_with_a_missing_turn(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, _ = stores
    sid = fresh_id("s")
    await hot.append_turns(
        sid,
        [text_turn("a"), text_turn("b")],
        window=5,
        expires_at=clock.now() + timedelta(minutes=1),
    )
    # What a Query overlapping a concurrent transaction can see: META without one turn.
    await raw_client.delete_item(
        TableName=table, Key={"pk": {"S": f"H#{sid}"}, "sk": {"S": "T#000000000001"}}
    )
    with pytest.raises(BackendError, match="kept changing") as info:
        await hot.load(sid)
    assert info.value.retryable is True


async def test_activity_index_is_sharded(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
    raw_client: Any,
    table: str,
    clock: FakeClock,
) -> None:
    hot, _ = stores
    shards = set()
    for _ in range(12):
        sid = fresh_id("s")
        await hot.put_metadata(
            sid,
            _metadata(sid, clock),
            expires_at=clock.now() + timedelta(minutes=1),
        )
        items = {i["sk"]["S"]: i for i in await _partition(raw_client, table, f"H#{sid}")}
        shards.add(items["META"]["act_pk"]["S"])
    assert len(shards) > 3
    assert all(s.startswith("ACT#") for s in shards)


def _metadata(sid: str, clock: FakeClock) -> SessionMetadata:
    now = clock.now()
    return SessionMetadata(session_id=sid, user_id="u", created_at=now, last_activity=now)


async def test_cloudformation_template_matches_table_definition() -> None:
    template = yaml.load(TEMPLATE.read_text(), Loader=_CloudFormationLoader)  # noqa: S506 -- SafeLoader subclass
    props = template["Resources"]["TierMemTable"]["Properties"]
    expected = table_definition("anything")
    assert props["TableName"] == {"Ref": "TableName"}
    assert "TableName" in template["Parameters"]
    for field in ("BillingMode", "KeySchema", "LocalSecondaryIndexes", "GlobalSecondaryIndexes"):
        assert props[field] == expected[field], field
    assert sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
        expected["AttributeDefinitions"], key=lambda a: a["AttributeName"]
    )
    assert props["TimeToLiveSpecification"] == {"AttributeName": TTL_ATTRIBUTE, "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}
    # Nothing in the definition that the template lacks.
    assert set(expected) - {"TableName"} <= set(props)


async def test_create_table_is_idempotent_and_enables_ttl(raw_client: Any) -> None:
    url = server_url("dynamodb")
    name = fresh_id("tiermem-create")
    try:
        assert await create_table(name, endpoint_url=url, session=dynamodb_session()) is True
        assert await create_table(name, endpoint_url=url, session=dynamodb_session()) is False
        ttl = await raw_client.describe_time_to_live(TableName=name)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == TTL_ATTRIBUTE
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    finally:
        await raw_client.delete_table(TableName=name)


class _SpyClient:
    """Records the name of every client method used, delegating to a real client."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self._client, name)


async def test_no_request_path_scans(table: str, raw_client: Any, clock: FakeClock) -> None:
    spy = _SpyClient(raw_client)
    hot = DynamoDBHotStore(table, clock=clock, client=spy)
    durable = DynamoDBDurableStore(table, clock=clock, client=spy)
    user = fresh_id("u")
    for _ in range(2):
        sid = fresh_id("s")
        await durable.register_session(
            SessionRef(session_id=sid, user_id=user, created_at=clock.now())
        )
        await durable.append_turns(sid, [text_turn("hello")])
        await durable.put_record(sid, "summary", {"s": 1})
        await hot.append_turns(
            sid, [text_turn("hello")], window=5, expires_at=clock.now() + timedelta(seconds=10)
        )
    await durable.put_memory(
        MemoryRecord(
            memory_id=fresh_id("m"),
            user_id=user,
            memory_type="preference",
            content="likes seinen",
            created_at=clock.now(),
        )
    )
    clock.advance(11)
    assert await durable.query_memories(user, memory_types=["preference"])
    assert await durable.query_memories(user)
    assert await hot.claim_expired(owner="w", lease=timedelta(minutes=1), limit=10)
    assert await durable.purge_user(user) == 3
    await hot.aclose()
    await durable.aclose()
    assert {"query", "batch_write_item"} <= set(spy.calls)
    assert not [c for c in spy.calls if "scan" in c.lower()], spy.calls


class _UnprocessedTwiceClient:
    """A fake client whose BatchWriteItem leaves items unprocessed.

    DynamoDB returns UnprocessedItems only under throttling or partition pressure, which
    DynamoDB Local never applies and a test cannot provoke on demand, so the fault is faked.
    """

    def __init__(self, *, failures: int) -> None:
        self.failures = failures
        self.batches: list[int] = []

    async def query(self, **kwargs: Any) -> dict[str, Any]:
        pk = kwargs["ExpressionAttributeValues"][":pk"]["S"]
        sks = ["META", *(f"TURN#{i:012d}" for i in range(30))]
        return {"Items": [{"pk": {"S": pk}, "sk": {"S": sk}} for sk in sks]}

    async def batch_write_item(self, **kwargs: Any) -> dict[str, Any]:
        ((table, requests),) = kwargs["RequestItems"].items()
        self.batches.append(len(requests))
        if self.failures:
            self.failures -= 1
            return {"UnprocessedItems": {table: requests[-2:]}}
        return {"UnprocessedItems": {}}


async def test_batch_write_resends_unprocessed_items() -> None:
    fake = _UnprocessedTwiceClient(failures=2)
    durable = DynamoDBDurableStore("fake", client=fake)
    await durable.delete_session("s-1")
    # 31 keys: a chunk of 25 (sent, then its 2 leftovers twice), then the last 6.
    assert fake.batches == [25, 2, 2, 6]


async def test_batch_write_gives_up_with_a_retryable_error() -> None:
    fake = _UnprocessedTwiceClient(failures=1000)
    durable = DynamoDBDurableStore("fake", client=fake)
    with pytest.raises(BackendError, match="unprocessed") as info:
        await durable.delete_session("s-1")
    assert info.value.retryable is True
    assert len(fake.batches) == 8


class _UnprocessedKeysClient:
    """A fake client whose BatchGetItem leaves keys unprocessed (see above for why fake)."""

    def __init__(self, *, failures: int) -> None:
        self.failures = failures
        self.batches: list[int] = []

    async def batch_get_item(self, **kwargs: Any) -> dict[str, Any]:
        ((table, request),) = kwargs["RequestItems"].items()
        assert request["ConsistentRead"] is True
        keys = request["Keys"]
        self.batches.append(len(keys))
        served, left = (keys[:-3], keys[-3:]) if self.failures else (keys, [])
        if self.failures:
            self.failures -= 1
        items = [
            key | {"d": {"S": _fake_memory(key["sk"]["S"].removeprefix("MEM#"))}} for key in served
        ]
        unprocessed = {table: {"Keys": left, "ConsistentRead": True}} if left else {}
        return {"Responses": {table: items}, "UnprocessedKeys": unprocessed}


def _fake_memory(memory_id: str) -> str:
    return MemoryRecord(
        memory_id=memory_id,
        user_id="u-1",
        memory_type="fact",
        content=memory_id,
        created_at=datetime(2030, 1, 1, tzinfo=UTC),
    ).model_dump_json()


async def test_batch_get_resends_unprocessed_keys() -> None:
    fake = _UnprocessedKeysClient(failures=2)
    durable = DynamoDBDurableStore("fake", client=fake)
    ids = [f"m{i}" for i in range(150)]
    got = await durable.get_memories("u-1", [*ids, *ids[:10]])
    assert sorted(got) == sorted(ids)
    assert all(record.content == memory_id for memory_id, record in got.items())
    # Two requests (100 + 50 keys) in parallel; each leaves 3 keys over once, resent.
    assert sorted(fake.batches) == [3, 3, 50, 100]


async def test_batch_get_gives_up_with_a_retryable_error() -> None:
    fake = _UnprocessedKeysClient(failures=1000)
    durable = DynamoDBDurableStore("fake", client=fake)
    with pytest.raises(BackendError, match="unprocessed") as info:
        await durable.get_memories("u-1", ["m1", "m2", "m3", "m4"])
    assert info.value.retryable is True
    assert len(fake.batches) == 8


async def test_append_that_cannot_be_one_transaction_is_rejected_before_writing(
    stores: tuple[DynamoDBHotStore, DynamoDBDurableStore],
) -> None:
    _, durable = stores
    sid = fresh_id("s")
    # 20 incompressible turns of 300 KB: over DynamoDB's 4 MB per transaction.
    rng = random.Random(5)
    big = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(300_000))
        for _ in range(20)
    ]
    with pytest.raises(ValidationError, match="Split the batch"):
        await durable.append_turns(sid, [text_turn(b) for b in big])
    assert await durable.next_index(sid) == 0
    written = await durable.append_turns(sid, [text_turn(f"t{i}") for i in range(50)])
    assert [t.index for t in written] == list(range(50))


async def test_unreachable_endpoint_is_unavailable_and_retryable() -> None:
    # Nothing listens on port 9. botocore's own retries are switched off only to keep the
    # test short; the store's client retries twice more before the same error.
    config = AioConfig(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2)
    async with dynamodb_session().client(
        "dynamodb", endpoint_url="http://127.0.0.1:9", config=config
    ) as client:
        hot = DynamoDBHotStore("tiermem", client=client)
        with pytest.raises(BackendUnavailableError) as info:
            await hot.load("s-1")
    assert info.value.retryable is True
    assert info.value.backend == "dynamodb"
    assert "could not reach DynamoDB" in str(info.value)


async def test_missing_table_says_how_to_create_it() -> None:
    durable = DynamoDBDurableStore(
        fresh_id("no-such-table"), endpoint_url=server_url("dynamodb"), session=dynamodb_session()
    )
    try:
        with pytest.raises(BackendError, match=r"deploy/dynamodb\.yaml") as info:
            await durable.next_index("s-1")
        assert info.value.retryable is False
    finally:
        await durable.aclose()
