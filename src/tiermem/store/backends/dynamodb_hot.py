"""DynamoDB hot tier: :class:`DynamoDBHotStore` (layout in :mod:`.dynamodb`).

How a hot session is kept consistent without a server-side script:

* The ``META`` item describes the whole live session: generation ``gen``, ``version``,
  ``next_index``, the window's lowest index ``lo`` (and ``gl``..``gh``, indexes missing
  from the window after a restore whose turns ended before ``next_index``), the part
  counts of split turns ``tp``, and the tag of every entity (``ek``) and state blob
  (``st``). Every write reads META, then commits META (a Put conditioned on the version
  and generation it read) together with its child items in ONE TransactWriteItems. A lost
  race changes nothing and is retried with jittered backoff; a caller's
  ``expected_version`` / ``first_index`` that no longer holds becomes a
  :class:`ConflictError` instead.
* Child items (turns, entities, state blobs and their parts) carry a ``tag``; a read
  accepts a child only if META lists it with that tag. A Query is not isolated from a
  concurrent transaction, so ``load`` checks the children it got against META and
  queries again if it saw half a write.
* Expiry is logical (the injected clock against ``exp_us``). The first write after expiry
  starts a new generation: a fresh ``gen``, version 1, and the old generation's items are
  deleted in the same transaction when they fit (else they are ignored and left to TTL).
  ``update_entities`` and ``copy_state`` never start a session: on an absent or expired
  one they write nothing.
* ``restore`` is one such write that replaces everything: a fresh ``gen`` (so every child
  gets a new tag and a load overlapping it notices), the version counted on, state blobs
  with the versions they were given, the old children deleted while the transaction has
  room. The whole restored session must fit one transaction (100 items, 4 MB), else it
  is a :class:`ValidationError` and nothing is written.
* Native TTL: META's ``ttl`` is expires_at + gc_grace. Child items are written with a
  ``ttl`` seven days later than that (``cttl`` in META records the lowest), so a long-lived
  session's old children are not collected under it; when a write or touch would move
  the expiry past ``cttl``, the live children's ``ttl`` is raised first (one UpdateItem
  each, about once a week of session life).

* ``append_turns(entities=...)`` merges the change (remove, then set) in the same
  transaction as the turns, exactly as ``update_entities`` would: the ``E#<kind>`` items
  it sets are written, those it removes deleted, and META's ``ek`` tags changed with them.

Round trips: ``load`` 1 Query; ``get_state`` 1 TransactGetItems (+1 Query if the blob is
split); ``append_turns`` (an entity change included), ``put_metadata``,
``update_entities``, ``restore`` 2 (GetItem META + TransactWriteItems; ``update_entities``
of an absent session 1); ``put_state`` and
``copy_state`` 2 (TransactGetItems + TransactWriteItems; a copy that is not newer, or to an
absent session, 1); ``touch`` and ``release_expired`` 1 UpdateItem; ``claim_expired`` one
Query per activity shard in parallel + one conditional UpdateItem per claimed session in
parallel; ``delete`` 1 Query + one conditional DeleteItem per item in parallel. Each lost
race adds a read and a write.

The shared keyspace (blobs of no session, such as circuit breakers) is one item per name
in a partition of its own, ``pk = SHARED#<escaped name>``, ``sk = SHARED``: ``version``,
``upd_us`` (updated_at), ``exp_us`` (absent: forever), ``d`` (the data's JSON, packed as
above but never split: it must fit one item once compressed, about 350 KB, else
:class:`ValidationError`) and ``ttl`` = expires_at + gc_grace (absent: forever). Expiry is
logical, checked with the injected clock on every read and inside every condition; no
activity-index attributes are written, so a shared blob is never handed off. Round trips:
``get_shared`` 1 GetItem; ``delete_shared`` 1 DeleteItem (ALL_OLD says whether it was
live); ``put_shared`` with ``expected_version`` 1 PutItem conditioned on that version
(0: absent or expired), the holder's version coming back with the failed condition;
without one, 1 UpdateItem that adds 1 to a live blob's version, or, when there is none,
a second call, a PutItem of version 1 conditioned on its absence (a lost race starts over).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aioboto3

from tiermem.clock import Clock, SystemClock
from tiermem.errors import BackendError, ConflictError, ValidationError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionSnapshot,
    StateBlob,
    Turn,
)
from tiermem.store.backends.dynamodb_table import (
    ACTIVITY_INDEX,
    BACKEND,
    MAX_ATTEMPTS,
    MAX_TRANSACTION_ITEMS,
    META,
    ConditionFailed,
    DynamoDBTable,
    Item,
    Packed,
    RetryPause,
    backoff_pause,
    check_entity_change,
    check_transaction,
    contention_error,
    expression,
    from_us,
    get_int,
    get_str,
    hot_pk,
    index_segment,
    key,
    n,
    pack,
    part_sk,
    parts_upper,
    payload_chunks,
    payload_items,
    s,
    session_id_of,
    to_us,
    ttl_at,
    unpack,
    with_parts,
)
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_kind,
    check_limit,
    check_restore,
    decode_turns,
    encode_data,
    encode_shared,
    encode_turn,
    held_expired,
)
from tiermem.store.contract import (
    DEFAULT_GC_GRACE,
    Capability,
    EntityChange,
    HotAppendResult,
)
from tiermem.store.keys import escape_segment, validate_id

__all__ = ["CHILD_TTL_SLACK", "DynamoDBHotStore"]

logger = logging.getLogger(__name__)

CHILD_TTL_SLACK = timedelta(days=7)
"""How much later than META's TTL a child item's TTL is set (see the module docstring)."""
_READ_ATTEMPTS = 8
_REFRESH_CONCURRENCY = 16


_R = TypeVar("_R")


@dataclass
class _Plan:
    """What one hot write puts besides META, and what it makes stale."""

    children: list[Item] = field(default_factory=list)
    cleanup: list[str] = field(default_factory=list)
    payload_bytes: int = 0
    replace: bool = False
    """The write replaces every child (restore): nothing of the old ones is kept alive."""
    advice: str = "Split the batch."
    """What to do when the write is too big for one transaction."""


def _turn_sk(index: int) -> str:
    return f"T#{index_segment(index)}"


def _entity_sk(kind: str) -> str:
    return f"E#{escape_segment(kind)}"


def _state_sk(name: str) -> str:
    return f"ST#{escape_segment(name)}"


_SHARED_SK = "SHARED"
_SHARED_LIVE = "(attribute_not_exists(#exp_us) OR #exp_us > :now)"
_SHARED_GONE = "(attribute_not_exists(#pk) OR #exp_us <= :now)"


def _shared_pk(name: str) -> str:
    return f"SHARED#{escape_segment(name)}"


def _shared_live(item: Item | None, now_us: int) -> bool:
    return item is not None and ("exp_us" not in item or now_us < get_int(item, "exp_us"))


@dataclass
class _Meta:
    """The META item of a hot session, parsed."""

    gen: str
    version: int = 0
    next_index: int = 0
    lo: int = 0
    gl: int = 0
    gh: int = 0
    exp_us: int = 0
    cttl: int = 0
    md: dict[str, Any] | None = None
    tp: dict[int, int] = field(default_factory=dict)
    ek: dict[str, str] = field(default_factory=dict)
    st: dict[str, tuple[str, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, item: Item) -> _Meta:
        return cls(
            gen=get_str(item, "gen"),
            version=get_int(item, "version"),
            next_index=get_int(item, "next_index"),
            lo=get_int(item, "lo"),
            gl=get_int(item, "gl"),
            gh=get_int(item, "gh"),
            exp_us=get_int(item, "exp_us"),
            cttl=get_int(item, "cttl"),
            md=item.get("md"),
            tp={int(k): int(v["N"]) for k, v in item.get("tp", {}).get("M", {}).items()},
            ek={k: v["S"] for k, v in item.get("ek", {}).get("M", {}).items()},
            st={
                k: (v["M"]["t"]["S"], int(v["M"]["n"]["N"]))
                for k, v in item.get("st", {}).get("M", {}).items()
            },
        )

    def live(self, now_us: int) -> bool:
        return now_us < self.exp_us

    def turn_indexes(self) -> list[int]:
        """The indexes of the turns in the window, oldest first.

        They run from ``lo`` to ``next_index``, except for a gap ``gl``..``gh`` that a
        restore leaves when the turns it was given end before ``next_index``.
        """
        if self.gh <= self.lo:
            return list(range(self.lo, self.next_index))
        return [*range(self.lo, self.gl), *range(self.gh, self.next_index)]

    def children(self) -> list[str]:
        """Sort keys of every child item this META lists (parts included)."""
        sks: list[str] = []
        for index in self.turn_indexes():
            sks += with_parts(_turn_sk(index), self.tp.get(index, 1))
        sks += [_entity_sk(kind) for kind in self.ek]
        for name, (_, count) in self.st.items():
            sks += with_parts(_state_sk(name), count)
        return sks


class DynamoDBHotStore:
    """Hot tier on DynamoDB. See :class:`tiermem.store.contract.HotStore`.

    The table must exist (:func:`~tiermem.store.backends.dynamodb.create_table`, the
    ``tiermem`` CLI, or ``deploy/dynamodb.yaml``). ``client`` takes an already open aioboto3
    DynamoDB client (not closed by :meth:`aclose`); otherwise one is opened on first use from
    ``session`` (none: the event loop's shared one,
    :func:`~tiermem.store.backends.dynamodb_table.default_session`) / ``endpoint_url`` /
    ``region_name``. ``wall_clock`` is only used for native TTL timestamps, which DynamoDB
    compares with real time. ``retry_pause`` waits before each retry of a write that lost
    a race (default: capped exponential backoff with full jitter,
    :func:`~tiermem.store.backends.dynamodb_table.backoff_pause`).
    """

    name = "dynamodb"
    capabilities = frozenset(
        {
            Capability.PERSISTENT,
            Capability.NATIVE_TTL,
            Capability.ENTITIES_IN_APPEND,
            Capability.KEEP_EXPIRED,
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
        activity_shards: int = 16,
        client: Any = None,
        wall_clock: Clock | None = None,
        retry_pause: RetryPause = backoff_pause,
    ) -> None:
        if activity_shards < 1:
            raise ValidationError(f"activity_shards must be at least 1, got {activity_shards}")
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
        self._shards = activity_shards

    # -- helpers ---------------------------------------------------------------------------

    def _now_us(self) -> int:
        return to_us(self._clock.now())

    def _ttl(self, expires_at: datetime) -> int:
        return ttl_at(
            expires_at, clock=self._clock, wall_clock=self._wall_clock, grace=self._gc_grace
        )

    def _activity_pk(self, session_id: str) -> str:
        return f"ACT#{zlib.crc32(session_id.encode()) % self._shards:03d}"

    async def _read_meta(self, pk: str) -> _Meta | None:
        item = await self._table.get(pk, META)
        return _Meta.parse(item) if item is not None else None

    def _held(self, meta: _Meta, now_us: int) -> bool:
        """An expired session is held (readable with ``include_expired``) until gc_grace
        after its expiry, when it counts as collected whether or not the native TTL has
        fired."""
        return now_us < meta.exp_us + self._gc_grace // timedelta(microseconds=1)

    @staticmethod
    def _successor(current: _Meta | None) -> _Meta:
        """The META after one more write: the next version, or a new generation."""
        if current is not None:
            return replace(
                current,
                version=current.version + 1,
                tp=dict(current.tp),
                ek=dict(current.ek),
                st=dict(current.st),
            )
        return _Meta(gen=secrets.token_hex(6), version=1)

    @staticmethod
    def _check_version(session_id: str, current: _Meta | None, expected: int | None) -> None:
        actual = current.version if current is not None else 0
        if expected is not None and expected != actual:
            raise ConflictError(
                f"session {session_id!r} is at version {actual}, not {expected}; "
                "reload it and retry",
                expected=expected,
                actual=actual,
            )

    def _meta_item(self, pk: str, session_id: str, meta: _Meta, *, ttl: int) -> Item:
        item = key(pk, META) | {
            "gen": s(meta.gen),
            "version": n(meta.version),
            "next_index": n(meta.next_index),
            "lo": n(meta.lo),
            "exp_us": n(meta.exp_us),
            "cttl": n(meta.cttl),
            "ttl": n(ttl),
            "act_pk": s(self._activity_pk(session_id)),
            "act_sk": n(meta.exp_us),
        }
        if meta.gh > meta.lo:
            item |= {"gl": n(meta.gl), "gh": n(meta.gh)}
        if meta.md is not None:
            item["md"] = meta.md
        if meta.tp:
            item["tp"] = {"M": {str(i): n(c) for i, c in meta.tp.items()}}
        if meta.ek:
            item["ek"] = {"M": {k: s(tag) for k, tag in meta.ek.items()}}
        if meta.st:
            item["st"] = {
                "M": {k: {"M": {"t": s(tag), "n": n(c)}} for k, (tag, c) in meta.st.items()}
            }
        return item

    async def _refresh_children(self, pk: str, meta: _Meta, ttl: int) -> None:
        """Raise the native TTL of every live child so it outlives the session's new expiry."""
        semaphore = asyncio.Semaphore(_REFRESH_CONCURRENCY)

        async def raise_ttl(sk: str) -> None:
            async with semaphore:
                # A child that is gone has nothing to keep alive (a read will notice).
                with suppress(ConditionFailed):
                    await self._table.call(
                        "update_item",
                        TableName=self._table.name,
                        Key=key(pk, sk),
                        ExpressionAttributeValues={":t": n(ttl)},
                        **expression(
                            UpdateExpression="SET #ttl = :t",
                            ConditionExpression="attribute_exists(#pk)",
                        ),
                    )

        await asyncio.gather(*(raise_ttl(sk) for sk in meta.children()))

    async def _commit(
        self,
        session_id: str,
        old: _Meta | None,
        current: _Meta | None,
        new: _Meta,
        plan: _Plan,
        *,
        expires_at: datetime,
        what: str,
    ) -> None:
        """Write META and the plan's children atomically, conditioned on the META read.

        ``old`` is the META that was read (None: absent), ``current`` the same if it was
        live. The plan's ``cleanup`` items are deleted in the same transaction while it has
        room, and otherwise left to their TTL (no read accepts them any more).

        Raises:
            ConditionFailed: META changed since it was read; nothing was written.
            ValidationError: META and children do not fit one transaction.
        """
        pk = hot_pk(session_id)
        ttl = self._ttl(expires_at)
        child_ttl = ttl + int(CHILD_TTL_SLACK.total_seconds())
        if current is not None and not plan.replace:
            cttl = current.cttl
            if cttl < ttl:
                await self._refresh_children(pk, current, child_ttl)
                cttl = child_ttl
            if plan.children:
                cttl = min(cttl, child_ttl)
        else:
            cttl = child_ttl
        new.exp_us = to_us(expires_at)
        new.cttl = cttl
        if old is None:
            condition: dict[str, Any] = expression(ConditionExpression="attribute_not_exists(#pk)")
        else:
            condition = expression(ConditionExpression="#version = :v AND #gen = :g")
            condition["ExpressionAttributeValues"] = {":v": n(old.version), ":g": s(old.gen)}
        table = self._table.name
        actions: list[Item] = [
            {
                "Put": {
                    "TableName": table,
                    "Item": self._meta_item(pk, session_id, new, ttl=ttl),
                    **condition,
                }
            }
        ]
        for child in plan.children:
            actions.append({"Put": {"TableName": table, "Item": child | {"ttl": n(child_ttl)}}})
        check_transaction(actions, payload_bytes=plan.payload_bytes, what=what, advice=plan.advice)
        cleanup = plan.cleanup if current is not None else (old.children() if old else [])
        written = {get_str(c, "sk") for c in plan.children} | {META}
        left = 0
        for sk in dict.fromkeys(cleanup):
            if sk in written:
                continue
            if len(actions) < MAX_TRANSACTION_ITEMS:
                actions.append({"Delete": {"TableName": table, "Key": key(pk, sk)}})
            else:
                left += 1
        if left:
            logger.debug("session %r: %s stale items left to native TTL", session_id, left)
        await self._table.write(actions)

    async def _write(
        self,
        session_id: str,
        planner: Callable[[_Meta | None, _Meta, Item | None], tuple[_Plan | None, _R]],
        *,
        expires_at: datetime,
        what: str,
        state: str | None = None,
        keep_expired: bool = False,
    ) -> _R:
        """One hot write: read META, let ``planner`` fill in its successor, commit; retried.

        ``planner(current, new, blob)`` gets the live META (None when the session is absent
        or expired: then ``new`` starts a new generation), the successor META to complete,
        and the main item of state blob ``state`` (when given, read atomically with META).
        It raises :class:`ConflictError` if the caller's expectation does not hold, and
        returns no plan when there is nothing to write (then nothing is). A write that loses
        a race is planned again from a fresh read. ``keep_expired``: an expired session
        still held (as :meth:`load` with ``include_expired`` sees it) raises ConflictError
        instead of being started afresh.
        """
        pk = hot_pk(session_id)
        for attempt in range(MAX_ATTEMPTS):
            if state is None:
                old, blob = await self._read_meta(pk), None
            else:
                old, blob = await self._read_meta_and_state(pk, state)
            now_us = self._now_us()
            current = old if old is not None and old.live(now_us) else None
            if keep_expired and old is not None and current is None and self._held(old, now_us):
                raise held_expired(session_id, old.version)
            new = self._successor(current)
            plan, result = planner(current, new, blob)
            if plan is None:
                return result
            try:
                await self._commit(
                    session_id,
                    old,
                    current,
                    new,
                    plan,
                    expires_at=expires_at,
                    what=f"{what} on session {session_id!r}",
                )
            except ConditionFailed:
                await self._table.pause(attempt)
                continue
            return result
        raise contention_error(f"{what} on session {session_id!r}")

    # -- HotStore --------------------------------------------------------------------------

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        expires_at: datetime,
        first_index: int | None = None,
        metadata: SessionMetadata | None = None,
        expected_version: int | None = None,
        entities: EntityChange | None = None,
        keep_expired: bool = False,
    ) -> HotAppendResult:
        check_append(session_id, turns, window=window, first_index=first_index)
        change = check_entity_change(entities)
        packed_entities = {}
        if change is not None:
            packed_entities = {
                kind: pack(entity.model_dump_json(), what=f"entity {kind!r}", max_parts=1)
                for kind, entity in change.upsert.items()
            }
        md = None
        if metadata is not None:
            md = pack(metadata.model_dump_json(), what="session metadata", max_parts=1).chunks[0]
        pk = hot_pk(session_id)

        def plan(
            current: _Meta | None, new: _Meta, _: Item | None
        ) -> tuple[_Plan, HotAppendResult]:
            self._check_version(session_id, current, expected_version)
            start = current.next_index if current is not None else (first_index or 0)
            if current is not None and first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next turn index is {start}, not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            payloads = [encode_turn(turn) for turn in indexed]
            new.next_index = start + len(indexed)
            before = current.turn_indexes() if current is not None else []
            kept = [*before, *(turn.index for turn in indexed)][-window:]
            new.lo = kept[0]
            if new.gh <= new.lo:
                new.gl = new.gh = 0  # a restore's gap has left the window
            new.tp = {i: c for i, c in new.tp.items() if i >= new.lo}
            if md is not None:
                new.md = md
            step = _Plan()
            for turn, payload in zip(indexed, payloads, strict=True):
                if turn.index < new.lo:
                    continue  # falls out of the window in this very write
                packed = pack(payload, what=f"turn {turn.index}")
                step.children += payload_items(pk, _turn_sk(turn.index), packed, tag=new.gen)
                if packed.count > 1:
                    new.tp[turn.index] = packed.count
                step.payload_bytes += packed.size
            if current is not None:
                step.cleanup = [
                    sk
                    for i in before
                    if i < new.lo
                    for sk in with_parts(_turn_sk(i), current.tp.get(i, 1))
                ]
            if change is not None:
                self._plan_entities(step, pk, new, change.remove, packed_entities)
            result = HotAppendResult(
                turns=tuple(indexed), version=new.version, next_index=new.next_index
            )
            return step, result

        return await self._write(
            session_id,
            plan,
            expires_at=expires_at,
            what=f"append of {len(turns)} turns",
            keep_expired=keep_expired,
        )

    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        validate_id(session_id, what="session_id")
        pk = hot_pk(session_id)
        for attempt in range(_READ_ATTEMPTS):
            items = await self._table.query_partition(pk)
            by_sk = {get_str(item, "sk"): item for item in items}
            if META not in by_sk:
                return None
            meta = _Meta.parse(by_sk[META])
            now_us = self._now_us()
            # An expired session stays readable (include_expired) until gc_grace after its
            # expiry, when it counts as collected whether or not the native TTL has fired.
            if not meta.live(now_us) and not (include_expired and self._held(meta, now_us)):
                return None
            snapshot = self._assemble(session_id, meta, by_sk)
            if snapshot is not None:
                return snapshot
            # The query saw part of a concurrent write; read again.
            await self._table.pause(attempt)
        raise BackendError(
            f"session {session_id!r} kept changing while it was loaded; retry",
            backend=BACKEND,
            retryable=True,
        )

    @staticmethod
    def _assemble(
        session_id: str, meta: _Meta, by_sk: Mapping[str, Item]
    ) -> SessionSnapshot | None:
        payloads = []
        for index in meta.turn_indexes():
            count = meta.tp.get(index, 1)
            chunks = payload_chunks(by_sk, _turn_sk(index), tag=meta.gen, count=count)
            if chunks is None:
                return None
            payloads.append(unpack(chunks))
        # One turn this version cannot read must not make the whole session unreadable.
        turns = decode_turns(payloads, session_id=session_id)
        entities = {}
        for kind, tag in meta.ek.items():
            chunks = payload_chunks(by_sk, _entity_sk(kind), tag=tag, count=1)
            if chunks is None:
                return None
            entities[kind] = ActiveEntity.model_validate_json(unpack(chunks))
        state = {}
        for name, (tag, count) in meta.st.items():
            chunks = payload_chunks(by_sk, _state_sk(name), tag=tag, count=count)
            if chunks is None:
                return None
            state[name] = StateBlob.model_validate_json(unpack(chunks))
        return SessionSnapshot(
            session_id=session_id,
            turns=tuple(turns),
            metadata=(SessionMetadata.model_validate_json(unpack([meta.md])) if meta.md else None),
            entities=entities,
            state=state,
            version=meta.version,
            next_index=meta.next_index,
            expires_at=from_us(meta.exp_us),
        )

    async def put_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        validate_id(session_id, what="session_id")
        md = pack(metadata.model_dump_json(), what="session metadata", max_parts=1).chunks[0]

        def plan(current: _Meta | None, new: _Meta, _: Item | None) -> tuple[_Plan, int]:
            self._check_version(session_id, current, expected_version)
            new.md = md
            return _Plan(), new.version

        return await self._write(session_id, plan, expires_at=expires_at, what="put_metadata")

    async def update_entities(
        self,
        session_id: str,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        expires_at: datetime,
    ) -> int | None:
        validate_id(session_id, what="session_id")
        for kind in [*upsert, *remove]:
            check_kind(kind, what="entity kind")
        pk = hot_pk(session_id)
        packed = {
            kind: pack(entity.model_dump_json(), what=f"entity {kind!r}", max_parts=1)
            for kind, entity in upsert.items()
        }

        def plan(
            current: _Meta | None, new: _Meta, _: Item | None
        ) -> tuple[_Plan | None, int | None]:
            if current is None:
                return None, None  # entities never start a session
            step = _Plan()
            self._plan_entities(step, pk, new, remove, packed)
            return step, new.version

        return await self._write(session_id, plan, expires_at=expires_at, what="update_entities")

    @staticmethod
    def _plan_entities(
        step: _Plan, pk: str, new: _Meta, remove: Collection[str], packed: Mapping[str, Packed]
    ) -> None:
        """Add an entity merge (remove, then set) to a write's plan and to ``new``."""
        for kind in remove:
            if new.ek.pop(kind, None) is not None:
                step.cleanup.append(_entity_sk(kind))
        for kind, value in packed.items():
            new.ek[kind] = secrets.token_hex(6)
            step.children += payload_items(pk, _entity_sk(kind), value, tag=new.ek[kind])
            step.payload_bytes += value.size

    async def restore(
        self,
        session_id: str,
        *,
        turns: Sequence[Turn],
        next_index: int,
        metadata: SessionMetadata,
        entities: Mapping[str, ActiveEntity],
        state: Mapping[str, StateBlob],
        window: int,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        check_restore(session_id, turns, next_index=next_index, window=window)
        for kind in entities:
            check_kind(kind, what="entity kind")
        for name, blob in state.items():
            check_kind(name, what="state name")
            encode_data(blob.data, what=f"state {name!r}")
        pk = hot_pk(session_id)
        kept = list(turns)[-window:]
        # Everything is encoded before the first read, so a bad value writes nothing.
        packed_turns = [
            (turn.index, pack(encode_turn(turn), what=f"turn {turn.index}")) for turn in kept
        ]
        md = pack(metadata.model_dump_json(), what="session metadata", max_parts=1).chunks[0]
        packed_entities = {
            kind: pack(entity.model_dump_json(), what=f"entity {kind!r}", max_parts=1)
            for kind, entity in entities.items()
        }
        packed_state = {
            name: (blob, pack(blob.model_dump_json(), what=f"state {name!r}"))
            for name, blob in state.items()
        }

        def plan(current: _Meta | None, new: _Meta, _: Item | None) -> tuple[_Plan, int]:
            self._check_version(session_id, current, expected_version)
            # A new generation: every child gets a new tag, so a load that overlaps the
            # restore sees the mix and reads again.
            new.gen = secrets.token_hex(6)
            new.next_index = next_index
            new.lo = kept[0].index if kept else next_index
            end = kept[-1].index + 1 if kept else next_index
            new.gl, new.gh = (end, next_index) if end < next_index else (0, 0)
            new.md = md
            new.tp, new.ek, new.st = {}, {}, {}
            step = _Plan(
                replace=True,
                advice="Restore a smaller window, or fewer or smaller state blobs.",
            )
            for index, packed in packed_turns:
                step.children += payload_items(pk, _turn_sk(index), packed, tag=new.gen)
                step.payload_bytes += packed.size
                if packed.count > 1:
                    new.tp[index] = packed.count
            for kind, packed in packed_entities.items():
                new.ek[kind] = secrets.token_hex(6)
                step.children += payload_items(pk, _entity_sk(kind), packed, tag=new.ek[kind])
                step.payload_bytes += packed.size
            for name, (blob, packed) in packed_state.items():
                tag = secrets.token_hex(6)
                new.st[name] = (tag, packed.count)
                items = payload_items(pk, _state_sk(name), packed, tag=tag)
                items[0]["v"] = n(blob.version)
                step.children += items
                step.payload_bytes += packed.size
            if current is not None:
                step.cleanup = current.children()
            return step, new.version

        return await self._write(
            session_id, plan, expires_at=expires_at, what=f"restore of {len(kept)} turns"
        )

    async def _read_meta_and_state(self, pk: str, name: str) -> tuple[_Meta | None, Item | None]:
        """META and a state blob's main item, as one atomic read."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                response = await self._table.call(
                    "transact_get_items",
                    TransactItems=[
                        {"Get": {"TableName": self._table.name, "Key": key(pk, sk)}}
                        for sk in (META, _state_sk(name))
                    ],
                )
            except ConditionFailed:
                await self._table.pause(attempt)
                continue
            meta_item, blob_item = (r.get("Item") for r in response["Responses"])
            return (_Meta.parse(meta_item) if meta_item else None), blob_item
        raise contention_error(f"reading state {name!r}")

    @staticmethod
    def _held_version(session_id: str, name: str, current: _Meta, blob_item: Item | None) -> int:
        """The version of state blob ``name``, which ``current`` lists, from its main item
        (read atomically with META, so it is the one META lists)."""
        if blob_item is None or get_str(blob_item, "tag") != current.st[name][0]:
            raise BackendError(
                f"state {name!r} of session {session_id!r} is missing its item; "
                "delete the session and write it again",
                backend=BACKEND,
            )
        return get_int(blob_item, "v")

    async def get_state(self, session_id: str, name: str) -> StateBlob | None:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        pk = hot_pk(session_id)
        for attempt in range(_READ_ATTEMPTS):
            meta, blob = await self._read_meta_and_state(pk, name)
            if meta is None or not meta.live(self._now_us()) or name not in meta.st:
                return None
            tag, count = meta.st[name]
            if blob is not None and count == 1:
                chunks = payload_chunks({_state_sk(name): blob}, _state_sk(name), tag=tag, count=1)
            else:
                sk = _state_sk(name)
                items = await self._table.query_partition(pk, lower=sk, upper=parts_upper(sk))
                chunks = payload_chunks(
                    {get_str(i, "sk"): i for i in items}, sk, tag=tag, count=count
                )
            if chunks is not None:
                return StateBlob.model_validate_json(unpack(chunks))
            await self._table.pause(attempt)  # rewritten meanwhile: read again
        raise contention_error(f"get_state {name!r} of session {session_id!r}")

    async def put_state(
        self,
        session_id: str,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> StateBlob:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        copy = json.loads(encode_data(data, what=f"state {name!r}"))
        pk = hot_pk(session_id)
        sk = _state_sk(name)

        def plan(
            current: _Meta | None, new: _Meta, blob_item: Item | None
        ) -> tuple[_Plan, StateBlob]:
            actual = 0
            if current is not None and name in current.st:
                actual = self._held_version(session_id, name, current, blob_item)
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"state {name!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            blob = StateBlob(name=name, data=copy, version=actual + 1, updated_at=self._clock.now())
            packed = pack(blob.model_dump_json(), what=f"state {name!r}")
            tag = secrets.token_hex(6)
            new.st[name] = (tag, packed.count)
            step = _Plan(payload_items(pk, sk, packed, tag=tag), payload_bytes=packed.size)
            step.children[0]["v"] = n(blob.version)
            if current is not None:
                _, old_count = current.st.get(name, ("", 1))
                step.cleanup = [part_sk(sk, p) for p in range(packed.count, old_count)]
            return step, blob

        return await self._write(
            session_id, plan, expires_at=expires_at, what=f"put_state {name!r}", state=name
        )

    async def copy_state(self, session_id: str, blob: StateBlob, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        name = blob.name
        check_kind(name, what="state name")
        encode_data(blob.data, what=f"state {name!r}")
        packed = pack(blob.model_dump_json(), what=f"state {name!r}")
        pk, sk = hot_pk(session_id), _state_sk(name)

        def plan(
            current: _Meta | None, new: _Meta, blob_item: Item | None
        ) -> tuple[_Plan | None, bool]:
            if current is None:
                return None, False  # a copy never starts a session
            if name in current.st:
                held = self._held_version(session_id, name, current, blob_item)
                if held >= blob.version:
                    return None, False
            tag = secrets.token_hex(6)
            new.st[name] = (tag, packed.count)
            step = _Plan(payload_items(pk, sk, packed, tag=tag), payload_bytes=packed.size)
            step.children[0]["v"] = n(blob.version)
            _, old_count = current.st.get(name, ("", 1))
            step.cleanup = [part_sk(sk, p) for p in range(packed.count, old_count)]
            return step, True

        return await self._write(
            session_id, plan, expires_at=expires_at, what=f"copy_state {name!r}", state=name
        )

    async def touch(self, session_id: str, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        pk = hot_pk(session_id)
        ttl = self._ttl(expires_at)
        exp_us = to_us(expires_at)
        refreshed: tuple[str, int] | None = None  # (gen, cttl) once children were refreshed
        for attempt in range(MAX_ATTEMPTS):
            values: dict[str, Any] = {
                ":e": n(exp_us),
                ":t": n(ttl),
                ":a": s(self._activity_pk(session_id)),
                ":now": n(self._now_us()),
            }
            update = "SET #exp_us = :e, #ttl = :t, #act_pk = :a, #act_sk = :e"
            condition = "attribute_exists(#pk) AND #exp_us > :now"
            if refreshed is None:
                condition += " AND #cttl >= :t"
            else:
                update += ", #cttl = :c"
                condition += " AND #gen = :g"
                values |= {":g": s(refreshed[0]), ":c": n(refreshed[1])}
            try:
                await self._table.call(
                    "update_item",
                    TableName=self._table.name,
                    Key=key(pk, META),
                    ExpressionAttributeValues=values,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **expression(
                        UpdateExpression=f"{update} REMOVE #lease_owner, #lease_us",
                        ConditionExpression=condition,
                    ),
                )
                return True
            except ConditionFailed as failed:
                if failed.contention:
                    await self._table.pause(attempt)
                    continue
                item = failed.items[0] if failed.items else None
                if item is None:
                    return False
                old = _Meta.parse(item)
                if not old.live(self._now_us()):
                    return False
                if old.cttl < ttl:
                    child_ttl = ttl + int(CHILD_TTL_SLACK.total_seconds())
                    await self._refresh_children(pk, old, child_ttl)
                    refreshed = (old.gen, child_ttl)
                else:
                    refreshed = None
        raise contention_error(f"touch on session {session_id!r}")

    async def delete(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        pk = hot_pk(session_id)
        items = await self._table.query_partition(pk, projection="#pk, #sk, #tag")
        semaphore = asyncio.Semaphore(_REFRESH_CONCURRENCY)

        async def remove(item: Item) -> None:
            # Conditional, so a session started concurrently under the same keys survives.
            condition = "attribute_not_exists(#tag) OR #tag = :tag"
            async with semaphore:
                with suppress(ConditionFailed):
                    await self._table.call(
                        "delete_item",
                        TableName=self._table.name,
                        Key=key(pk, get_str(item, "sk")),
                        ExpressionAttributeValues={":tag": item.get("tag", s(""))},
                        **expression(ConditionExpression=condition),
                    )

        meta = [i for i in items if get_str(i, "sk") == META]
        if meta:
            # META first: from then on the session reads as absent, whatever is left.
            await self._table.call("delete_item", TableName=self._table.name, Key=key(pk, META))
        await asyncio.gather(*(remove(i) for i in items if get_str(i, "sk") != META))

    async def claim_expired(self, *, owner: str, lease: timedelta, limit: int = 100) -> list[str]:
        validate_id(owner, what="owner")
        check_limit(limit)
        now = self._clock.now()
        now_us = to_us(now)

        async def due(shard: int) -> list[tuple[int, str]]:
            found: list[tuple[int, str]] = []
            pages = self._table.query(
                IndexName=ACTIVITY_INDEX,
                page_size=max(limit, 25),
                ExpressionAttributeValues={":a": s(f"ACT#{shard:03d}"), ":now": n(now_us)},
                **expression(
                    KeyConditionExpression="#act_pk = :a AND #act_sk <= :now",
                    FilterExpression="attribute_not_exists(#lease_us) OR #lease_us <= :now",
                ),
            )
            async with aclosing(pages):
                async for item in pages:
                    found.append((get_int(item, "act_sk"), session_id_of(get_str(item, "pk"))))
                    if len(found) >= limit:
                        break
            return found

        shards = await asyncio.gather(*(due(i) for i in range(self._shards)))
        candidates = sorted(c for shard in shards for c in shard)
        until_us = to_us(now + lease)
        ttl = self._ttl(now + lease)

        async def claim(session_id: str) -> bool:
            try:
                await self._table.call(
                    "update_item",
                    TableName=self._table.name,
                    Key=key(hot_pk(session_id), META),
                    ExpressionAttributeValues={
                        ":o": s(owner),
                        ":u": n(until_us),
                        ":t": n(ttl),
                        ":now": n(now_us),
                    },
                    **expression(
                        UpdateExpression="SET #lease_owner = :o, #lease_us = :u, #ttl = :t",
                        ConditionExpression=(
                            "attribute_exists(#act_pk) AND #exp_us <= :now AND "
                            "(attribute_not_exists(#lease_us) OR #lease_us <= :now)"
                        ),
                    ),
                )
            except ConditionFailed:
                return False  # written, released or claimed by someone else meanwhile
            return True

        claimed: list[str] = []
        position = 0
        while len(claimed) < limit and position < len(candidates):
            batch = [sid for _, sid in candidates[position : position + limit - len(claimed)]]
            position += len(batch)
            won = await asyncio.gather(*(claim(sid) for sid in batch))
            claimed += [sid for sid, ok in zip(batch, won, strict=True) if ok]
        return claimed

    async def release_expired(self, session_id: str, *, owner: str) -> bool:
        validate_id(session_id, what="session_id")
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self._table.call(
                    "update_item",
                    TableName=self._table.name,
                    Key=key(hot_pk(session_id), META),
                    ExpressionAttributeValues={":o": s(owner)},
                    **expression(
                        UpdateExpression="REMOVE #act_pk, #act_sk, #lease_owner, #lease_us",
                        ConditionExpression="#lease_owner = :o",
                    ),
                )
            except ConditionFailed as failed:
                if failed.contention:
                    await self._table.pause(attempt)
                    continue
                return False
            return True
        raise contention_error(f"release_expired on session {session_id!r}")

    # -- shared keyspace ---------------------------------------------------------------------

    async def get_shared(self, name: str) -> StateBlob | None:
        check_kind(name, what="shared name")
        item = await self._table.get(_shared_pk(name), _SHARED_SK)
        if item is None or not _shared_live(item, self._now_us()):
            return None
        return StateBlob(
            name=name,
            data=json.loads(unpack([item["d"]])),
            version=get_int(item, "version"),
            updated_at=from_us(get_int(item, "upd_us")),
        )

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        check_kind(name, what="shared name")
        check_aware(expires_at, what="expires_at")
        payload = encode_shared(name, data)
        packed = pack(payload, what=f"shared blob {name!r}", max_parts=1)
        now = self._clock.now()
        now_us = to_us(now)
        fields: Item = {"d": packed.chunks[0], "upd_us": n(now_us)}
        if expires_at is not None:
            fields |= {"exp_us": n(to_us(expires_at)), "ttl": n(self._ttl(expires_at))}
        for attempt in range(MAX_ATTEMPTS):
            if expected_version is None:
                version = await self._bump_shared(name, fields, now_us)
                if version is None:
                    version = await self._create_shared(name, fields, now_us, expected=None)
            else:
                version = await self._create_shared(name, fields, now_us, expected=expected_version)
            if version is not None:
                return StateBlob(
                    name=name, data=json.loads(payload), version=version, updated_at=now
                )
            await self._table.pause(attempt)
        raise contention_error(f"put_shared {name!r}")

    async def _bump_shared(self, name: str, fields: Item, now_us: int) -> int | None:
        """Overwrite a live blob with the next version; its version, or None if there is no
        live blob (or a concurrent transaction was in the way)."""
        values = {f":{attr}": value for attr, value in fields.items()}
        update = "SET #version = #version + :one, " + ", ".join(
            f"#{attr} = :{attr}" for attr in fields
        )
        if "exp_us" not in fields:
            update += " REMOVE #exp_us, #ttl"
        try:
            response = await self._table.call(
                "update_item",
                TableName=self._table.name,
                Key=key(_shared_pk(name), _SHARED_SK),
                ExpressionAttributeValues=values | {":one": n(1), ":now": n(now_us)},
                ReturnValues="UPDATED_NEW",
                **expression(
                    UpdateExpression=update,
                    ConditionExpression=f"attribute_exists(#pk) AND {_SHARED_LIVE}",
                ),
            )
        except ConditionFailed:
            return None
        return get_int(response["Attributes"], "version")

    async def _create_shared(
        self, name: str, fields: Item, now_us: int, *, expected: int | None
    ) -> int | None:
        """Put the blob at version ``expected + 1`` if it is at ``expected`` (0 or None:
        absent or expired); its version, or None when a race is to be retried.

        Raises:
            ConflictError: the blob is not at ``expected`` (when one is given).
        """
        version = (expected or 0) + 1
        if version == 1:
            condition = _SHARED_GONE
            values: Item = {":now": n(now_us)}
        else:
            condition = f"#version = :v AND {_SHARED_LIVE}"
            values = {":now": n(now_us), ":v": n(version - 1)}
        try:
            await self._table.call(
                "put_item",
                TableName=self._table.name,
                Item=key(_shared_pk(name), _SHARED_SK) | fields | {"version": n(version)},
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expression(ConditionExpression=condition),
            )
        except ConditionFailed as failed:
            if failed.contention or expected is None:
                return None
            held = failed.item(0)  # None: there was no item
            actual = get_int(held, "version") if held and _shared_live(held, now_us) else 0
            raise ConflictError(
                f"shared blob {name!r} is at version {actual}, not {expected}; "
                "re-read it and retry",
                expected=expected,
                actual=actual,
            ) from None
        return version

    async def delete_shared(self, name: str) -> bool:
        check_kind(name, what="shared name")
        response = await self._table.call(
            "delete_item",
            TableName=self._table.name,
            Key=key(_shared_pk(name), _SHARED_SK),
            ReturnValues="ALL_OLD",
        )
        return _shared_live(response.get("Attributes"), self._now_us())

    async def aclose(self) -> None:
        await self._table.aclose()
