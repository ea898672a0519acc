"""JSONL import and export of sessions, turns and user memories (format: ``docs/jsonl.md``).

One JSON object per line, each with a ``type``:

* ``session`` -- a session's metadata (id, user, tier, locale, created_at, attributes...),
  its active entities and state blobs. Comes before the session's turns.
* ``turn`` -- one archived turn with its ``session_id`` and original ``index`` and
  ``timestamp`` (and token count, importance, entities, metadata as stored).
* ``memory`` -- one long-term memory of a user (type, content, tags, importance...).

Ids in a file are the caller's: with a :class:`~tiermem.interfaces.tenancy.TenantScope`,
export strips the tenant prefix from user and session ids and import adds it, so a file
exported from one tenant imports into another.

Import keeps every turn's index and timestamp. It is idempotent: a turn whose index the
session already has is compared with the stored one (equal: counted as present and
skipped; different: a :class:`~tiermem.errors.ValidationError` naming the line), new turns
are appended in batches whose idempotency key is derived from the batch's lines, and
memories deduplicate by content. Re-importing a file therefore adds nothing. Lines of an
unknown ``type`` are skipped and counted (a newer exporter's extra records never break an
older importer).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.tenancy import TenantScope
from tiermem.models import MemoryRecord, NewTurn, Provenance, SessionMetadata, Turn
from tiermem.service import MemoryService, Session
from tiermem.store.contract import MAX_TURNS_PER_APPEND
from tiermem.store.keys import validate_id

__all__ = [
    "FORMAT",
    "ImportReport",
    "export_session",
    "export_user",
    "import_lines",
    "line_key",
]

FORMAT = "tiermem.jsonl/1"
"""Written on every session line; a reader accepts any ``tiermem.jsonl/1`` file."""

_PAGE = 500
_MAX_LINE_CHARS = 8 * 1024 * 1024
"""A line longer than this is refused before it is parsed (8 MiB: a pasted document)."""
_TURN_FIELDS_COMPARED = ("role", "content", "timestamp")
"""What makes an imported turn "the same" as the stored one at its index."""


@dataclass
class ImportReport:
    """What an import did, line by line counted."""

    sessions: int = 0
    turns_added: int = 0
    turns_present: int = 0
    """Turns whose index the session already had, with equal content: skipped."""
    memories_added: int = 0
    memories_present: int = 0
    """Memories the user already had with the same id and content: skipped."""
    skipped_unknown: int = 0
    """Lines of a ``type`` this release does not know."""
    session_ids: list[str] = field(default_factory=list)


def line_key(lines: Iterable[str]) -> str:
    """An idempotency key derived from the canonical JSON of ``lines`` (sha256, 40 hex)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return f"jsonl-{digest.hexdigest()[:40]}"


def _canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------- export


class _Ids:
    """Store ids <-> the file's ids, through an optional tenant scope."""

    def __init__(self, scope: TenantScope | None) -> None:
        self.scope = scope

    def store(self, value: str, field: str) -> str:
        validate_id(value, what=field)
        return value if self.scope is None else self.scope.scope(value, field=field)

    def file(self, stored: str) -> str:
        return stored if self.scope is None else self.scope.unscope(stored)


async def export_session(
    memory: MemoryService,
    session_id: str,
    *,
    scope: TenantScope | None = None,
    on_turn: Callable[[], None] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The session line, then every archived turn, oldest first (pages of 500).
    ``session_id`` is the caller's id (scoped with ``scope`` when given).

    Raises:
        NotFoundError: no tier knows the session.
        ValidationError: a bad id.
    """
    ids = _Ids(scope)
    stored = ids.store(session_id, "session_id")
    view = await memory.tiers.view(stored, refresh_ttl=False)
    if view is None:
        raise NotFoundError(f"session {session_id!r} does not exist (or has expired)")
    meta = view.metadata.model_dump(mode="json", exclude={"turn_count"})
    meta["session_id"] = session_id
    meta["user_id"] = ids.file(view.metadata.user_id)
    yield {
        "type": "session",
        "format": FORMAT,
        **meta,
        "entities": {k: e.model_dump(mode="json") for k, e in view.entities.items()},
        "state": {k: b.data for k, b in view.state.items()},
    }
    for start in range(0, view.next_index, _PAGE):
        for turn in await memory.tiers.get_turns(stored, start, start + _PAGE):
            yield {"type": "turn", "session_id": session_id, **turn.model_dump(mode="json")}
            if on_turn is not None:
                on_turn()


async def export_user(
    memory: MemoryService,
    user_id: str,
    *,
    scope: TenantScope | None = None,
    include_memories: bool = True,
    session_limit: int = 1000,
    on_turn: Callable[[], None] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Every session of the user (oldest first), then their current long-term memories."""
    ids = _Ids(scope)
    stored_user = ids.store(user_id, "user_id")
    refs = await memory.list_sessions(stored_user, limit=session_limit)
    for ref in sorted(refs, key=lambda r: r.created_at):
        if not _owned(ids, ref.session_id):
            continue  # never expected: a tenant's user only has the tenant's sessions
        if await memory.tiers.view(ref.session_id, refresh_ttl=False) is None:
            continue  # listed but expired: user lists keep dead sessions as history
        session_id = ids.file(ref.session_id)
        async for record in export_session(memory, session_id, scope=scope, on_turn=on_turn):
            yield record
    if include_memories:
        for mem in await memory.longterm.list(stored_user, limit=10_000):
            yield _memory_line(mem, ids)


def _memory_line(record: MemoryRecord, ids: _Ids) -> dict[str, Any]:
    data = record.model_dump(
        mode="json",
        exclude={"embedding", "embedding_model", "access_count", "accessed_at", "version"},
    )
    data["user_id"] = ids.file(record.user_id)
    session = record.provenance.session_id
    if session is not None:
        data["provenance"]["session_id"] = ids.file(session) if _owned(ids, session) else None
    return {"type": "memory", **data}


def _owned(ids: _Ids, stored: str) -> bool:
    return ids.scope is None or ids.scope.owns(stored)


# ---------------------------------------------------------------- import


@dataclass
class _Pending:
    """New turns of one session waiting to be appended as one keyed batch."""

    session: Session
    turns: list[NewTurn] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)


