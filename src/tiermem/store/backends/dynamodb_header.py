"""The header of a durable DynamoDB session: what the ``S#<session>/META`` item holds.

META is the one item every durable write of a session commits (conditioned on its write
counter ``mv``), so it is where the session's shared state lives:

* ``next_index``, the turn counter;
* ``exp_us``, the session's **lifetime** (absent: forever), raised with ``max`` by every
  write and never lowered; META's own ``ttl`` is that lifetime + gc_grace, so META, and
  with it the counter, is collected once the session has died. Until then a new life
  continues the numbering; after, it restarts at 0 (the contract allows either);
* ``ref``, the owner's :class:`~tiermem.models.SessionRef`;
* ``gen``, the **life** of the session: a random tag drawn when the session starts (or
  starts again after its lifetime passed). Records and idempotency keys carry the ``gen``
  they were written in, and only those of the current life count, so a new life never
  sees an old life's records or keys, whatever TTL has not collected yet;
* ``hz``, the **horizon**: a native TTL (epoch seconds) that every record item (parts
  included) and key item of the current life carries at least, always >= META's ``ttl``.
  When a write raises the lifetime past it, the records and keys get their ``ttl`` raised
  in that write (:meth:`SessionHeader.extend` says when). A raise touches every key of
  the life, and keys accumulate with appends, so the new horizon adds a slack that grows
  with the life's age (1 to 30 days): a raise happens about once a day for a young
  session and once a month for an old one, not on every append. A dead session's records
  and keys are collected at most that slack after META;
* ``rk`` (record kind → item count) and ``kc`` (how many keys): what a horizon raise has
  to touch.

Record stamps (:class:`RecordStamp`, kept in :class:`KnownSession`) let a record rewrite
skip its reads. Limits: the cache holds at most ``header_cache_size`` sessions, but each
keeps one stamp per record kind it wrote or read (kinds are few per session; they are not
counted); a stamp taken from a read that raced a write of the same process may be older
than the record, which costs one failed conditional write and a read, never an update.
Stamps go with the header: dropped on ``delete_session`` and ``purge_user``, on a
redaction (which rebuilds the entry), and ignored once their life (``gen``) is not the
header's or the session has expired.

No I/O here: the stores read and write the item.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from tiermem.models import SessionRecord, SessionRef
from tiermem.store.backends.dynamodb_table import (
    META,
    Item,
    from_us,
    get_int,
    get_str,
    key,
    n,
    s,
    to_us,
)

__all__ = [
    "HORIZON_SLACK_MAX",
    "HORIZON_SLACK_MIN",
    "HeaderCache",
    "KnownRecord",
    "KnownSession",
    "RecordStamp",
    "SessionHeader",
    "covers",
]

HORIZON_SLACK_MIN = timedelta(days=1)
"""The least a horizon raise adds beyond lifetime + gc_grace (see the module docstring)."""
HORIZON_SLACK_MAX = timedelta(days=30)
"""The most it adds: how long a dead long-lived session's records may outlast META."""


def covers(horizon: int | None, needed: int | None) -> bool:
    """Whether items carrying TTL ``horizon`` (None: no TTL) outlive TTL ``needed``."""
    if horizon is None:
        return True
    return needed is not None and horizon >= needed


