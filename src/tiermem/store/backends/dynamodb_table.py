"""The DynamoDB table both stores share: its definition, its keys, and how to talk to it.

This module owns everything the hot and durable stores have in common:

* :func:`table_definition` (the CreateTable arguments; ``deploy/dynamodb.yaml`` mirrors it and
  a test keeps the two equal) and :func:`create_table`;
* the key builders, so every key is labelled and every id segment escaped in one place;
* payload packing: JSON over 64 KB is zlib-compressed into a Binary attribute, and a payload
  still over 350 KB is split into part items (``<sk>#P0001``...) written in the same
  transaction, so no item comes near DynamoDB's 400 KB limit;
* :class:`DynamoDBTable`, the one place a botocore call is made: it opens the aioboto3 client
  lazily, maps botocore errors to :mod:`tiermem.errors` (the one wrapper), turns failed
  conditions into :class:`ConditionFailed`, pages through queries and retries
  BatchWriteItem's unprocessed items and BatchGetItem's unprocessed keys.

The layout itself is drawn in :mod:`tiermem.store.backends.dynamodb`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import re
import sys
import threading
import weakref
import zlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import Any

import aioboto3
import aiobotocore
import botocore
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.useragent import UserAgentComponent

from tiermem import retry
from tiermem.clock import Clock
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.store.backends import dynamodb_signing
from tiermem.store.codec import check_kind
from tiermem.store.contract import EntityChange
from tiermem.store.keys import escape_segment, unescape_segment

__all__ = [
    "ACTIVITY_INDEX",
    "BY_CREATED_INDEX",
    "BY_TYPE_INDEX",
    "TTL_ATTRIBUTE",
    "ConditionFailed",
    "DynamoDBTable",
    "Item",
    "check_entity_change",
    "create_table",
    "table_definition",
]

logger = logging.getLogger(__name__)

BACKEND = "dynamodb"
Item = dict[str, Any]
"""A DynamoDB item in the low-level wire format ({"S": ...}, {"N": ...}, {"B": ...})."""

TTL_ATTRIBUTE = "ttl"
ACTIVITY_INDEX = "activity"
BY_TYPE_INDEX = "by_type"
BY_CREATED_INDEX = "by_created"

COMPRESS_OVER = 64 * 1024
"""Payloads larger than this (UTF-8 bytes) are stored zlib-compressed."""
PART_BYTES = 350_000
"""Largest payload chunk in one item; the rest of the item is keys and a few numbers."""
MAX_TRANSACTION_ITEMS = 100
MAX_TRANSACTION_BYTES = 4_000_000
"""TransactWriteItems carries at most 4 MB; keep a margin for keys and attribute names."""
_ITEM_OVERHEAD = 2048

MAX_ATTEMPTS = 60
"""Optimistic writes that keep losing to concurrent writers give up after this many tries."""
BATCH_ATTEMPTS = 8
"""BatchWriteItem / BatchGetItem calls per chunk before unprocessed entries become a
BackendError."""
BATCH_GET_KEYS = 100
"""Most keys one BatchGetItem request may carry."""


def _user_agent() -> str:
    """The User-Agent header of every request, built once per process.

    botocore otherwise rebuilds its default header twice per request, each component
    sanitised character by character: about an eighth of the client's CPU per turn on
    Redis + DynamoDB (bench/turns.py, cProfile), a quarter of a request's Python calls. Setting
    ``user_agent`` (a public :class:`botocore.config.Config` option) sends this fixed string
    instead; botocore still appends a session's ``user_agent_extra``, and
    :func:`_client_config` adds the application id (which the override would drop).
    Left out of botocore's default: the per-request feature metrics (``m/``) and the
    ``cfg/retry-mode`` component, which are SDK telemetry, not needed by DynamoDB.
    """
    env = os.environ.get("AWS_EXECUTION_ENV")
    return (
        f"Botocore/{botocore.__version__} ua/2.1 os/{sys.platform} "
        f"lang/python#{platform.python_version()} "
        + (f"{UserAgentComponent('exec-env', env).to_string()} " if env else "")
        + f"md/aiobotocore#{aiobotocore.__version__} lib/tiermem#{_tiermem_version()}"
    )


def _client_config(session: Any) -> AioConfig:
    """:data:`_CLIENT_CONFIG`, with the application id the session resolves
    (``AWS_SDK_UA_APP_ID``, ``sdk_ua_app_id`` in the profile) appended to the fixed user
    agent as botocore's own header carries it (``app/<id>``): a ``user_agent`` override
    makes botocore drop it, and operators use it to attribute requests."""
    core = getattr(session, "_session", None)  # aioboto3 keeps the botocore session here
    app_id = core.get_config_variable("user_agent_appid") if core is not None else None
    if not app_id:
        return _CLIENT_CONFIG
    app = UserAgentComponent("app", str(app_id)).to_string()
    merged: AioConfig = _CLIENT_CONFIG.merge(AioConfig(user_agent=f"{_USER_AGENT} {app}"))
    return merged


def _tiermem_version() -> str:
    try:
        return metadata.version("tiermem")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


_USER_AGENT = _user_agent()

# botocore retries throttling and dropped connections itself (standard mode); past that,
# errors surface as retryable BackendErrors and the caller's policy decides. Requests are
# built here from validated values, so botocore's own check of every parameter against the
# service model (about a tenth of a request's client CPU) is skipped: DynamoDB still
# rejects a malformed request, as a BackendError.
_CLIENT_CONFIG = AioConfig(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=64,
    parameter_validation=False,
    user_agent=_USER_AGENT,
)
_THROTTLING = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceeded",
        "ThrottlingError",
    }
)


# -- table ------------------------------------------------------------------------------


def table_definition(table_name: str) -> dict[str, Any]:
    """The CreateTable arguments of a tiermem table (``deploy/dynamodb.yaml`` is the same).

    * ``pk``/``sk``: the single-table primary key.
    * LSIs ``by_type`` (``lt``) and ``by_created`` (``lc``) order a user's memories by
      (type, created_at) and by created_at. They are local, not global, so queries can be
      strongly consistent: a memory is visible to recall as soon as ``put_memory`` returns.
    * GSI ``activity`` (``act_pk`` = ``ACT#<shard>``, ``act_sk`` = expires_at in µs) is the
      sharded expiry index that ``claim_expired`` sweeps; it projects only the lease.
    """

    def key(hash_name: str, range_name: str) -> list[dict[str, str]]:
        return [
            {"AttributeName": hash_name, "KeyType": "HASH"},
            {"AttributeName": range_name, "KeyType": "RANGE"},
        ]

    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": key("pk", "sk"),
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "lt", "AttributeType": "S"},
            {"AttributeName": "lc", "AttributeType": "S"},
            {"AttributeName": "act_pk", "AttributeType": "S"},
            {"AttributeName": "act_sk", "AttributeType": "N"},
        ],
        "LocalSecondaryIndexes": [
            {
                "IndexName": BY_TYPE_INDEX,
                "KeySchema": key("pk", "lt"),
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": BY_CREATED_INDEX,
                "KeySchema": key("pk", "lc"),
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": ACTIVITY_INDEX,
                "KeySchema": key("act_pk", "act_sk"),
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["lease_us"]},
            }
        ],
    }


async def create_table(
    table_name: str,
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    session: aioboto3.Session | None = None,
    client: Any = None,
) -> bool:
    """Create the table (if absent), wait until it is active, and enable the TTL attribute.

    Idempotent: an existing table is left as it is (its TTL is enabled if it was not).
    Returns True if the table was created by this call.

    Raises:
        BackendError: the table could not be created (e.g. missing IAM permission).
    """
    table = DynamoDBTable(
        table_name,
        endpoint_url=endpoint_url,
        region_name=region_name,
        session=session,
        client=client,
    )
    try:
        created = True
        try:
            await table.call("create_table", **table_definition(table_name))
        except BackendError as exc:
            code = _error_code(exc.__cause__)
            if code != "ResourceInUseException":
                raise
            created = False
        await table.wait_active()
        described = await table.call("describe_time_to_live", TableName=table_name)
        status = described.get("TimeToLiveDescription", {}).get("TimeToLiveStatus")
        if status not in ("ENABLED", "ENABLING"):
            await table.call(
                "update_time_to_live",
                TableName=table_name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        return created
    finally:
        await table.aclose()


# -- keys -------------------------------------------------------------------------------

META = "META"
_TIME_OFFSET_US = 62_135_596_800_000_000  # µs from 0001-01-01 to the epoch: keys stay >= 0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def hot_pk(session_id: str) -> str:
    return f"H#{escape_segment(session_id)}"


def session_pk(session_id: str) -> str:
    return f"S#{escape_segment(session_id)}"


def user_pk(user_id: str) -> str:
    return f"U#{escape_segment(user_id)}"


def session_id_of(pk: str) -> str:
    """The session id of a hot or durable session partition key."""
    return unescape_segment(pk.split("#", 1)[1])


def index_segment(index: int) -> str:
    return f"{index:012d}"


def part_sk(main_sk: str, part: int) -> str:
    return f"{main_sk}#P{part:04d}"


def parts_upper(main_sk: str) -> str:
    """An upper bound for a BETWEEN covering an item and all its parts."""
    return f"{main_sk}#~"


def time_segment(value: datetime) -> str:
    """A sortable, fixed-width key segment of a timestamp (µs precision)."""
    return f"{to_us(value) + _TIME_OFFSET_US:018d}"


def to_us(value: datetime) -> int:
    """Microseconds since the epoch, exactly (no float rounding)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def key(pk: str, sk: str) -> Item:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


# -- attribute values ---------------------------------------------------------------------


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def get_int(item: Item, name: str, default: int = 0) -> int:
    value = item.get(name)
    return int(value["N"]) if value is not None else default


def get_str(item: Item, name: str, default: str = "") -> str:
    value = item.get(name)
    return str(value["S"]) if value is not None else default


_NAME_TOKEN = re.compile(r"#(\w+)")


def expression(**parts: str | None) -> dict[str, Any]:
    """Expression arguments with ``#name`` placeholders filled in.

    DynamoDB rejects unused placeholders and reserves words such as ``ttl`` and ``data``,
    so every attribute in an expression is written ``#attr`` and mapped here.
    """
    kwargs: dict[str, Any] = {k: v for k, v in parts.items() if v}
    names = {f"#{m}": m for text in kwargs.values() for m in _NAME_TOKEN.findall(text)}
    if names:
        kwargs["ExpressionAttributeNames"] = names
    return kwargs


# -- payloads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Packed:
    """A payload as the attribute values of its main item and of its parts."""

    chunks: tuple[dict[str, Any], ...]

    @property
    def count(self) -> int:
        return len(self.chunks)

    @property
    def size(self) -> int:
        return sum(len(c.get("B", b"")) or len(c.get("S", "").encode()) for c in self.chunks)


def pack(payload: str, *, what: str, max_parts: int | None = None) -> Packed:
    """Encode a JSON payload as one or more ``d`` attribute values.

    Raises:
        ValidationError: it would need more than ``max_parts`` items.
    """
    raw = payload.encode()
    if len(raw) <= COMPRESS_OVER:
        return Packed(({"S": payload},))
    compressed = zlib.compress(raw, 6)
    chunks = tuple(
        {"B": compressed[i : i + PART_BYTES]} for i in range(0, len(compressed), PART_BYTES)
    )
    if max_parts is not None and len(chunks) > max_parts:
        raise ValidationError(
            f"{what} is {len(compressed)} bytes even compressed; on DynamoDB it must fit one "
            f"item ({PART_BYTES} bytes). Store large values by reference instead of inline."
        )
    return Packed(chunks)


def unpack(chunks: Sequence[dict[str, Any]]) -> str:
    """Invert :func:`pack` given the ``d`` values of the main item and its parts, in order."""
    first = chunks[0]
    if "S" in first:
        return str(first["S"])
    return zlib.decompress(b"".join(bytes(c["B"]) for c in chunks)).decode()


def with_parts(main_sk: str, count: int) -> list[str]:
    """The sort keys of a payload's main item and its ``count - 1`` parts."""
    return [main_sk, *(part_sk(main_sk, p) for p in range(1, count))]


def payload_items(pk: str, main_sk: str, packed: Packed, *, tag: str) -> list[Item]:
    """The main item and part items holding one packed payload, all carrying ``tag``."""
    items: list[Item] = []
    for i, chunk in enumerate(packed.chunks):
        sk = main_sk if i == 0 else part_sk(main_sk, i)
        items.append(key(pk, sk) | {"tag": s(tag), "d": chunk})
    if packed.count > 1:
        items[0]["np"] = n(packed.count)
    return items


def payload_chunks(
    by_sk: Mapping[str, Item], main_sk: str, *, tag: str, count: int
) -> list[Any] | None:
    """The ``d`` values of a payload, or None if the items read are not one consistent write.

    A Query is not isolated from a concurrent transaction, so parts are only accepted when
    they carry the tag of the main item they were written with.
    """
    out = []
    for sk in with_parts(main_sk, count):
        item = by_sk.get(sk)
        if item is None or get_str(item, "tag") != tag:
            return None
        out.append(item["d"])
    if get_int(by_sk[main_sk], "np", 1) != count:
        return None
    return out


def fits_transaction(count: int, *, payload_bytes: int) -> bool:
    """Whether ``count`` actions carrying ``payload_bytes`` of payload fit one transaction."""
    size = payload_bytes + _ITEM_OVERHEAD * count
    return count <= MAX_TRANSACTION_ITEMS and size <= MAX_TRANSACTION_BYTES


def check_transaction(
    actions: Sequence[Item], *, payload_bytes: int, what: str, advice: str = "Split the batch."
) -> None:
    """Reject a write that cannot be one DynamoDB transaction, before anything is written."""
    size = payload_bytes + _ITEM_OVERHEAD * len(actions)
    if not fits_transaction(len(actions), payload_bytes=payload_bytes):
        raise ValidationError(
            f"{what} needs {len(actions)} items and about {size} bytes in one DynamoDB "
            f"transaction; the limits are {MAX_TRANSACTION_ITEMS} items (turns, their parts "
            f"and the session's counter) and {MAX_TRANSACTION_BYTES} bytes. {advice}"
        )


def ttl_at(expires_at: datetime, *, clock: Clock, wall_clock: Clock, grace: timedelta) -> int:
    """The native TTL (epoch seconds) of something that expires at ``expires_at``.

    Per the contract it is ``expires_at - now + gc_grace`` from the wall clock, so it never
    fires before the logical expiry even when ``clock`` is a test's fake clock.
    """
    remaining = (expires_at - clock.now()) + grace
    return math.ceil(wall_clock.now().timestamp() + remaining.total_seconds())


def backoff_delay(attempt: int) -> float:
    """The one retry policy (:mod:`tiermem.retry`), from a base that fits a network round
    trip (5 ms) rather than an in-process race."""
    return retry.backoff_delay(attempt, base=0.005)


RetryPause = Callable[[int], Awaitable[None]]
"""Waits before retry ``attempt`` (0-based) of an optimistic write that lost a race, or of
a read that met a write half done."""


async def backoff_pause(attempt: int) -> None:
    """The stores' :data:`RetryPause`: sleep for :func:`backoff_delay` (capped exponential,
    full jitter). A test passes its own to see the pauses without waiting for them."""
    await asyncio.sleep(backoff_delay(attempt))


def contention_error(what: str) -> BackendError:
    return BackendError(
        f"{what} lost to concurrent writers {MAX_ATTEMPTS} times in a row: other processes "
        "kept changing it. Retry later; if it recurs, send each session's writes through "
        "one process (its writers queue there instead of racing).",
        backend=BACKEND,
        retryable=True,
    )


# -- client -------------------------------------------------------------------------------

_DEFAULT_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioboto3.Session] = (
    weakref.WeakKeyDictionary()
)
_DEFAULT_SESSIONS_LOCK = threading.Lock()