class _Importer:
    def __init__(self, memory: MemoryService, ids: _Ids) -> None:
        self.memory = memory
        self.ids = ids
        self.report = ImportReport()
        self.sessions: dict[str, Session] = {}
        self.next_index: dict[str, int] = {}
        self.pending: _Pending | None = None
        self.stored: dict[tuple[str, int], Turn] = {}
        """A page of stored turns being compared with a re-imported file (one read per 500)."""

    async def line(self, number: int, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValidationError(
                    f"line {number}: not UTF-8 text (byte {exc.start + 1} of the line is "
                    f"{raw[exc.start : exc.start + 1]!r}); save the file as UTF-8"
                ) from None
        text = raw.strip()
        if not text:
            return
        if len(text) > _MAX_LINE_CHARS:
            raise ValidationError(
                f"line {number}: {len(text)} characters; the limit is {_MAX_LINE_CHARS}"
            )
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"line {number}: not JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(record, dict):
            raise ValidationError(f"line {number}: expected a JSON object")
        kind = record.get("type")
        if kind == "turn":
            await self.turn(number, record)
            return
        await self.flush()
        try:
            if kind == "session":
                await self.session(number, record)
            elif kind == "memory":
                await self.memory_line(number, record)
            else:
                self.report.skipped_unknown += 1
        except ValidationError as exc:
            if str(exc).startswith(f"line {number}"):
                raise
            # The service's own refusals (a session of another user...) name no line.
            raise ValidationError(f"line {number}: {exc}") from exc

    async def session(self, number: int, record: dict[str, Any]) -> None:
        fields = {k: v for k, v in record.items() if k not in ("type", "format")}
        fields.pop("entities", None)
        state = fields.pop("state", None) or {}
        fields["turn_count"] = 0
        fields.setdefault("last_activity", fields.get("created_at"))
        try:
            meta = SessionMetadata.model_validate(fields)
            file_id = meta.session_id
            meta = meta.model_copy(
                update={
                    "session_id": self.ids.store(meta.session_id, "session_id"),
                    "user_id": self.ids.store(meta.user_id, "user_id"),
                }
            )
        except (PydanticValidationError, ValidationError) as exc:
            raise ValidationError(f"line {number}: bad session record: {exc}") from exc
        view = await self.memory.tiers.create(meta)
        session = Session(self.memory, view)
        self.sessions[file_id] = session
        self.next_index[file_id] = view.next_index
        changes = {
            k: getattr(meta, k)
            for k in ("active_intent", "active_agent", "cart_item_count", "closed_at")
            if getattr(meta, k) != getattr(view.metadata, k)
        }
        attributes = {
            k: v for k, v in meta.attributes.items() if view.metadata.attributes.get(k) != v
        }
        if attributes:
            changes["attributes"] = attributes
        if changes:
            await session.update_metadata(**changes)
        if not isinstance(state, dict):
            raise ValidationError(f"line {number}: 'state' must be an object of named blobs")
        for name, data in state.items():
            if name not in view.state and isinstance(data, dict):
                await session.put_state(name, data, expected_version=0)
        self.report.sessions += 1
        self.report.session_ids.append(file_id)

    async def turn(self, number: int, record: dict[str, Any]) -> None:
        session_id = record.get("session_id")
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or not isinstance(session_id, str):
            raise ValidationError(
                f"line {number}: turn of session {session_id!r} comes before that session's "
                "'session' line; every session line must precede its turns"
            )
        fields = {k: v for k, v in record.items() if k not in ("type", "session_id")}
        try:
            turn = Turn.model_validate(fields)
        except PydanticValidationError as exc:
            raise ValidationError(f"line {number}: bad turn record: {exc}") from exc
        expected = self.next_index[session_id]
        if turn.index > expected:
            raise ValidationError(
                f"line {number}: turn {turn.index} of session {session_id!r} leaves a gap (the "
                f"session has turns 0..{expected - 1}); turns must be imported in index order"
            )
        if turn.index < expected:
            await self.flush()
            stored = await self._stored(session, turn.index)
            if stored is not None and _same(stored, turn):
                self.report.turns_present += 1
                return
            raise ValidationError(
                f"line {number}: session {session_id!r} already has a different turn "
                f"{turn.index}; import into a new session id or clear the session first"
            )
        pending = self.pending
        if pending is not None and (
            pending.session is not session or len(pending.turns) >= MAX_TURNS_PER_APPEND
        ):
            await self.flush()
            pending = None
        if pending is None:
            pending = self.pending = _Pending(session)
        pending.turns.append(NewTurn.model_validate(turn.model_dump(exclude={"index"})))
        pending.indexes.append(turn.index)
        pending.lines.append(_canonical(record))
        pending.line_numbers.append(number)
        self.next_index[session_id] = expected + 1

    async def _stored(self, session: Session, index: int) -> Turn | None:
        key = (session.id, index)
        if key not in self.stored:
            self.stored = {
                (session.id, t.index): t for t in await session.get_turns(index, index + _PAGE)
            }
        return self.stored.get(key)

    async def flush(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        stored = await pending.session.add_turns(
            pending.turns, idempotency_key=line_key(pending.lines)
        )
        got = [t.index for t in stored]
        if got != pending.indexes:
            raise ValidationError(
                f"lines {pending.line_numbers[0]}-{pending.line_numbers[-1]}: the session "
                f"{pending.session.id!r} stored these turns at indexes {got}, not "
                f"{pending.indexes}: another writer added turns meanwhile"
            )
        self.report.turns_added += len(stored)

    async def memory_line(self, number: int, record: dict[str, Any]) -> None:
        fields = {k: v for k, v in record.items() if k != "type"}
        try:
            mem = MemoryRecord.model_validate(fields)
        except PydanticValidationError as exc:
            raise ValidationError(f"line {number}: bad memory record: {exc}") from exc
        session = mem.provenance.session_id
        provenance = Provenance(
            source="import",
            session_id=None if session is None else self.ids.store(session, "session_id"),
            turn_indexes=mem.provenance.turn_indexes,
        )
        user = self.ids.store(mem.user_id, "user_id")
        longterm = self.memory.longterm
        held = await longterm.get(user, mem.memory_id)
        if held is not None and held.content == mem.content and held.invalid_from is None:
            self.report.memories_present += 1
            return
        key = mem.metadata.get("preference_key")
        value = mem.metadata.get("preference_value")
        extra = {
            k: v for k, v in mem.metadata.items() if k not in ("preference_key", "preference_value")
        }
        if mem.memory_type == "preference" and isinstance(key, str) and isinstance(value, str):
            await longterm.upsert_preference(
                user,
                key,
                value,
                text=mem.content,
                provenance=provenance,
                importance=mem.importance,
                tags=mem.tags,
                metadata=extra,
            )
        else:
            await longterm.remember(
                user,
                mem.content,
                memory_type=mem.memory_type,
                tags=mem.tags,
                importance=mem.importance,
                metadata=mem.metadata,
                provenance=provenance,
                valid_from=mem.valid_from,
            )
        self.report.memories_added += 1


def _same(stored: Turn, imported: Turn) -> bool:
    a = stored.model_dump(mode="json", include=set(_TURN_FIELDS_COMPARED))
    b = imported.model_dump(mode="json", include=set(_TURN_FIELDS_COMPARED))
    return a == b


async def import_lines(
    memory: MemoryService,
    lines: Iterable[str | bytes],
    *,
    scope: TenantScope | None = None,
    on_line: Callable[[], None] | None = None,
) -> ImportReport:
    """Import JSONL lines (see the module docstring); returns what was done. Lines read
    from a file opened in binary mode are decoded here, one by one, so a line that is not
    UTF-8 is named like any other bad line.

    Raises:
        ValidationError: a line that is not UTF-8 or not a valid record, a turn before its
            session, a gap in a session's indexes, or a turn that differs from the stored
            one at its index -- naming the line. Lines before it are imported (import again after
            fixing the file: what is there is skipped).
        BackendError: a store failed; importing again continues where it stopped.
    """
    importer = _Importer(memory, _Ids(scope))
    for number, raw in enumerate(lines, start=1):
        try:
            await importer.line(number, raw)
        except ValidationError:
            await importer.flush()  # the lines before the bad one are imported
            raise
        if on_line is not None:
            on_line()
    await importer.flush()
    return importer.report