@dataclass
class SessionHeader:
    """The META item of a durable session, parsed (module docstring)."""

    mv: int = 0
    gen: str = ""
    born_us: int = 0
    next_index: int = 0
    exp_us: int | None = None
    ttl: int | None = None
    hz: int | None = None
    owner: SessionRef | None = None
    kinds: dict[str, int] = field(default_factory=dict)
    keys: int = 0

    @classmethod
    def parse(cls, item: Item) -> SessionHeader:
        """Parse META; attributes left out by a projection take their defaults.

        A META written before sessions had a lifetime has no ``mv``, ``gen`` or ``exp_us``:
        it reads as a session that lives forever, in the life ``""`` that its old records
        (which have no ``gen``) belong to.
        """
        ref = item.get("ref")
        return cls(
            mv=get_int(item, "mv"),
            gen=get_str(item, "gen"),
            born_us=get_int(item, "born"),
            next_index=get_int(item, "next_index"),
            exp_us=get_int(item, "exp_us") if "exp_us" in item else None,
            ttl=get_int(item, "ttl") if "ttl" in item else None,
            hz=get_int(item, "hz") if "hz" in item else None,
            owner=SessionRef.model_validate_json(ref["S"]) if ref is not None else None,
            kinds={k: int(v["N"]) for k, v in item.get("rk", {}).get("M", {}).items()},
            keys=get_int(item, "kc"),
        )

    def live(self, now_us: int) -> bool:
        return self.exp_us is None or now_us < self.exp_us

    @property
    def lifetime(self) -> datetime | None:
        return None if self.exp_us is None else from_us(self.exp_us)

    def item(self, pk: str) -> Item:
        out: Item = key(pk, META) | {
            "mv": n(self.mv),
            "born": n(self.born_us),
            "next_index": n(self.next_index),
        }
        if self.gen:
            out["gen"] = s(self.gen)
        if self.exp_us is not None:
            out["exp_us"] = n(self.exp_us)
        if self.ttl is not None:
            out["ttl"] = n(self.ttl)
        if self.hz is not None:
            out["hz"] = n(self.hz)
        if self.owner is not None:
            out["ref"] = s(self.owner.model_dump_json())
        if self.kinds:
            out["rk"] = {"M": {k: n(count) for k, count in self.kinds.items()}}
        if self.keys:
            out["kc"] = n(self.keys)
        return out

    def condition(self) -> dict[str, Any]:
        """Condition arguments that hold while META is still the one this was parsed from.

        ``gen`` is checked with ``mv``: a header may be remembered for long
        (:class:`HeaderCache`), and a session deleted and started again counts ``mv`` from 1
        again, but never in the same life.
        """
        if self.mv:
            if self.gen:
                return {
                    "ConditionExpression": "#mv = :mv AND #gen = :gen",
                    "ExpressionAttributeNames": {"#mv": "mv", "#gen": "gen"},
                    "ExpressionAttributeValues": {":mv": n(self.mv), ":gen": s(self.gen)},
                }
            return {
                "ConditionExpression": "#mv = :mv AND attribute_not_exists(#gen)",
                "ExpressionAttributeNames": {"#mv": "mv", "#gen": "gen"},
                "ExpressionAttributeValues": {":mv": n(self.mv)},
            }
        # Written before META counted its writes: the first new write adds the counter.
        return {
            "ConditionExpression": "attribute_exists(#pk) AND attribute_not_exists(#mv)",
            "ExpressionAttributeNames": {"#pk": "pk", "#mv": "mv"},
        }

    @staticmethod
    def successor(old: SessionHeader | None, *, live: bool, now_us: int) -> SessionHeader:
        """META after one more write: the same life with ``mv + 1`` if ``old`` is live,
        else a new life (fresh ``gen``, no owner, records or keys; the numbering goes on
        from a dead META's counter, or from 0)."""
        mv = (old.mv if old is not None else 0) + 1
        if old is not None and live:
            return replace(old, mv=mv, kinds=dict(old.kinds))
        return SessionHeader(
            mv=mv,
            gen=secrets.token_hex(6),
            born_us=now_us,
            next_index=old.next_index if old is not None else 0,
        )

    def extend(
        self,
        live: SessionHeader | None,
        expires_at: datetime | None,
        *,
        now_us: int,
        ttl_of: Callable[[datetime], int],
    ) -> bool:
        """Raise this successor's lifetime to at least ``expires_at`` (from ``live``'s, or
        from nothing in a new life), set META's ``ttl`` and the horizon.

        ``ttl_of(datetime) -> int`` is the native TTL of something expiring then. Returns
        True if the live session's records and keys must get ``ttl`` = the new horizon.
        """
        exp = None if expires_at is None else to_us(expires_at)
        if live is None:
            self.exp_us = exp
        elif live.exp_us is None or exp is None:
            self.exp_us = None
        else:
            self.exp_us = max(live.exp_us, exp)
        self.ttl = None if self.exp_us is None else ttl_of(from_us(self.exp_us))
        if live is not None and covers(live.hz, self.ttl):
            self.hz = live.hz
            return False
        age = timedelta(microseconds=max(0, now_us - self.born_us))
        slack = min(max(age, HORIZON_SLACK_MIN), HORIZON_SLACK_MAX)
        self.hz = None if self.ttl is None else self.ttl + int(slack.total_seconds())
        return live is not None


@dataclass(frozen=True)
class KnownRecord:
    """A session record as stored in the life of the header it is remembered with: the
    record, the ``tag`` of its main item and its item count."""

    record: SessionRecord
    tag: str
    count: int


@dataclass(frozen=True)
class RecordStamp:
    """What rewriting a stored record needs to know of it, without the record: its
    ``version``, the ``tag`` and item ``count`` of its write, and the life ``gen`` it was
    written in. A write that trusts a stamp is conditioned on the tag, so a stale stamp
    costs one failed write, never a lost update."""

    version: int
    tag: str
    count: int
    gen: str

    def item(self) -> Item:
        """The stamp as the attributes a read of the record's main item would return."""
        out: Item = {"version": n(self.version), "tag": s(self.tag), "np": n(self.count)}
        return out | ({"gen": s(self.gen)} if self.gen else {})


@dataclass(frozen=True)
class KnownSession:
    """What a store last knew of a durable session: its META (None: absent), when known
    its ``entities`` record of that life (None: not known, or absent when the header lists
    no such kind), and a :class:`RecordStamp` per record kind it wrote or read (any life:
    a stamp is used only in its own). Never changed once built."""

    head: SessionHeader | None
    entities: KnownRecord | None = None
    stamps: Mapping[str, RecordStamp] = field(default_factory=dict)

    def stamp(self, kind: str) -> RecordStamp | None:
        """The stamp of record ``kind`` if it was taken in this header's life."""
        stamp = self.stamps.get(kind)
        if stamp is None or self.head is None or stamp.gen != self.head.gen:
            return None
        return stamp

    def stamps_in(self, gen: str, *, without: str | None = None) -> dict[str, RecordStamp]:
        """The stamps taken in life ``gen`` (but ``without``'s), to carry to a successor."""
        return {k: v for k, v in self.stamps.items() if v.gen == gen and k != without}


class HeaderCache:
    """The META each session had after this store's last read or write of it, bounded
    (least recently used out), so an append can go straight to its conditional write.

    Nothing here is trusted blindly: every write is conditioned on META's ``mv`` and
    ``gen`` as remembered, so a stale entry (another process wrote) costs one failed
    write, whose cancellation returns the real META. A header must not be changed once
    it is put here (the stores build successors with :meth:`SessionHeader.successor`).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._known: OrderedDict[str, KnownSession] = OrderedDict()

    def get(self, pk: str) -> KnownSession | None:
        known = self._known.get(pk)
        if known is not None:
            self._known.move_to_end(pk)
        return known

    def put(self, pk: str, known: KnownSession) -> None:
        if self._size <= 0:
            return
        self._known[pk] = known
        self._known.move_to_end(pk)
        while len(self._known) > self._size:
            self._known.popitem(last=False)

    def drop(self, pk: str) -> None:
        self._known.pop(pk, None)

    def clear(self) -> None:
        self._known.clear()
