"""DynamoDB durable tier: :class:`DynamoDBDurableStore` (layout in :mod:`.dynamodb`).

* Turn indexes come from the session's ``META.next_index``: an append reads it and commits
  ``next_index = old + n`` (conditioned on ``old``) with the turn items in ONE
  TransactWriteItems, so indexes are gap-free under concurrent appenders; a lost race is
  retried with jittered backoff, unless the caller pinned ``first_index`` (then it is a
  :class:`ConflictError`). An append must fit one transaction: 100 items counting the
  counter and the parts of split turns, and 4 MB.
* Every turn item records its batch (``bs``..``be``) and every part the ``tag`` of its write,
  so a read that saw half of a concurrent transaction notices and queries again.
* Expiry is logical (``exp_us`` against the injected clock); ``ttl`` lets DynamoDB collect
  the item ``gc_grace`` later. ``META`` has no TTL, so an expired slot is never reused.
* ``delete_session`` and ``purge_user`` find everything with Queries (the session's
  partition; the user's partition, then each listed session) and delete it with
  BatchWriteItem. They are not isolated from concurrent writes to the same session.

Round trips: ``append_turns`` 2 (GetItem + TransactWriteItems); ``next_index``,
``get_memory``, ``delete_memory``, ``put_memory``, ``register_session`` 1; ``get_memories``
1 BatchGetItem per 100 ids, in parallel (more if keys come back unprocessed); ``get_turn``,
``get_turns``, ``tail_turns``, ``get_record``, ``list_sessions`` 1 Query (more pages past
1 MB); ``put_record`` and ``redact_turn`` 2; ``query_memories`` 1 Query per memory type, in
parallel; ``delete_session`` 1 Query + BatchWriteItem per 25 items; ``purge_user`` 1 Query +
1 Query per session (parallel) + BatchWriteItem per 25 items.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import (
    AsyncGenerator,
    Callable,
    Collection,
    Coroutine,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aioboto3

from tiermem.clock import Clock, SystemClock
from tiermem.errors import BackendError, ConflictError, NotFoundError, ValidationError
from tiermem.models import (
    JsonValue,
    MemoryRecord,
    NewTurn,
    SessionRecord,
    SessionRef,
    Turn,
)
from tiermem.store.backends.dynamodb_table import (
    BACKEND,
    BY_CREATED_INDEX,
    BY_TYPE_INDEX,
    MAX_ATTEMPTS,
    META,
    ConditionFailed,
    DynamoDBTable,
    Item,
    backoff_delay,
    check_transaction,
    contention_error,
    expression,
    get_int,
    get_str,
    index_segment,
    key,
    n,
    pack,
    part_sk,
    parts_upper,
    payload_chunks,
    payload_items,
    s,
    session_pk,
    time_segment,
    to_us,
    ttl_at,
    unpack,
    user_pk,
)
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_index,
    check_kind,
    check_limit,
    check_memory_ids,
    check_memory_version,
    check_range,
    decode_memory,
    decode_turn,
    encode_data,
    encode_memory,
    encode_turn,
)
from tiermem.store.contract import DEFAULT_GC_GRACE, Capability
from tiermem.store.keys import escape_segment, validate_id

__all__ = ["DynamoDBDurableStore"]

_T = TypeVar("_T")
_READ_ATTEMPTS = 8
_PURGE_CONCURRENCY = 8
_TURNS_LOWER = "TURN#"
_TURNS_UPPER = "TURN#~"


def _turn_sk(index: int) -> str:
    return f"{_TURNS_LOWER}{index_segment(index)}"


def _record_sk(kind: str) -> str:
    return f"REC#{escape_segment(kind)}"


def _memory_sk(memory_id: str) -> str:
    return f"MEM#{escape_segment(memory_id)}"


def _user_ref_sk(ref: SessionRef) -> str:
    return f"SESS#{time_segment(ref.created_at)}#{escape_segment(ref.session_id)}"


class DynamoDBDurableStore:
    """Durable tier on DynamoDB. See :class:`tiermem.store.contract.DurableStore`.

    Constructor arguments are those of
    :class:`~tiermem.store.backends.dynamodb_hot.DynamoDBHotStore` (without the activity
    shards, which only the hot tier has).
    """

    name = "dynamodb"
    capabilities = frozenset({Capability.PERSISTENT, Capability.NATIVE_TTL})

    def __init__(
        self,
        table_name: str,
        *,
        clock: Clock | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        session: aioboto3.Session | None = None,
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        client: Any = None,
        wall_clock: Clock | None = None,
    ) -> None:
        self._table = DynamoDBTable(
            table_name,
            endpoint_url=endpoint_url,
            region_name=region_name,
            session=session,
            client=client,
        )
        self._clock = clock or SystemClock()
        self._wall_clock = wall_clock or SystemClock()
        self._gc_grace = gc_grace

    # -- helpers ---------------------------------------------------------------------------

    def _expiry(self, expires_at: datetime | None) -> Item:
        """The logical expiry and native TTL attributes of an item (none: forever)."""
        if expires_at is None:
            return {}
        ttl = ttl_at(
            expires_at, clock=self._clock, wall_clock=self._wall_clock, grace=self._gc_grace
        )
        return {"exp_us": n(to_us(expires_at)), "ttl": n(ttl)}

    def _visible(self, item: Item) -> bool:
        return "exp_us" not in item or to_us(self._clock.now()) < get_int(item, "exp_us")

    def _put(self, item: Item, **condition: Any) -> Item:
        return {"Put": {"TableName": self._table.name, "Item": item, **condition}}

    def _delete(self, pk: str, sk: str) -> Item:
        return {"Delete": {"TableName": self._table.name, "Key": key(pk, sk)}}

    # -- turn archive ------------------------------------------------------------------------

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
    ) -> list[Turn]:
        check_append(session_id, turns, first_index=first_index)
        pk = session_pk(session_id)
        expiry = self._expiry(expires_at)
        for attempt in range(MAX_ATTEMPTS):
            meta = await self._table.get(pk, META)
            start = get_int(meta, "next_index") if meta is not None else 0
            if first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next archived turn index is {start}, "
                    f"not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            end = start + len(indexed)
            if meta is None:
                condition = expression(ConditionExpression="attribute_not_exists(#pk)")
            else:
                condition = expression(ConditionExpression="#next_index = :old")
                condition["ExpressionAttributeValues"] = {":old": n(start)}
            actions = [self._put(key(pk, META) | {"next_index": n(end)}, **condition)]
            tag = secrets.token_hex(6)
            size = 0
            for turn in indexed:
                packed = pack(encode_turn(turn), what=f"turn {turn.index}")
                items = payload_items(pk, _turn_sk(turn.index), packed, tag=tag)
                items[0] |= {"bs": n(start), "be": n(end)}
                actions += [self._put(item | expiry) for item in items]
                size += packed.size
            check_transaction(
                actions,
                payload_bytes=size,
                what=f"appending {len(turns)} turns to session {session_id!r}",
            )
            try:
                await self._table.write(actions)
            except ConditionFailed:
                await asyncio.sleep(backoff_delay(attempt))
                continue
            return indexed
        raise contention_error(f"append_turns on session {session_id!r}")

    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        meta = await self._table.get(session_pk(session_id), META, projection="#next_index")
        return get_int(meta, "next_index") if meta is not None else 0

    def _decode_visible(self, items: Sequence[Item]) -> list[Turn] | None:
        """The visible turns among ``items`` (a contiguous range of the archive, in any
        order), or None if the items are not a consistent view (a write was half seen)."""
        by_sk = {get_str(item, "sk"): item for item in items}
        mains = {
            int(sk.removeprefix(_TURNS_LOWER)): item
            for sk, item in by_sk.items()
            if "#P" not in sk.removeprefix(_TURNS_LOWER)
        }
        if not mains:
            return []
        low, high = min(mains), max(mains)
        turns = []
        for index in sorted(mains):
            main = mains[index]
            if not self._visible(main):
                continue
            chunks = payload_chunks(
                by_sk, _turn_sk(index), tag=get_str(main, "tag"), count=get_int(main, "np", 1)
            )
            if chunks is None:
                return None
            # A visible turn's whole batch (same write, same expiry) must be visible too.
            batch = range(max(get_int(main, "bs"), low), min(get_int(main, "be"), high + 1))
            if any(i not in mains for i in batch):
                return None
            turns.append(decode_turn(unpack(chunks)))
        return turns

    async def _read_range(self, session_id: str, lower: str, upper: str) -> list[Turn]:
        pk = session_pk(session_id)
        for attempt in range(_READ_ATTEMPTS):
            turns = self._decode_visible(
                await self._table.query_partition(pk, lower=lower, upper=upper)
            )
            if turns is not None:
                return turns
            await asyncio.sleep(backoff_delay(attempt))
        raise self._unsettled(session_id)

    @staticmethod
    def _unsettled(session_id: str) -> BackendError:
        return BackendError(
            f"the archive of session {session_id!r} kept changing while it was read; retry",
            backend=BACKEND,
            retryable=True,
        )

    async def get_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)
        sk = _turn_sk(index)
        turns = await self._read_range(session_id, sk, parts_upper(sk))
        if not turns:
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return turns[0]

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        if end == start:
            return []
        upper = _TURNS_UPPER if end is None else parts_upper(_turn_sk(end - 1))
        return await self._read_range(session_id, _turn_sk(start), upper)

    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        validate_id(session_id, what="session_id")
        if count < 0:
            raise ValidationError(f"count must be >= 0, got {count}")
        if count == 0:
            return []
        pk = session_pk(session_id)
        for attempt in range(_READ_ATTEMPTS):
            items: list[Item] = []
            visible = 0
            pages = self._table.query(
                ConsistentRead=True,
                ScanIndexForward=False,
                page_size=count + 8,
                ExpressionAttributeValues={
                    ":pk": s(pk),
                    ":lo": s(_TURNS_LOWER),
                    ":hi": s(_TURNS_UPPER),
                },
                **expression(KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi"),
            )
            async with aclosing(pages):
                async for item in pages:
                    items.append(item)
                    # Newest first: a main item comes after its parts, so stopping at the
                    # count-th visible main item leaves no part behind.
                    if "bs" in item:
                        visible += self._visible(item)
                        if visible >= count:
                            break
            turns = self._decode_visible(items)
            if turns is not None:
                return turns[-count:]
            await asyncio.sleep(backoff_delay(attempt))
        raise self._unsettled(session_id)

    async def redact_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)
        pk, sk = session_pk(session_id), _turn_sk(index)
        for attempt in range(MAX_ATTEMPTS):
            items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
            turns = self._decode_visible(items)
            if turns is None:
                await asyncio.sleep(backoff_delay(attempt))
                continue
            if not turns:
                raise NotFoundError(f"session {session_id!r} has no turn {index}")
            (turn,) = turns
            main = next(item for item in items if get_str(item, "sk") == sk)
            redacted = turn.redact()
            packed = pack(encode_turn(redacted), what=f"turn {index}", max_parts=1)
            item = payload_items(pk, sk, packed, tag=secrets.token_hex(6))[0]
            item |= {k: v for k, v in main.items() if k in ("bs", "be", "exp_us", "ttl")}
            condition = expression(ConditionExpression="#tag = :tag")
            condition["ExpressionAttributeValues"] = {":tag": main["tag"]}
            actions = [self._put(item, **condition)]
            actions += [self._delete(pk, part_sk(sk, p)) for p in range(1, get_int(main, "np", 1))]
            try:
                await self._table.write(actions)
            except ConditionFailed:
                await asyncio.sleep(backoff_delay(attempt))
                continue
            return redacted
        raise contention_error(f"redact_turn on session {session_id!r}")

    # -- sessions -----------------------------------------------------------------------------

    async def register_session(self, ref: SessionRef) -> None:
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        upk, usk = user_pk(ref.user_id), _user_ref_sk(ref)
        marker = key(session_pk(ref.session_id), f"USER#{escape_segment(ref.user_id)}")
        actions = [
            self._put(
                marker | {"upk": s(upk), "usk": s(usk)},
                **expression(ConditionExpression="attribute_not_exists(#pk)"),
            ),
            self._put(key(upk, usk) | {"sid": s(ref.session_id), "d": s(ref.model_dump_json())}),
        ]
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self._table.write(actions)
            except ConditionFailed as failed:
                if failed.contention:
                    await asyncio.sleep(backoff_delay(attempt))
                    continue
                return  # already registered: the first registration stands
            return
        raise contention_error(f"register_session {ref.session_id!r}")

    async def _newest(
        self,
        items: AsyncGenerator[Item, None],
        limit: int,
        *,
        time_of: Callable[[Item], str],
        decode: Callable[[Item], _T | None],
        order: Callable[[_T], Any],
    ) -> list[_T]:
        """The first ``limit`` decoded items of a newest-first query, ties ordered by ``order``.

        Sort keys order ties by the escaped id; the contract orders them by the id itself, so
        the whole tie group at the limit is read and sorted here.
        """
        out: list[_T] = []
        boundary: str | None = None
        async with aclosing(items):
            async for item in items:
                when = time_of(item)
                if boundary is not None and when != boundary:
                    break
                value = decode(item)
                if value is None:
                    continue
                out.append(value)
                if len(out) == limit:
                    boundary = when
        out.sort(key=order, reverse=True)
        return out[:limit]

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        validate_id(user_id, what="user_id")
        check_limit(limit)
        items = self._table.query(
            ConsistentRead=True,
            ScanIndexForward=False,
            page_size=limit + 1,
            ExpressionAttributeValues={":pk": s(user_pk(user_id)), ":p": s("SESS#")},
            **expression(KeyConditionExpression="#pk = :pk AND begins_with(#sk, :p)"),
        )
        return await self._newest(
            items,
            limit,
            time_of=lambda item: get_str(item, "sk").split("#")[1],
            decode=lambda item: SessionRef.model_validate_json(get_str(item, "d")),
            order=lambda ref: (ref.created_at, ref.session_id),
        )

    async def get_record(self, session_id: str, kind: str) -> SessionRecord | None:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        pk, sk = session_pk(session_id), _record_sk(kind)
        for attempt in range(_READ_ATTEMPTS):
            items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
            by_sk = {get_str(item, "sk"): item for item in items}
            main = by_sk.get(sk)
            if main is None or not self._visible(main):
                return None
            chunks = payload_chunks(
                by_sk, sk, tag=get_str(main, "tag"), count=get_int(main, "np", 1)
            )
            if chunks is not None:
                return SessionRecord.model_validate_json(unpack(chunks))
            await asyncio.sleep(backoff_delay(attempt))
        raise self._unsettled(session_id)

    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> SessionRecord:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        copy = json.loads(encode_data(data, what=f"record {kind!r}"))
        pk, sk = session_pk(session_id), _record_sk(kind)
        for attempt in range(MAX_ATTEMPTS):
            main = await self._table.get(pk, sk, projection="#version, #exp_us, #np, #tag")
            actual = get_int(main, "version") if main is not None and self._visible(main) else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"record {kind!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            record = SessionRecord(
                kind=kind,
                data=copy,
                version=actual + 1,
                updated_at=self._clock.now(),
                expires_at=expires_at,
            )
            packed = pack(record.model_dump_json(), what=f"record {kind!r}")
            items = payload_items(pk, sk, packed, tag=secrets.token_hex(6))
            items[0]["version"] = n(record.version)
            expiry = self._expiry(expires_at)
            if main is None:
                condition = expression(ConditionExpression="attribute_not_exists(#pk)")
            else:
                condition = expression(ConditionExpression="#tag = :tag")
                condition["ExpressionAttributeValues"] = {":tag": main["tag"]}
            actions = [self._put(items[0] | expiry, **condition)]
            actions += [self._put(item | expiry) for item in items[1:]]
            old_count = get_int(main, "np", 1) if main is not None else 1
            actions += [self._delete(pk, part_sk(sk, p)) for p in range(packed.count, old_count)]
            check_transaction(actions, payload_bytes=packed.size, what=f"record {kind!r}")
            try:
                await self._table.write(actions)
            except ConditionFailed:
                await asyncio.sleep(backoff_delay(attempt))
                continue
            return record
        raise contention_error(f"put_record {kind!r} on session {session_id!r}")

    async def _session_keys(self, session_id: str) -> list[tuple[str, str]]:
        """Keys of everything stored for a session: the user-list entries, then its
        partition with META last (so a failed delete leaves the numbering in place)."""
        pk = session_pk(session_id)
        items = await self._table.query_partition(pk, projection="#pk, #sk, #upk, #usk")
        refs = [(get_str(i, "upk"), get_str(i, "usk")) for i in items if "upk" in i]
        own = sorted(((pk, get_str(i, "sk")) for i in items), key=lambda k: k[1] == META)
        return refs + own

    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        await self._table.delete_keys(await self._session_keys(session_id))

    # -- long-term memory ------------------------------------------------------------------

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        payload = encode_memory(record)
        check_memory_version(record, expected_version)
        packed = pack(payload, what=f"memory {record.memory_id}", max_parts=1)
        created = time_segment(record.created_at)
        mid = escape_segment(record.memory_id)
        item = (
            key(user_pk(record.user_id), _memory_sk(record.memory_id))
            | {
                "d": packed.chunks[0],
                "version": n(record.version),
                "lt": s(f"{escape_segment(record.memory_type)}#{created}#{mid}"),
                "lc": s(f"{created}#{mid}"),
            }
            | self._expiry(record.expires_at)
        )
        params: dict[str, Any] = {"TableName": self._table.name, "Item": item}
        if expected_version is not None:
            params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            if expected_version == 0:
                params |= expression(
                    ConditionExpression="attribute_not_exists(#pk) OR #exp_us <= :now"
                )
                params["ExpressionAttributeValues"] = {}
            else:
                params |= expression(
                    ConditionExpression=(
                        "#version = :v AND (attribute_not_exists(#exp_us) OR #exp_us > :now)"
                    )
                )
                params["ExpressionAttributeValues"] = {":v": n(expected_version)}
        for attempt in range(MAX_ATTEMPTS):
            if expected_version is not None:
                params["ExpressionAttributeValues"][":now"] = n(to_us(self._clock.now()))
            try:
                await self._table.call("put_item", **params)
            except ConditionFailed as failed:
                if failed.contention:
                    await asyncio.sleep(backoff_delay(attempt))
                    continue
                old = failed.items[0] if failed.items else None
                actual = get_int(old, "version") if old and self._visible(old) else 0
                raise ConflictError(
                    f"memory {record.memory_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                ) from None
            return record
        raise contention_error(f"put_memory {record.memory_id!r}")

    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        item = await self._table.get(user_pk(user_id), _memory_sk(memory_id))
        return None if item is None else self._live_memory(item)

    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        ids = check_memory_ids(user_id, memory_ids)
        pk = user_pk(user_id)
        by_sk = {_memory_sk(memory_id): memory_id for memory_id in ids}
        items = await self._table.get_keys((pk, sk) for sk in by_sk)
        found = {by_sk[get_str(item, "sk")]: self._live_memory(item) for item in items}
        return {memory_id: record for memory_id, record in found.items() if record is not None}

    def _live_memory(self, item: Item) -> MemoryRecord | None:
        """The record of a memory item (one item: ``put_memory`` never splits it), or None
        once it has expired."""
        if not self._visible(item):
            return None
        return decode_memory(unpack([item["d"]]))

    async def query_memories(
        self,
        user_id: str,
        *,
        memory_types: Collection[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        include_expired: bool = False,
    ) -> list[MemoryRecord]:
        validate_id(user_id, what="user_id")
        check_limit(limit)
        check_aware(since, what="since")
        check_aware(until, what="until")
        low = time_segment(since) if since is not None else ""
        high = time_segment(until) if until is not None else "~"

        def decode(item: Item) -> MemoryRecord | None:
            if not include_expired and not self._visible(item):
                return None
            return decode_memory(unpack([item["d"]]))

        def newest(
            index: str, attribute: str, prefix: str
        ) -> Coroutine[Any, Any, list[MemoryRecord]]:
            items = self._table.query(
                IndexName=index,
                ConsistentRead=True,
                ScanIndexForward=False,
                page_size=limit + 1,
                ExpressionAttributeValues={
                    ":pk": s(user_pk(user_id)),
                    ":lo": s(f"{prefix}{low or '0'}"),
                    ":hi": s(f"{prefix}{high}"),
                },
                **expression(
                    KeyConditionExpression=f"#pk = :pk AND #{attribute} BETWEEN :lo AND :hi"
                ),
            )
            return self._newest(
                items,
                limit,
                time_of=lambda item: get_str(item, attribute)[len(prefix) :].split("#")[0],
                decode=decode,
                order=lambda r: (r.created_at, r.memory_id),
            )

        if memory_types is None:
            return await newest(BY_CREATED_INDEX, "lc", "")
        types = [t for t in dict.fromkeys(memory_types) if isinstance(t, str) and t]
        found = await asyncio.gather(
            *(newest(BY_TYPE_INDEX, "lt", f"{escape_segment(t)}#") for t in types)
        )
        merged = [record for records in found for record in records]
        merged.sort(key=lambda r: (r.created_at, r.memory_id), reverse=True)
        return merged[:limit]

    async def delete_memory(self, user_id: str, memory_id: str) -> bool:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        response = await self._table.call(
            "delete_item",
            TableName=self._table.name,
            Key=key(user_pk(user_id), _memory_sk(memory_id)),
            ReturnValues="ALL_OLD",
        )
        return bool(response.get("Attributes"))

    async def purge_user(self, user_id: str) -> int:
        validate_id(user_id, what="user_id")
        pk = user_pk(user_id)
        items = await self._table.query_partition(pk, projection="#pk, #sk, #sid")
        sessions = [get_str(i, "sid") for i in items if get_str(i, "sk").startswith("SESS#")]
        memories = sum(get_str(i, "sk").startswith("MEM#") for i in items)
        semaphore = asyncio.Semaphore(_PURGE_CONCURRENCY)

        async def keys_of(session_id: str) -> list[tuple[str, str]]:
            async with semaphore:
                return await self._session_keys(session_id)

        per_session = await asyncio.gather(*(keys_of(sid) for sid in sessions))
        # Sessions first, the user's own partition last: a purge that fails midway can be
        # run again and still finds the sessions it has not deleted yet.
        await self._table.delete_keys(
            [k for keys in per_session for k in keys] + [(pk, get_str(i, "sk")) for i in items]
        )
        return len(sessions) + memories

    async def aclose(self) -> None:
        await self._table.aclose()