def default_session() -> aioboto3.Session:
    """The aioboto3 session that the stores (and :func:`create_table`) given no ``session``
    share in the running event loop, made on first use.

    Why shared: a new session parses botocore's endpoint and service-model JSON again and
    resolves credentials again for its first client, 280-330M instructions (callgrind,
    ``bench/dynamodb_startup_cpu.py``), which a store with a session of its own paid once per
    store, so twice per service with both tiers on DynamoDB and again for every service.
    Why per event loop: an aiobotocore session is safe for concurrent tasks of one loop,
    not across loops or threads (aiobotocore issue #1088; boto3's sessions are not
    thread-safe), and its refreshable credentials (IMDS, container, assume-role) hold an
    ``asyncio.Lock`` that binds to one loop. Each sync facade runs its own loop in its own
    thread, so it gets its own session. Bounded by the open loops: an entry goes when its
    loop is collected (weak keys) or, closed, when another loop makes its session. What a
    session reads when it is made (environment, profile) holds for every store of the loop
    that shares it: pass ``session=`` to a store for other credentials or another profile.

    Raises:
        RuntimeError: called outside a running event loop.
    """
    loop = asyncio.get_running_loop()
    with _DEFAULT_SESSIONS_LOCK:
        session = _DEFAULT_SESSIONS.get(loop)
        if session is None:
            for closed in [other for other in _DEFAULT_SESSIONS if other.is_closed()]:
                # A session whose credentials' lock bound the loop keeps the loop alive,
                # so weak keys alone would not let it go.
                del _DEFAULT_SESSIONS[closed]
            session = _DEFAULT_SESSIONS[loop] = aioboto3.Session()
    return session


