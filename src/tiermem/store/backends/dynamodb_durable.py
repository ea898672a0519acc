"""DynamoDB durable tier: :class:`DynamoDBDurableStore` (layout in :mod:`.dynamodb`).

* Every write of a session commits its ``META`` item (the session header, see
  :mod:`.dynamodb_header`: turn counter, owner, lifetime, life tag ``gen``, TTL horizon),
  conditioned on META's write counter ``mv`` (and life ``gen``) as read, together with its
  own items in ONE TransactWriteItems. So turn indexes are gap-free under concurrent
  appenders, and the owner, the lifetime raise (``max``, computed from the META read), the
  idempotency key and the records all change atomically with what they describe. A lost
  race is retried, unless the caller pinned ``first_index`` and it no longer holds (then
  it is a :class:`ConflictError`). An append must fit one transaction: 100 items counting META,
  the key and the parts of split turns, and 4 MB.
* Every turn item records its batch (``bs``..``be``) and every part the ``tag`` of its write,
  so a read that saw half of a concurrent transaction notices and queries again.
* Turns expire on their own: ``exp_us`` against the injected clock, ``ttl`` gc_grace later.
* Records and idempotency keys live as long as the session: they carry the ``gen`` of the
  life they were written in and count only while META is live with that ``gen``. Their
  ``ttl`` is the header's horizon, never before lifetime + gc_grace; when a write raises
  the lifetime past the horizon, the same transaction raises their ``ttl`` (when they do
  not fit it, they are raised one UpdateItem each just before; raising a TTL early is
  harmless). That happens about once per horizon slack (1 to 30 days) of session life.
* META's ``ttl`` is lifetime + gc_grace (none while the session lives forever), so nothing
  of a dead session stays: META goes gc_grace after the lifetime, records and keys at most
  the slack later, turns before it. While a dead session's META is still there, the next
  write starts a new life and numbering continues where it was; once META is collected it
  restarts at 0, when the old turns' TTLs have passed too (a turn never outlives the
  lifetime). An overwritten slot's leftover parts are never read: a main item names its
  part count and every part must carry its tag.
* An idempotency key is the item ``KEY#<key>`` (first index and count of its append), put
  in the append's transaction on condition that the current life has no such key. When
  it has, the cancellation returns the stored item and the append returns those turns as
  they are stored now.
* ``delete_session`` and ``purge_user`` find everything with Queries (the session's
  partition; the user's partition, then each listed session) and delete it with
  BatchWriteItem. They are not isolated from concurrent writes to the same session. A
  purge leaves a session alone (but for the purged user's marker) if another user owns it
  now.

* The store remembers each session's META after its last read or write of it (a bounded
  LRU, :class:`~.dynamodb_header.HeaderCache`), so an append goes straight to its
  transaction, conditioned on META's ``mv`` and ``gen`` as remembered. When another
  process wrote meanwhile, the cancellation returns META (ALL_OLD): the store retries at
  once from it, or, when the caller pinned ``first_index`` and it no longer matches,
  raises :class:`ConflictError` whose ``actual`` is the real next index, with no read.
  Losing again with a META read during the call means other processes are writing the
  session right now: each further retry waits first (``retry_pause``: capped exponential
  backoff with full jitter), so racing processes stop meeting in lockstep; after
  :data:`~.dynamodb_table.MAX_ATTEMPTS` tries the append gives up with a retryable
  :class:`~tiermem.errors.BackendError` naming the session.
* ``entities=`` (:class:`~tiermem.store.contract.EntityChange`) is merged into the
  ``entities`` record (an ordinary record, read and written by ``get_record`` /
  ``put_record`` as ever) and the whole record rewritten in the append's transaction. The
  store knows the record without reading it when META says this life has none, or when it
  wrote or read it last; otherwise it reads it first (1 Query). Its main item is
  conditioned on the tag it was read with, so a merge never starts from a stale copy.

Round trips: ``append_turns`` 1 TransactWriteItems, an entity change included, when the
store remembers the session (it wrote, registered or read it before in this process);
+1 GetItem of META first when it does not; +1 Query for an entity change when the record
exists and the store has not seen it. A stale memory (another process wrote) costs one
failed transaction more, or, with a ``first_index`` that no longer holds, is that one
failed transaction and a :class:`ConflictError` carrying the next index. A repeated key +1
Query for the stored turns (+1 GetItem of the key when ``first_index`` no longer matches
and the cancellation did not return it); a horizon raise in a session with keys +1 Query
(+ parallel UpdateItems past 100 items).
``register_session`` 1 TransactWriteItems for a free id or one another user holds (the
cancellation returns META), 2 when the owner extends or a dead id is taken over.
``next_index``, ``get_session``, ``get_memory``, ``delete_memory``, ``put_memory`` 1;
``get_record`` 1 BatchGetItem (META and the record; +1 Query for a record split into
parts), shared by the record reads of the session asked for at the same moment (its
failure reaches each of them, a cancelled one leaves it to the others, keys DynamoDB left
unprocessed are sent again and never read as absent);
``put_record`` 1 TransactWriteItems when the store remembers META and the record's stamp
(it wrote or read that record before, :class:`~.dynamodb_header.RecordStamp`), else 2
(GetItem META and GetItem record in parallel, then TransactWriteItems; a stale memory adds
its failed transaction first, but when only META moved on -- an append crossed it -- the
cancellation's META is used and the retry needs no read). A write cancelled on META keeps
the record stamps and the ``entities`` record the store knew of that life;
``get_memories`` 1 BatchGetItem per 100 ids, in parallel (more if keys come back
unprocessed); ``get_turn``, ``get_turns``, ``tail_turns``,
``list_sessions`` 1 Query (more pages past 1 MB);
``redact_turn`` 2; ``query_memories`` 1 Query per memory type, in parallel;
``delete_session`` 1 Query + BatchWriteItem per 25 items; ``purge_user`` 1 Query + 1 Query
per session (parallel) + BatchWriteItem per 25 items.
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
from contextlib import aclosing, suppress
from dataclasses import dataclass, replace
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
from tiermem.store.backends._lanes import Lanes
from tiermem.store.backends.dynamodb_header import (
    HeaderCache,
    KnownRecord,
    KnownSession,
    RecordStamp,
    SessionHeader,
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
    RetryPause,
    backoff_pause,
    check_entity_change,
    check_transaction,
    contention_error,
    expression,
    fits_transaction,
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
    with_parts,
)
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_idempotency_key,
    check_index,
    check_kind,
    check_limit,
    check_memory_ids,
    check_memory_version,
    check_range,
    decode_memory,
    decode_turn,
    decode_turns,
    encode_data,
    encode_memory,
    encode_turn,
)
from tiermem.store.contract import DEFAULT_GC_GRACE, ENTITIES_RECORD, Capability, EntityChange
from tiermem.store.keys import escape_segment, validate_id

__all__ = ["HEADER_CACHE_SIZE", "DynamoDBDurableStore"]

_T = TypeVar("_T")
HEADER_CACHE_SIZE = 10_000
"""Sessions whose META (and entities record) a store remembers by default: a few MB."""
_READ_ATTEMPTS = 8
_PURGE_CONCURRENCY = 8
_REFRESH_CONCURRENCY = 16
_TURNS_LOWER = "TURN#"
_TURNS_UPPER = "TURN#~"
_KEYS_LOWER = "KEY#"
_KEYS_UPPER = "KEY#~"


def _turn_sk(index: int) -> str:
    return f"{_TURNS_LOWER}{index_segment(index)}"


def _record_sk(kind: str) -> str:
    return f"REC#{escape_segment(kind)}"


def _key_sk(idempotency_key: str) -> str:
    return f"{_KEYS_LOWER}{escape_segment(idempotency_key)}"


def _memory_sk(memory_id: str) -> str:
    return f"MEM#{escape_segment(memory_id)}"


def _marker_sk(user_id: str) -> str:
    return f"USER#{escape_segment(user_id)}"


def _user_ref_sk(ref: SessionRef) -> str:
    return f"SESS#{time_segment(ref.created_at)}#{escape_segment(ref.session_id)}"


def _life(head: SessionHeader) -> Item:
    """The ``gen`` attribute of an item written in ``head``'s life (none in the life of a
    META from before sessions had lives, whose old records have none either)."""
    return {"gen": s(head.gen)} if head.gen else {}


def _in_life(item: Item, head: SessionHeader) -> bool:
    return get_str(item, "gen") == head.gen


def _same_life(a: SessionHeader | None, b: SessionHeader | None) -> bool:
    return a is not None and b is not None and a.gen == b.gen


def _same_head(a: SessionHeader | None, b: SessionHeader | None) -> bool:
    """Whether two headers are the same META write (same life, same write counter)."""
    return a is not None and b is not None and (a.gen, a.mv) == (b.gen, b.mv)


def _mv(head: SessionHeader | None) -> int:
    return head.mv if head is not None else 0


def _next_of(known: KnownSession) -> int:
    return known.head.next_index if known.head is not None else 0


def _stored_record(
    items: Sequence[Item], sk: str, live: SessionHeader
) -> tuple[bool, KnownRecord | None]:
    """The record whose main item is ``sk`` among ``items`` (a Query of it and its parts):
    (True, the record) or (True, None) when ``live``'s life has none; (False, None) when
    the items are not one write (a Query saw half of a transaction: read again)."""
    by_sk = {get_str(item, "sk"): item for item in items}
    main = by_sk.get(sk)
    if main is None or not _in_life(main, live):
        return True, None
    tag, count = get_str(main, "tag"), get_int(main, "np", 1)
    chunks = payload_chunks(by_sk, sk, tag=tag, count=count)
    if chunks is None:
        return False, None
    return True, KnownRecord(SessionRecord.model_validate_json(unpack(chunks)), tag, count)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a shared read's failure as seen: its callers may all have been cancelled."""
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True)
class _RecordWrite:
    """The transaction actions writing one record, and what they make of it."""

    actions: list[Item]
    record: KnownRecord
    written: list[str]
    size: int


