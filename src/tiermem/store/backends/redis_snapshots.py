"""The hot store's copy of the sessions it last read or wrote, so that a read decodes only
what changed (:class:`SnapshotCache`).

A hot session carries an epoch (a token set whenever it starts afresh or is restored)
and a version (+1 on every write). Within one epoch its turns are only ever appended and
trimmed, so a reader that holds the session at (epoch, version, next index) needs nothing
but the turns from that index on, and nothing at all while the version is the same. The
entities and the state carry part markers (meta 'ev' and 'sv': the versions at which
they last changed, see ``hot_commit``); the copy keeps the markers it was read or written
with. The load script is sent the cached triple and markers and answers accordingly: when
the version moved, the metadata whole, and the entities or the state only when the
session's marker for the part is not the copy's (or says nothing); a part left out is the
copy's, reused as it is (decoded objects included), and of a part sent only the values
whose bytes differ from the cached ones are decoded. A write through the same store
updates the copy from what it sent, so the next read of the session is answered with four
small fields; a write that does not update it (metadata, entities or state alone) leaves
it at its version, so the next read fetches only the part that write changed.

The copy is a cache, never a source: every read still asks Redis (one round trip), and a
copy that does not match the server's epoch and version is not used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from tiermem.models import ActiveEntity, SessionMetadata, SessionSnapshot, StateBlob, Turn
from tiermem.store.backends.redis_scripts import Arg, from_us, split_frame
from tiermem.store.codec import decode_turns
from tiermem.store.contract import EntityChange

__all__ = ["CachedSession", "SnapshotCache", "decode_state"]


class CachedSession(NamedTuple):
    """A session as last seen, with the raw bytes its parts were decoded from and the part
    markers of the version it holds (b'' when the session's said nothing: the load script
    then sends the part) (a tuple: built on every append, at a fraction of a frozen
    dataclass's cost)."""

    epoch: bytes
    snapshot: SessionSnapshot
    metadata_raw: bytes
    entities_raw: dict[bytes, bytes]
    state_raw: dict[bytes, bytes]
    entities_mark: bytes
    state_mark: bytes
    expires_us: int = -1
    """The snapshot's ``expires_at`` in microseconds: a load that answers the same
    expiry hands out the snapshot's datetime instead of building it again (``from_us``,
    ~5.5k instructions, on every ``history()``)."""


def decode_state(name: str, raw: bytes) -> StateBlob:
    """A stored state value ('version|updated_us|json')."""
    version, updated_us, data = split_frame(raw, 2)
    return StateBlob.model_validate(
        {
            "name": name,
            "data": json.loads(data),
            "version": int(version),
            "updated_at": from_us(updated_us),
        }
    )


def _snapshot(
    session_id: str,
    turns: tuple[Turn, ...],
    metadata: SessionMetadata | None,
    entities: dict[str, ActiveEntity],
    state: dict[str, StateBlob],
    version: int,
    next_index: int,
    expires_us: bytes | int,
) -> SessionSnapshot:
    """The cache's own snapshot. Every part is a validated model already (decoded here or
    built by the store): no second validation. It keeps ``entities`` and ``state`` as they
    are: the cache never changes them, and hands out only :func:`_copy`'s."""
    return SessionSnapshot.trusted(
        {
            "session_id": session_id,
            "turns": turns,
            "metadata": metadata,
            "entities": entities,
            "state": state,
            "version": version,
            "next_index": next_index,
            "expires_at": from_us(expires_us),
        }
    )


def _copy(snap: SessionSnapshot, expires_at: datetime) -> SessionSnapshot:
    """A cached snapshot as handed out: its own dicts (a caller changing them cannot
    reach the cache), the expiry the server answered."""
    values = dict(snap.__dict__)
    values["entities"] = dict(snap.entities)
    values["state"] = dict(snap.state)
    values["expires_at"] = expires_at
    return SessionSnapshot.trusted(values)


class SnapshotCache:
    """Up to ``capacity`` sessions, least recently used dropped first; 0 turns it off."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._sessions: dict[str, CachedSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> CachedSession | None:
        return self._sessions.get(session_id)

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _put(self, session_id: str, entry: CachedSession) -> None:
        if not self.capacity:
            return
        held = self._sessions.pop(session_id, None)
        if (
            held is not None
            and held.epoch == entry.epoch
            and held.snapshot.version > entry.snapshot.version
        ):
            entry = held  # a later write landed while this reply was in flight
        self._sessions[session_id] = entry
        while len(self._sessions) > self.capacity:
            del self._sessions[next(iter(self._sessions))]

    def load_args(self, cached: CachedSession | None) -> list[Arg]:
        """What the load script is told about the cached copy (``HOT_LOAD`` ARGV 3 to 7)."""
        if cached is None:
            return ["", "", "", "", ""]
        snap = cached.snapshot
        return [
            cached.epoch,
            snap.version,
            snap.next_index,
            cached.entities_mark,
            cached.state_mark,
        ]

    def loaded(
        self, session_id: str, cached: CachedSession | None, reply: Sequence[Any] | None
    ) -> SessionSnapshot | None:
        """The snapshot a load script answered, given the copy it was told about."""
        if reply is None:
            self.drop(session_id)
            return None
        version, next_index, expires_us, epoch = reply[:4]
        if len(reply) == 4:
            assert cached is not None  # the script answers this only for a current copy
            expires = int(expires_us)
            if expires == cached.expires_us:
                return _copy(cached.snapshot, cached.snapshot.expires_at)
            return _copy(cached.snapshot, from_us(expires))
        metadata_raw, first, sent_from, turns_raw, entities_flat, state_flat, e_mark, s_mark = (
            reply[4:]
        )
        first, sent_from = int(first), int(sent_from)
        base = cached if cached is not None and cached.epoch == epoch else None
        kept: tuple[Turn, ...] = ()
        if base is not None and sent_from > first:
            kept = tuple(t for t in base.snapshot.turns if first <= t.index < sent_from)
        turns = kept + tuple(decode_turns(turns_raw, session_id=session_id))
        if base is not None and metadata_raw == base.metadata_raw:
            metadata = base.snapshot.metadata
        else:
            metadata = SessionMetadata.model_validate_json(metadata_raw) if metadata_raw else None
        entities_raw: dict[bytes, bytes]
        entities: dict[str, ActiveEntity]
        if entities_flat is None:
            # Left out: the script answers this only when the copy it was told about (same
            # epoch) holds them as they are. Shared with that copy: the cache never
            # changes an entry's dicts (appended copies them before a change).
            assert base is not None
            entities_raw, entities = base.entities_raw, base.snapshot.entities
        else:
            entities_raw = dict(zip(entities_flat[::2], entities_flat[1::2], strict=True))
            entities = {}
            for kind, raw in entities_raw.items():
                name = kind.decode()
                if base is not None and base.entities_raw.get(kind) == raw:
                    entities[name] = base.snapshot.entities[name]
                else:
                    entities[name] = ActiveEntity.model_validate_json(raw)
        state_raw: dict[bytes, bytes]
        state: dict[str, StateBlob]
        if state_flat is None:
            assert base is not None  # as the entities
            state_raw, state = base.state_raw, base.snapshot.state
        else:
            state_raw = dict(zip(state_flat[::2], state_flat[1::2], strict=True))
            state = {}
            for key, raw in state_raw.items():
                name = key.decode()
                if base is not None and base.state_raw.get(key) == raw:
                    state[name] = base.snapshot.state[name]
                else:
                    state[name] = decode_state(name, raw)
        snap = _snapshot(
            session_id, turns, metadata, entities, state, int(version), int(next_index), expires_us
        )
        self._put(
            session_id,
            CachedSession(
                epoch, snap, metadata_raw, entities_raw, state_raw, e_mark, s_mark, int(expires_us)
            ),
        )
        return _copy(snap, snap.expires_at)

    def appended(
        self,
        session_id: str,
        *,
        epoch: bytes,
        version: int,
        fresh: bool,
        turns: Sequence[Turn],
        window: int,
        expires_us: int,
        metadata: tuple[str, SessionMetadata] | None,
        change: EntityChange | None,
    ) -> None:
        """Bring the copy up to date after this store's append wrote ``version``.

        ``metadata`` is the (json, model) the append set, ``change`` its entity change, both
        exactly as sent. A copy that was not at ``version - 1`` of the same epoch cannot be
        brought up to date and is dropped (the next read fetches the session whole), unless
        the append started the session afresh: then the copy is the append's.

        The markers follow what the append script sets: both to ``version`` after a fresh
        start, the entities' when ``change`` changes something, the copy's otherwise (b''
        stays b'': the part is sent again).
        """
        if not self.capacity:
            return
        base = self._sessions.get(session_id)
        if fresh:
            held_turns: tuple[Turn, ...] = ()
            meta_raw, meta = b"", None
            entities_raw: dict[bytes, bytes] = {}
            entities: dict[str, ActiveEntity] = {}
            state_raw: dict[bytes, bytes] = {}
            state: dict[str, StateBlob] = {}
            entities_mark = state_mark = b"%d" % version
        elif base is not None and base.epoch == epoch and base.snapshot.version == version - 1:
            snap = base.snapshot
            held_turns = snap.turns
            meta_raw, meta = base.metadata_raw, snap.metadata
            # Shared with the entry this one replaces: copied below only where they change.
            entities_raw, entities = base.entities_raw, snap.entities
            state_raw, state = base.state_raw, snap.state
            entities_mark, state_mark = base.entities_mark, base.state_mark
        else:
            self.drop(session_id)
            return
        if metadata is not None:
            meta_raw, meta = metadata[0].encode(), metadata[1]
        if change is not None:
            entities_raw, entities = dict(entities_raw), dict(entities)
            for kind in change.remove:
                entities_raw.pop(kind.encode(), None)
                entities.pop(kind, None)
            for kind, entity in change.upsert.items():
                entities_raw[kind.encode()] = entity.model_dump_json().encode()
                entities[kind] = entity
            if change.upsert or change.remove:
                entities_mark = b"%d" % version
        all_turns = (*held_turns, *turns)[-window:]
        snap = _snapshot(
            session_id,
            all_turns,
            meta,
            entities,
            state,
            version,
            turns[-1].index + 1,
            expires_us,
        )
        self._put(
            session_id,
            CachedSession(
                epoch,
                snap,
                meta_raw,
                entities_raw,
                state_raw,
                entities_mark,
                state_mark,
                expires_us,
            ),
        )