class ConditionFailed(Exception):  # noqa: N818 -- a control-flow signal, not a user-facing error
    """A conditional write changed nothing. Never leaves the DynamoDB backend.

    ``items`` holds, per action of the write, the item's old value when DynamoDB returned
    it (ReturnValuesOnConditionCheckFailure=ALL_OLD), else None; ``codes`` the cancellation
    code per action ("ConditionalCheckFailed", "None"...), so a caller can tell which of
    its conditions failed. ``contention`` is True when no condition failed but a concurrent
    transaction touched the same items: just retry.
    """

    def __init__(
        self, items: list[Item | None], *, contention: bool, codes: Sequence[str] = ()
    ) -> None:
        super().__init__("conditional write failed")
        self.items = items
        self.contention = contention
        self.codes = list(codes)

    def failed(self, action: int) -> bool:
        """Whether the condition of action number ``action`` (0-based) did not hold."""
        return action < len(self.codes) and self.codes[action] == "ConditionalCheckFailed"

    def item(self, action: int) -> Item | None:
        """The old item of action ``action`` if its condition failed and DynamoDB returned it."""
        return self.items[action] if action < len(self.items) else None


def _error_code(exc: BaseException | None) -> str:
    if isinstance(exc, ClientError):
        return str(_response(exc).get("Error", {}).get("Code", ""))
    return ""