class DynamoDBDurableStore:
    """Durable tier on DynamoDB. See :class:`tiermem.store.contract.DurableStore`.

    Constructor arguments are those of
    :class:`~tiermem.store.backends.dynamodb_hot.DynamoDBHotStore` (without the activity
    shards, which only the hot tier has), and ``header_cache_size``: how many sessions'
    META the store remembers so that an append needs no read first (module docstring; 0
    remembers none, and every append reads META first).
    """

    name = "dynamodb"
    capabilities = frozenset(
        {
            Capability.PERSISTENT,
            Capability.NATIVE_TTL,
            Capability.ENTITIES_IN_APPEND,
            Capability.OPTIMISTIC_APPEND,
        }
    )

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
        header_cache_size: int = HEADER_CACHE_SIZE,
        retry_pause: RetryPause = backoff_pause,
    ) -> None:
        self._table = DynamoDBTable(
            table_name,
            endpoint_url=endpoint_url,
            region_name=region_name,
            session=session,
            client=client,
            pause=retry_pause,
        )
        self._clock = clock or SystemClock()
        self._wall_clock = wall_clock or SystemClock()
        self._gc_grace = gc_grace
        self._known = HeaderCache(header_cache_size)
        # Appends of one session from this process queue here rather than race (see _lanes).
        self._lanes = Lanes()
        # Per partition, the keys of the BatchGetItem about to be sent and its task.
        self._record_reads: dict[
            str, tuple[set[tuple[str, str]], asyncio.Task[dict[str, Item]]]
        ] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _now_us(self) -> int:
        return to_us(self._clock.now())

    def _ttl_of(self, expires_at: datetime) -> int:
        return ttl_at(
            expires_at, clock=self._clock, wall_clock=self._wall_clock, grace=self._gc_grace
        )

    def _expiry(self, expires_at: datetime | None) -> Item:
        """The logical expiry and native TTL attributes of a turn (none: forever)."""
        if expires_at is None:
            return {}
        return {"exp_us": n(to_us(expires_at)), "ttl": n(self._ttl_of(expires_at))}

    @staticmethod
    def _horizon(head: SessionHeader) -> Item:
        """The ``ttl`` of a record or key item written in ``head``'s life."""
        return {"ttl": n(head.hz)} if head.hz is not None else {}

    def _visible(self, item: Item) -> bool:
        return "exp_us" not in item or self._now_us() < get_int(item, "exp_us")

    def _put(self, item: Item, **condition: Any) -> Item:
        return {"Put": {"TableName": self._table.name, "Item": item, **condition}}

    def _delete(self, pk: str, sk: str) -> Item:
        return {"Delete": {"TableName": self._table.name, "Key": key(pk, sk)}}

    async def _read_header(self, pk: str) -> SessionHeader | None:
        """META as it is now, remembered for the next append (:class:`HeaderCache`)."""
        item = await self._table.get(pk, META)
        return self._remember_header(pk, SessionHeader.parse(item) if item is not None else None)

    def _remember_header(self, pk: str, head: SessionHeader | None) -> SessionHeader | None:
        """Remember META ``head``, just read, unless this store knows a later one."""
        prior = self._known.get(pk)
        if prior is None or not _same_life(prior.head, head) or _mv(prior.head) < _mv(head):
            stamps = prior.stamps_in(head.gen) if prior is not None and head is not None else {}
            self._known.put(pk, KnownSession(head, stamps=stamps))
        # Else the store knows this META already (with the entities record it may know
        # too), or a later one it wrote itself while the read was on its way.
        return head

    def _refreshed(self, pk: str, item: Item | None) -> KnownSession:
        """Remember META ``item`` (None: gone), returned by a write it cancelled, with the
        record stamps and the ``entities`` record this store holds for its life.

        Keeping them is safe: a write that trusts a stamp, or merges into the remembered
        entities record, is conditioned on that record's tag, so a stale one costs one
        failed write. Dropping them made the next ``put_record`` of the session read META
        and the record first (2 GetItems), and the next entity change Query the record,
        whenever a background record write and an append crossed.
        """
        head = SessionHeader.parse(item) if item is not None else None
        prior = self._known.get(pk)
        stamps: dict[str, RecordStamp] = {}
        entities: KnownRecord | None = None
        if prior is not None and head is not None:
            stamps = prior.stamps_in(head.gen)
            if prior.head is not None and prior.head.gen == head.gen:
                entities = prior.entities
        known = KnownSession(head, entities, stamps)
        self._known.put(pk, known)
        return known

    def _live(self, head: SessionHeader | None) -> SessionHeader | None:
        return head if head is not None and head.live(self._now_us()) else None

    def _ttl_update(self, pk: str, sk: str, horizon: int | None, *, plain: bool = False) -> Item:
        """Raise one item's ``ttl`` to ``horizon`` (None: remove it), never creating it."""
        params: dict[str, Any] = {"TableName": self._table.name, "Key": key(pk, sk)}
        if horizon is None:
            params |= expression(
                UpdateExpression="REMOVE #ttl", ConditionExpression="attribute_exists(#pk)"
            )
        else:
            params |= expression(
                UpdateExpression="SET #ttl = :h", ConditionExpression="attribute_exists(#pk)"
            )
            params["ExpressionAttributeValues"] = {":h": n(horizon)}
        return params if plain else {"Update": params}

    async def _long_lived(self, pk: str, head: SessionHeader) -> list[str]:
        """Sort keys of every record item (parts included) and key item of ``head``'s life."""
        sks = [
            sk for kind, count in head.kinds.items() for sk in with_parts(_record_sk(kind), count)
        ]
        if head.keys:
            items = await self._table.query_partition(
                pk, lower=_KEYS_LOWER, upper=_KEYS_UPPER, projection="#sk, #gen"
            )
            sks += [get_str(item, "sk") for item in items if _in_life(item, head)]
        return sks

    async def _raise_ttls(self, pk: str, sks: Collection[str], horizon: int | None) -> None:
        """:meth:`_ttl_update` for many items, outside any transaction, in parallel."""
        semaphore = asyncio.Semaphore(_REFRESH_CONCURRENCY)

        async def one(sk: str) -> None:
            async with semaphore:
                # An item that is gone (a delete that stopped halfway) has nothing to keep.
                with suppress(ConditionFailed):
                    await self._table.call(
                        "update_item", **self._ttl_update(pk, sk, horizon, plain=True)
                    )

        await asyncio.gather(*(one(sk) for sk in sks))

    async def _commit(
        self,
        pk: str,
        old: SessionHeader | None,
        new: SessionHeader,
        actions: Sequence[Item],
        *,
        refresh: bool,
        written: Collection[str] = (),
        payload_bytes: int = 0,
        what: str,
    ) -> None:
        """Write META ``new`` (action 0) and ``actions`` (1, 2...) in one transaction, on
        condition that META is still ``old`` as read (None: absent).

        With ``refresh`` (the write raised the horizon of ``old``'s live session), every
        record and key item of that life but those in ``written`` (which ``actions``
        rewrite) gets ``ttl`` = ``new.hz``: in the transaction when they fit, else one
        UpdateItem each first.

        Raises:
            ConditionFailed: META is no longer ``old``, or a condition of ``actions`` failed
                (see its ``codes``); nothing was written.
            ValidationError: META and ``actions`` do not fit one transaction.
        """
        if old is None:
            condition = expression(ConditionExpression="attribute_not_exists(#pk)")
        else:
            condition = old.condition()
        meta = self._put(new.item(pk), ReturnValuesOnConditionCheckFailure="ALL_OLD", **condition)
        batch = [meta, *actions]
        check_transaction(batch, payload_bytes=payload_bytes, what=what)
        stale: list[str] = []
        if refresh and old is not None:
            stale = [sk for sk in await self._long_lived(pk, old) if sk not in set(written)]
            if fits_transaction(len(batch) + len(stale), payload_bytes=payload_bytes):
                batch += [self._ttl_update(pk, sk, new.hz) for sk in stale]
            else:
                await self._raise_ttls(pk, stale, new.hz)
        try:
            await self._table.write(batch)
        except ConditionFailed as failed:
            own = 1 + len(actions)
            if failed.contention or not any(failed.failed(i) for i in range(own, len(batch))):
                raise
            if any(failed.failed(i) for i in range(own)):
                raise
            # An item META lists is gone (a delete that stopped halfway): raise the others
            # one by one, skipping it, and write without them.
            await self._raise_ttls(pk, stale, new.hz)
            await self._table.write(batch[:own])

    # -- turn archive ------------------------------------------------------------------------

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
    ) -> list[Turn]:
        check_append(session_id, turns, first_index=first_index)
        idem = check_idempotency_key(idempotency_key)
        check_aware(expires_at, what="expires_at")
        change = check_entity_change(entities)
        async with self._lanes.lane(session_id):
            return await self._append_in_lane(
                session_id, turns, first_index, expires_at, idem, change
            )

    async def _append_in_lane(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        first_index: int | None,
        expires_at: datetime | None,
        idem: str | None,
        change: EntityChange | None,
    ) -> list[Turn]:
        """:meth:`append_turns` on checked arguments, alone among this process's appends
        to the session (so a lost condition means another process wrote)."""
        upsert: dict[str, JsonValue] = {}
        if change is not None:
            upsert = {kind: e.model_dump(mode="json") for kind, e in change.upsert.items()}
        pk = session_pk(session_id)
        expiry = self._expiry(expires_at)
        # The header this process last saw: the write goes out conditioned on it, no read
        # first. ``fresh``: it was read (or returned by a failed write) during this call.
        known = self._known.get(pk)
        fresh = False
        key_item: Item | None = None  # the key item a failed write returned
        for attempt in range(MAX_ATTEMPTS):
            if known is None or (
                first_index is not None and not fresh and _next_of(known) != first_index
            ):
                # Nothing remembered, or the caller knows better: read before writing.
                known = KnownSession(await self._read_header(pk))
                fresh = True
            now_us = self._now_us()
            old = known.head
            live = self._live(old)
            if key_item is not None and live is not None and _in_life(key_item, live):
                return await self._replay(session_id, key_item)
            # A dead session's META, until its TTL collects it, keeps the numbering going.
            start = old.next_index if old is not None else 0
            if first_index is not None and first_index != start:
                if idem is not None and live is not None:
                    stored = await self._table.get(pk, _key_sk(idem))
                    if stored is not None and _in_life(stored, live):
                        return await self._replay(session_id, stored)
                raise ConflictError(
                    f"session {session_id!r}: next archived turn index is {start}, "
                    f"not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            new = SessionHeader.successor(old, live=live is not None, now_us=now_us)
            refresh = new.extend(live, expires_at, now_us=now_us, ttl_of=self._ttl_of)
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            end = start + len(indexed)
            new.next_index = end
            actions: list[Item] = []
            written: list[str] = []
            if idem is not None:
                new.keys += 1
                actions.append(self._key_put(pk, idem, new, start, len(indexed)))
                written.append(_key_sk(idem))
            record_at = 1 + len(actions)  # the action number of the entities record
            size = 0
            merged = known.entities if live is not None else None
            if change is not None:
                current = await self._current_entities(session_id, known, live)
                known = replace(known, entities=current)
                step = self._merge_entities(pk, live, new, current, upsert, change.remove)
                merged = step.record
                actions += step.actions
                written += step.written
                size += step.size
            tag = secrets.token_hex(6)
            for turn in indexed:
                packed = pack(encode_turn(turn), what=f"turn {turn.index}")
                items = payload_items(pk, _turn_sk(turn.index), packed, tag=tag)
                items[0] |= {"bs": n(start), "be": n(end)}
                actions += [self._put(item | expiry) for item in items]
                size += packed.size
            try:
                await self._commit(
                    pk,
                    old,
                    new,
                    actions,
                    refresh=refresh,
                    written=written,
                    payload_bytes=size,
                    what=f"appending {len(turns)} turns to session {session_id!r}",
                )
            except ConditionFailed as failed:
                if idem is not None and failed.failed(1) and not failed.failed(0):
                    # META held, so the key is of the life that was read: a repeat.
                    stored = failed.item(1) or await self._table.get(pk, _key_sk(idem))
                    if stored is not None:
                        return await self._replay(session_id, stored)
                if failed.failed(0):
                    # META moved on: the cancellation carries it (none: it is gone), as
                    # good as a read. The key item it returned tells a repeat at once.
                    # Lost on a header remembered from before this call, the write was
                    # only stale: the next attempt goes at once (a pause would make it
                    # stale again). Lost on a header read during this call, other
                    # processes are writing the session right now, and going at once
                    # would meet them again in lockstep, round after round: pause first.
                    contended = fresh
                    item = failed.item(0)
                    known = self._refreshed(pk, item)
                    if change is not None and failed.failed(record_at):
                        known = replace(known, entities=None)  # it changed too: read it
                    fresh = True
                    key_item = failed.item(1) if idem is not None and failed.failed(1) else None
                    if contended and key_item is None and attempt + 1 < MAX_ATTEMPTS:
                        await self._table.pause(attempt)
                    continue
                if change is not None and failed.failed(record_at):
                    known = KnownSession(old)  # the record changed since it was read
                    fresh = True
                    continue
                # A concurrent transaction was in the way: pause, then read again.
                known, fresh = None, False
                await self._table.pause(attempt)
                continue
            # A merged entities record is ``merged``; its stamp is out of date.
            without = ENTITIES_RECORD if change is not None else None
            stamps = known.stamps_in(new.gen, without=without)
            self._known.put(pk, KnownSession(new, merged, stamps))
            return indexed
        raise contention_error(f"append_turns on session {session_id!r}")

    async def _current_entities(
        self, session_id: str, known: KnownSession, live: SessionHeader | None
    ) -> KnownRecord | None:
        """The ``entities`` record of ``live``'s life: None when the header lists none,
        else as remembered, else read (1 Query)."""
        if live is None or ENTITIES_RECORD not in live.kinds:
            return None
        if known.entities is not None:
            return known.entities
        pk, sk = session_pk(session_id), _record_sk(ENTITIES_RECORD)
        for attempt in range(_READ_ATTEMPTS):
            items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
            settled, record = _stored_record(items, sk, live)
            if settled:
                return record
            await self._table.pause(attempt)
        raise self._unsettled(session_id)

    def _merge_entities(
        self,
        pk: str,
        live: SessionHeader | None,
        new: SessionHeader,
        current: KnownRecord | None,
        upsert: Mapping[str, JsonValue],
        remove: Collection[str],
    ) -> _RecordWrite:
        """The items writing ``current`` (None: absent) with a change merged in, one
        version up, for the append's transaction.

        Raises:
            ValidationError: the merged record is over :data:`MAX_RECORD_BYTES`.
        """
        data: dict[str, JsonValue] = dict(current.record.data) if current is not None else {}
        for kind in remove:
            data.pop(kind, None)
        data.update(upsert)
        encode_data(data, what=f"record {ENTITIES_RECORD!r}")
        record = SessionRecord(
            kind=ENTITIES_RECORD,
            data=data,
            version=(current.record.version if current is not None else 0) + 1,
            updated_at=self._clock.now(),
            expires_at=new.lifetime,
        )
        sk = _record_sk(ENTITIES_RECORD)
        packed = pack(record.model_dump_json(), what=f"record {ENTITIES_RECORD!r}")
        tag = secrets.token_hex(6)
        items = payload_items(pk, sk, packed, tag=tag)
        items[0] |= {"version": n(record.version)} | _life(new)
        # META's condition already excludes any other write of this life; the tag also
        # catches a record read that was older than the header it was read after.
        condition: dict[str, Any] = {}
        if current is not None:
            condition = expression(ConditionExpression="#tag = :tag")
            condition["ExpressionAttributeValues"] = {":tag": s(current.tag)}
        actions = [self._put(items[0] | self._horizon(new), **condition)]
        actions += [self._put(item | self._horizon(new)) for item in items[1:]]
        old_count = current.count if current is not None else 1
        actions += [self._delete(pk, part_sk(sk, p)) for p in range(packed.count, old_count)]
        listed = live.kinds.get(ENTITIES_RECORD, 1) if live is not None else 1
        new.kinds[ENTITIES_RECORD] = packed.count
        return _RecordWrite(
            actions=actions,
            record=KnownRecord(record, tag, packed.count),
            written=with_parts(sk, max(listed, old_count, packed.count)),
            size=packed.size,
        )

    def _key_put(self, pk: str, idem: str, head: SessionHeader, first: int, count: int) -> Item:
        """Record an idempotency key, on condition that ``head``'s life has not got it."""
        item = key(pk, _key_sk(idem)) | {"first": n(first), "count": n(count)}
        item |= _life(head) | self._horizon(head)
        if head.gen:
            condition = expression(ConditionExpression="attribute_not_exists(#pk) OR #gen <> :g")
            condition["ExpressionAttributeValues"] = {":g": s(head.gen)}
        else:
            condition = expression(
                ConditionExpression="attribute_not_exists(#pk) OR attribute_exists(#gen)"
            )
        return self._put(item, ReturnValuesOnConditionCheckFailure="ALL_OLD", **condition)

    async def _replay(self, session_id: str, stored: Item) -> list[Turn]:
        """The turns of the append that recorded key item ``stored``, as stored now."""
        first, count = get_int(stored, "first"), get_int(stored, "count")
        payloads = await self._read_range(
            session_id, _turn_sk(first), parts_upper(_turn_sk(first + count - 1))
        )
        return decode_turns(payloads, session_id=session_id)

    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        head = await self._read_header(session_pk(session_id))
        return head.next_index if head is not None else 0

    def _visible_payloads(self, items: Sequence[Item]) -> list[str] | None:
        """The payloads of the visible turns among ``items`` (a contiguous range of the
        archive, in any order), in index order, or None if the items are not a consistent
        view (a write was half seen). Decoding is the caller's: a list skips a turn that
        cannot be decoded, a read of that one turn raises."""
        by_sk = {get_str(item, "sk"): item for item in items}
        mains = {
            int(sk.removeprefix(_TURNS_LOWER)): item
            for sk, item in by_sk.items()
            if "#P" not in sk.removeprefix(_TURNS_LOWER)
        }
        if not mains:
            return []
        low, high = min(mains), max(mains)
        payloads = []
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
            payloads.append(unpack(chunks))
        return payloads

    async def _read_range(self, session_id: str, lower: str, upper: str) -> list[str]:
        """The payloads of the visible turns with sort keys in ``lower``..``upper``."""
        pk = session_pk(session_id)
        for attempt in range(_READ_ATTEMPTS):
            payloads = self._visible_payloads(
                await self._table.query_partition(pk, lower=lower, upper=upper)
            )
            if payloads is not None:
                return payloads
            await self._table.pause(attempt)
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
        payloads = await self._read_range(session_id, sk, parts_upper(sk))
        if not payloads:
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return decode_turn(payloads[0])

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        if end == start:
            return []
        upper = _TURNS_UPPER if end is None else parts_upper(_turn_sk(end - 1))
        payloads = await self._read_range(session_id, _turn_sk(start), upper)
        return decode_turns(payloads, session_id=session_id)

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
            payloads = self._visible_payloads(items)
            if payloads is not None:
                return decode_turns(payloads[-count:], session_id=session_id)
            await self._table.pause(attempt)
        raise self._unsettled(session_id)

    async def redact_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)
        pk, sk = session_pk(session_id), _turn_sk(index)
        for attempt in range(MAX_ATTEMPTS):
            items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
            payloads = self._visible_payloads(items)
            if payloads is None:
                await self._table.pause(attempt)
                continue
            if not payloads:
                raise NotFoundError(f"session {session_id!r} has no turn {index}")
            turn = decode_turn(payloads[0])
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
                await self._table.pause(attempt)
                continue
            return redacted
        raise contention_error(f"redact_turn on session {session_id!r}")

    # -- sessions -----------------------------------------------------------------------------

    async def register_session(
        self, ref: SessionRef, *, expires_at: datetime | None = None
    ) -> SessionRef:
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        check_aware(expires_at, what="expires_at")
        pk = session_pk(ref.session_id)
        upk, usk = user_pk(ref.user_id), _user_ref_sk(ref)
        # The marker lets delete_session find the list entry; it exists exactly when the
        # user's list has the session, so a failed condition on it means "already listed".
        listing = [
            self._put(
                key(pk, _marker_sk(ref.user_id)) | {"upk": s(upk), "usk": s(usk)},
                **expression(ConditionExpression="attribute_not_exists(#pk)"),
            ),
            self._put(key(upk, usk) | {"sid": s(ref.session_id), "d": s(ref.model_dump_json())}),
        ]
        listed = False
        # The first attempt assumes a new id: one transaction, no read. When META exists,
        # the cancellation returns it, which is as good as a read.
        old_item: Item | None = None
        read = False
        for attempt in range(MAX_ATTEMPTS):
            if read:
                old_item = await self._table.get(pk, META)
            now_us = self._now_us()
            old = SessionHeader.parse(old_item) if old_item is not None else None
            live = self._live(old)
            holder = live.owner if live is not None else None
            if holder is not None and holder.user_id != ref.user_id:
                return holder
            new = SessionHeader.successor(old, live=live is not None, now_us=now_us)
            refresh = new.extend(live, expires_at, now_us=now_us, ttl_of=self._ttl_of)
            actions: list[Item] = []
            if holder is None:
                new.owner = holder = ref
                actions = [] if listed else listing
            elif live is not None and new.exp_us == live.exp_us:
                return holder  # the owner again, and the lifetime is long enough already
            try:
                await self._commit(
                    pk, old, new, actions, refresh=refresh, what=f"register {ref.session_id!r}"
                )
            except ConditionFailed as failed:
                listed = listed or (bool(actions) and failed.failed(1))
                if failed.failed(0) and failed.item(0) is not None:
                    old_item, read = failed.item(0), False
                else:
                    # META held (only the marker failed: the META read is still good) or
                    # the cancellation did not say what it is now.
                    read = failed.contention or failed.failed(0)
                if failed.contention or (attempt and failed.failed(0)):
                    await self._table.pause(attempt)
                continue
            self._known.put(pk, KnownSession(new))
            return holder
        raise contention_error(f"register_session {ref.session_id!r}")

    async def get_session(self, session_id: str) -> SessionRef | None:
        validate_id(session_id, what="session_id")
        head = await self._read_header(session_pk(session_id))
        live = self._live(head)
        return live.owner if live is not None else None

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
            # META and the record's main item in one request (shared with the other record
            # reads of the session asked for at the same moment); the parts of a split
            # record (over 350 KB compressed) with one Query more.
            by_sk = await self._read_with_meta(pk, sk)
            meta = by_sk.get(META)
            head = self._remember_header(
                pk, SessionHeader.parse(meta) if meta is not None else None
            )
            live = self._live(head)
            if live is None:
                return None
            main = by_sk.get(sk)
            items = [main] if main is not None else []
            if main is not None and _in_life(main, live) and get_int(main, "np", 1) > 1:
                items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
            settled, stored = _stored_record(items, sk, live)
            if settled:
                if stored is None:
                    return None
                self._remember_stamp(pk, kind, stored, live)
                return stored.record
            await self._table.pause(attempt)
        raise self._unsettled(session_id)

    async def _read_with_meta(self, pk: str, sk: str) -> dict[str, Item]:
        """META and item ``sk`` of partition ``pk`` (strongly consistent), by sort key.

        Reads of one partition asked for in the same turn of the event loop (say three
        ``get_record`` in an ``asyncio.gather``) share one BatchGetItem. It is sent after
        every one of them was asked for, so each still sees every write that had finished
        before it was called.
        """
        pending = self._record_reads.get(pk)
        if pending is None:
            keys = {(pk, META)}
            task = asyncio.ensure_future(self._send_reads(pk, keys))
            task.add_done_callback(_retrieve)
            pending = self._record_reads[pk] = (keys, task)
        keys, task = pending
        keys.add((pk, sk))
        return await asyncio.shield(task)

    async def _send_reads(self, pk: str, keys: set[tuple[str, str]]) -> dict[str, Item]:
        # This first runs after the callers already scheduled have joined: close the batch.
        if self._record_reads.get(pk, (None,))[0] is keys:
            del self._record_reads[pk]
        return {get_str(i, "sk"): i for i in await self._table.get_keys(sorted(keys))}

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
        check_aware(expires_at, what="expires_at")
        copy = json.loads(encode_data(data, what=f"record {kind!r}"))
        pk, sk = session_pk(session_id), _record_sk(kind)
        # The header and the record's stamp this process last saw, when it has both: the
        # write goes out conditioned on them, no read first; anything that does not hold
        # (a stale memory, an expected_version it disagrees with) falls back to reading.
        known = self._known.get(pk)
        trusted = known if known is not None and known.stamp(kind) is not None else None
        for attempt in range(MAX_ATTEMPTS):
            main: Item | None
            if trusted is not None:
                old, main = trusted.head, self._stamp_item(trusted, kind)
            else:
                old, main = await asyncio.gather(
                    self._read_header(pk),
                    self._table.get(pk, sk, projection="#version, #np, #gen, #tag"),
                )
            now_us = self._now_us()
            live = self._live(old)
            actual = 0
            if live is not None and main is not None and _in_life(main, live):
                actual = get_int(main, "version")
            if trusted is not None and (live is None or expected_version not in (None, actual)):
                trusted = None
                continue
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"record {kind!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            new = SessionHeader.successor(old, live=live is not None, now_us=now_us)
            refresh = new.extend(live, expires_at, now_us=now_us, ttl_of=self._ttl_of)
            record = SessionRecord(
                kind=kind,
                data=copy,
                version=actual + 1,
                updated_at=self._clock.now(),
                expires_at=new.lifetime,
            )
            packed = pack(record.model_dump_json(), what=f"record {kind!r}")
            tag = secrets.token_hex(6)
            items = payload_items(pk, sk, packed, tag=tag)
            items[0] |= {"version": n(record.version)} | _life(new)
            # The two reads are not one snapshot: the record must still be the one read.
            if main is None:
                condition = expression(ConditionExpression="attribute_not_exists(#pk)")
            else:
                condition = expression(ConditionExpression="#tag = :tag")
                condition["ExpressionAttributeValues"] = {":tag": main["tag"]}
            actions = [self._put(items[0] | self._horizon(new), **condition)]
            actions += [self._put(item | self._horizon(new)) for item in items[1:]]
            # Parts the previous version had beyond this one's (of any life: ours to clean).
            old_count = get_int(main, "np", 1) if main is not None else 1
            actions += [self._delete(pk, part_sk(sk, p)) for p in range(packed.count, old_count)]
            listed = max(old_count, live.kinds.get(kind, 1) if live is not None else 1)
            new.kinds[kind] = packed.count
            try:
                await self._commit(
                    pk,
                    old,
                    new,
                    actions,
                    refresh=refresh,
                    written=with_parts(sk, max(listed, packed.count)),
                    payload_bytes=packed.size,
                    what=f"record {kind!r}",
                )
            except ConditionFailed as failed:
                if trusted is not None:
                    # Only META moved on (an append of this or another process): the
                    # cancellation carries it, and the record's stamp still held, so the
                    # next attempt trusts both again. Else read what the other writer wrote.
                    # A loss after the first was on a META this call got: writers are
                    # racing right now, so pause rather than meet them again in lockstep.
                    trusted = None
                    if failed.failed(0) and not failed.failed(1):
                        refreshed = self._refreshed(pk, failed.item(0))
                        trusted = refreshed if refreshed.stamp(kind) is not None else None
                    if attempt:
                        await self._table.pause(attempt)
                    continue
                await self._table.pause(attempt)
                continue
            # What the store knew with META ``old`` (the write was conditioned on it, so
            # nothing else changed since) still holds, but for this record.
            base = self._known.get(pk) or KnownSession(None)
            entities = base.entities if _same_head(base.head, old) else None
            if kind == ENTITIES_RECORD:
                entities = KnownRecord(record, tag, packed.count)
            stamps = base.stamps_in(new.gen)
            stamps[kind] = RecordStamp(record.version, tag, packed.count, new.gen)
            self._known.put(pk, KnownSession(new, entities, stamps))
            return record
        raise contention_error(f"put_record {kind!r} on session {session_id!r}")

    @staticmethod
    def _stamp_item(known: KnownSession, kind: str) -> Item | None:
        stamp = known.stamp(kind)
        return stamp.item() if stamp is not None else None

    def _remember_stamp(self, pk: str, kind: str, stored: KnownRecord, live: SessionHeader) -> None:
        """Remember the stamp of a record just read, for the next :meth:`put_record`."""
        known = self._known.get(pk)
        if known is None or known.head is None or known.head.gen != live.gen:
            return
        stamp = RecordStamp(stored.record.version, stored.tag, stored.count, live.gen)
        self._known.put(pk, replace(known, stamps={**known.stamps, kind: stamp}))

    async def _session_keys(
        self, session_id: str, *, purging: str | None = None
    ) -> list[tuple[str, str]]:
        """Keys of everything stored for a session: the user-list entries, then its
        partition with META last (so a failed delete leaves the numbering in place).

        When ``purging`` a user and the session lives on as another user's, only that
        user's marker in it: the id is no longer theirs to delete.
        """
        pk = session_pk(session_id)
        items = await self._table.query_partition(
            pk, projection="#pk, #sk, #upk, #usk, #ref, #exp_us"
        )
        if purging is not None:
            meta = next((i for i in items if get_str(i, "sk") == META), None)
            live = self._live(SessionHeader.parse(meta) if meta is not None else None)
            if live is not None and live.owner is not None and live.owner.user_id != purging:
                return [(pk, _marker_sk(purging))]
        refs = [(get_str(i, "upk"), get_str(i, "usk")) for i in items if "upk" in i]
        own = sorted(((pk, get_str(i, "sk")) for i in items), key=lambda k: k[1] == META)
        return refs + own

    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        self._known.drop(session_pk(session_id))
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
                    await self._table.pause(attempt)
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
                return await self._session_keys(session_id, purging=user_id)

        per_session = await asyncio.gather(*(keys_of(sid) for sid in sessions))
        for sid in sessions:
            self._known.drop(session_pk(sid))
        # Sessions first, the user's own partition last: a purge that fails midway can be
        # run again and still finds the sessions it has not deleted yet.
        await self._table.delete_keys(
            [k for keys in per_session for k in keys] + [(pk, get_str(i, "sk")) for i in items]
        )
        return len(sessions) + memories

    async def aclose(self) -> None:
        await self._table.aclose()