def _response(exc: ClientError) -> dict[str, Any]:
    # botocore-stubs types the error response narrowly; DynamoDB adds Item and
    # CancellationReasons (with ALL_OLD items) to it.
    response: dict[str, Any] = dict(exc.response)
    return response


class DynamoDBTable:
    """One table and the client that talks to it; the boundary where botocore errors stop.

    The aioboto3 client is opened on first use and closed by :meth:`aclose`, from the
    ``session`` passed in, else from the event loop's :func:`default_session`. A client
    passed in is used as is and never closed here (its owner closes it).
    """

    def __init__(
        self,
        table_name: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        session: aioboto3.Session | None = None,
        client: Any = None,
        pause: RetryPause = backoff_pause,
    ) -> None:
        if not table_name:
            raise ValidationError("table_name must not be empty")
        self.name = table_name
        self.pause = pause
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._session = session
        # Typed as Any: the client's methods are generated at run time, and the
        # types-aiobotocore TypedDicts would force a cast at every call site.
        self._client: Any = client
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _open(self) -> Any:
        if self._client is not None:
            return self._client
        if self._closed:
            raise BackendError(
                f"the DynamoDB store for table {self.name!r} is closed; create a new one",
                backend=BACKEND,
            )
        async with self._lock:
            if self._client is None:
                stack = AsyncExitStack()
                session = self._session or default_session()
                try:
                    self._client = await stack.enter_async_context(
                        session.client(
                            "dynamodb",
                            endpoint_url=self._endpoint_url,
                            region_name=self._region_name,
                            config=_client_config(session),
                        )
                    )
                except (BotoCoreError, ClientError) as exc:
                    raise self._map(exc, "open the client") from exc
                dynamodb_signing.install(self._client)
                self._stack = stack
        return self._client

    async def aclose(self) -> None:
        self._closed = True
        stack, self._stack = self._stack, None
        if stack is not None:
            self._client = None
            await stack.aclose()

    async def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Call one DynamoDB operation; every botocore error is mapped here.

        Raises:
            ConditionFailed: a condition expression did not hold (or a transaction met a
                concurrent one); the caller decides what that means.
            BackendUnavailableError / BackendTimeoutError / BackendError: see :meth:`_map`.
        """
        client = await self._open()
        try:
            response: dict[str, Any] = await getattr(client, operation)(**kwargs)
        except ClientError as exc:
            code = _error_code(exc)
            if code == "ConditionalCheckFailedException":
                raise ConditionFailed(
                    [_response(exc).get("Item")],
                    contention=False,
                    codes=["ConditionalCheckFailed"],
                ) from exc
            if code == "TransactionConflictException":
                raise ConditionFailed(
                    [None], contention=True, codes=["TransactionConflict"]
                ) from exc
            if code == "TransactionCanceledException":
                raise self._cancelled(exc, operation) from exc
            raise self._map(exc, operation) from exc
        except BotoCoreError as exc:
            raise self._map(exc, operation) from exc
        return response

    def _cancelled(self, exc: ClientError, operation: str) -> Exception:
        reasons: list[dict[str, Any]] = _response(exc).get("CancellationReasons") or []
        codes = [str(r.get("Code", "None")) for r in reasons]
        if "ConditionalCheckFailed" in codes:
            return ConditionFailed(
                [
                    r.get("Item") if r.get("Code") == "ConditionalCheckFailed" else None
                    for r in reasons
                ],
                contention=False,
                codes=codes,
            )
        if set(codes) <= {"None", "TransactionConflict"}:
            return ConditionFailed([None] * len(reasons), contention=True, codes=codes)
        details = "; ".join(
            f"item {i}: {r.get('Code')} {r.get('Message', '')}".strip()
            for i, r in enumerate(reasons)
            if r.get("Code") not in (None, "None")
        )
        return BackendError(
            f"DynamoDB cancelled {operation} on table {self.name!r}: {details or exc}",
            backend=BACKEND,
            retryable=bool(set(codes) & _THROTTLING),
        )

    def _map(self, exc: Exception, operation: str) -> BackendError:
        """The one translation of botocore errors into tiermem's hierarchy."""
        where = f"DynamoDB {operation} on table {self.name!r}"
        if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
            return BackendTimeoutError(
                f"{where} timed out: {exc}. Check the endpoint and network, then retry.",
                backend=BACKEND,
            )
        if isinstance(exc, EndpointConnectionError | ConnectionClosedError | BotoConnectionError):
            return BackendUnavailableError(
                f"{where} could not reach DynamoDB: {exc}. Check endpoint_url / region and "
                "that the service (or DynamoDB Local) is running.",
                backend=BACKEND,
            )
        if isinstance(exc, NoCredentialsError | NoRegionError):
            return BackendError(
                f"{where} cannot start: {exc}. Configure AWS credentials and a region "
                "(environment, profile or the session passed to the store).",
                backend=BACKEND,
            )
        if isinstance(exc, ClientError):
            code = _error_code(exc)
            status = int(_response(exc).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in _THROTTLING:
                return BackendError(
                    f"{where} was throttled ({code}); retry with backoff or raise the "
                    "table's capacity.",
                    backend=BACKEND,
                    retryable=True,
                )
            if code == "ResourceNotFoundException":
                return BackendError(
                    f"{where} failed: the table (or an index) does not exist. Create it with "
                    "the `tiermem` CLI, tiermem.store.backends.dynamodb.create_table(), or the "
                    "CloudFormation template deploy/dynamodb.yaml.",
                    backend=BACKEND,
                )
            return BackendError(
                f"{where} failed ({code or 'unknown error'}): {exc}",
                backend=BACKEND,
                retryable=status >= 500,
            )
        return BackendError(f"{where} failed: {exc}", backend=BACKEND)

    # -- helpers built on call() ---------------------------------------------------------

    async def wait_active(self) -> None:
        for attempt in range(120):
            described = await self.call("describe_table", TableName=self.name)
            table = described["Table"]
            indexes = table.get("GlobalSecondaryIndexes", [])
            if table.get("TableStatus") == "ACTIVE" and all(
                i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
            ):
                return
            await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
        raise BackendError(
            f"table {self.name!r} did not become ACTIVE; check it in the AWS console",
            backend=BACKEND,
            retryable=True,
        )

    async def get(self, pk: str, sk: str, *, projection: str | None = None) -> Item | None:
        """One item, strongly consistent."""
        response = await self.call(
            "get_item",
            TableName=self.name,
            Key=key(pk, sk),
            ConsistentRead=True,
            **expression(ProjectionExpression=projection),
        )
        item: Item | None = response.get("Item")
        return item

    async def query(
        self, *, page_size: int | None = None, **kwargs: Any
    ) -> AsyncGenerator[Item, None]:
        """The items of a Query, following LastEvaluatedKey across 1 MB pages."""
        request: dict[str, Any] = {"TableName": self.name, **kwargs}
        if page_size is not None:
            request["Limit"] = page_size
        while True:
            response = await self.call("query", **request)
            for item in response.get("Items", []):
                yield item
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            request["ExclusiveStartKey"] = last

    async def query_partition(
        self,
        pk: str,
        *,
        lower: str | None = None,
        upper: str | None = None,
        projection: str | None = None,
    ) -> list[Item]:
        """Every item of one partition (optionally with ``lower <= sk <= upper``)."""
        condition = "#pk = :pk"
        values: dict[str, Any] = {":pk": s(pk)}
        if lower is not None and upper is not None:
            condition += " AND #sk BETWEEN :lo AND :hi"
            values |= {":lo": s(lower), ":hi": s(upper)}
        return [
            item
            async for item in self.query(
                ConsistentRead=True,
                ExpressionAttributeValues=values,
                **expression(KeyConditionExpression=condition, ProjectionExpression=projection),
            )
        ]

    async def write(self, actions: Sequence[Item]) -> None:
        """Commit ``actions`` (TransactWriteItems entries) atomically.

        A single action is sent as a plain PutItem / UpdateItem / DeleteItem, which costs half
        of a one-item transaction.

        Raises:
            ConditionFailed: a condition did not hold; nothing was written.
        """
        if len(actions) == 1:
            ((kind, params),) = actions[0].items()
            operation = {
                "Put": "put_item",
                "Update": "update_item",
                "Delete": "delete_item",
                "ConditionCheck": None,
            }[kind]
            if operation is not None:
                await self.call(operation, **params)
                return
        await self.call("transact_write_items", TransactItems=list(actions))

    async def delete_keys(self, keys: Iterable[tuple[str, str]]) -> int:
        """Delete items by key with BatchWriteItem, retrying unprocessed items.

        Unprocessed items (throttling, partition limits) are resent with exponential
        backoff and jitter, at most :data:`BATCH_ATTEMPTS` times per chunk of 25.

        Raises:
            BackendError: (retryable) items were still unprocessed after the last attempt;
                some of the others may have been deleted, and deleting again is safe.
        """
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 25):
            chunk = unique[start : start + 25]
            await self._batch(
                "BatchWriteItem",
                {self.name: [{"DeleteRequest": {"Key": key(pk, sk)}} for pk, sk in chunk]},
                what="deletes",
                again="deleting",
            )
        return len(unique)

    async def get_keys(self, keys: Iterable[tuple[str, str]]) -> list[Item]:
        """Items by key with strongly consistent BatchGetItem; absent keys are left out.

        One request per :data:`BATCH_GET_KEYS` distinct keys, all in parallel. Unprocessed
        keys (throttling, the 16 MB response limit) are resent with exponential backoff and
        jitter, at most :data:`BATCH_ATTEMPTS` times per request. Items come in no
        particular order.

        Raises:
            BackendError: (retryable) keys were still unprocessed after the last attempt.
        """
        unique = list(dict.fromkeys(keys))

        async def chunk_items(chunk: Sequence[tuple[str, str]]) -> list[Item]:
            responses = await self._batch(
                "BatchGetItem",
                {self.name: {"Keys": [key(pk, sk) for pk, sk in chunk], "ConsistentRead": True}},
                what="reads",
                again="reading",
            )
            return [item for r in responses for item in r.get("Responses", {}).get(self.name, [])]

        found = await asyncio.gather(
            *(
                chunk_items(unique[start : start + BATCH_GET_KEYS])
                for start in range(0, len(unique), BATCH_GET_KEYS)
            )
        )
        return [item for items in found for item in items]

    async def _batch(
        self, operation: str, request: dict[str, Any], *, what: str, again: str
    ) -> list[dict[str, Any]]:
        """Send a BatchWriteItem or BatchGetItem request until nothing is left unprocessed;
        every response, in order. Leftovers are resent with backoff (see :meth:`delete_keys`).

        Raises:
            BackendError: (retryable) leftovers after :data:`BATCH_ATTEMPTS` calls.
        """
        method, unprocessed = {
            "BatchWriteItem": ("batch_write_item", "UnprocessedItems"),
            "BatchGetItem": ("batch_get_item", "UnprocessedKeys"),
        }[operation]
        responses = []
        for attempt in range(BATCH_ATTEMPTS):
            if attempt:
                await asyncio.sleep(retry.backoff_delay(attempt - 1, base=0.02, cap=1.0))
            response = await self.call(method, RequestItems=request)
            responses.append(response)
            request = response.get(unprocessed) or {}
            if not request:
                return responses
            logger.debug(
                "%s left %s %s unprocessed (attempt %s)",
                operation,
                _pending_count(request),
                what,
                attempt + 1,
            )
        raise BackendError(
            f"{operation} on table {self.name!r} still had {_pending_count(request)} "
            f"unprocessed {what} after {BATCH_ATTEMPTS} attempts (throttling?); retry the "
            f"operation, {again} again is safe",
            backend=BACKEND,
            retryable=True,
        )


def _pending_count(request: Mapping[str, Any]) -> int:
    """Entries of a batch request: BatchWriteItem lists requests, BatchGetItem ``Keys``."""
    return sum(len(v["Keys"]) if isinstance(v, Mapping) else len(v) for v in request.values())


def check_entity_change(change: EntityChange | None) -> EntityChange | None:
    """Validate an ``entities=`` argument before any I/O; None for no change (an empty one
    writes nothing either).

    Raises:
        ValidationError: not an :class:`EntityChange`, or a kind that is not a valid id.
    """
    if change is None:
        return None
    if not isinstance(change, EntityChange):
        raise ValidationError(f"entities takes an EntityChange, got {type(change).__name__}")
    for kind in [*change.upsert, *change.remove]:
        check_kind(kind, what="entity kind")
    return change if change.upsert or change.remove else None
