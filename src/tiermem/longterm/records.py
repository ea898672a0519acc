"""Long-term memory records: ids, limits, models, predicates, validation at the edge, and the
pure decisions of :class:`~tiermem.longterm.memory.LongTermMemory` (how a repeat merges, what
forgetting a session deletes). No I/O here.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from tiermem.errors import ValidationError
from tiermem.longterm.endings import is_ending
from tiermem.longterm.types import is_internal_type
from tiermem.models import FrozenModel, JsonValue, MemoryRecord, Provenance
from tiermem.store.keys import validate_id

__all__ = [
    "CHANGE_LOG_RETENTION",
    "CHANGE_LOG_TYPE",
    "MAX_ALSO_FROM",
    "MAX_CONTENT_BYTES",
    "MAX_KEY_CHARS",
    "MAX_METADATA_BYTES",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_VALUE_BYTES",
    "PREFERENCE_HISTORY_TYPE",
    "RESERVED_METADATA_KEYS",
    "ChangeEntry",
    "ChangeOp",
    "ForgetPlan",
    "Sources",
    "UserMemoryStats",
    "also_from_sources",
    "check_importance",
    "check_limit",
    "check_metadata",
    "check_provenance",
    "check_tags",
    "check_text",
    "check_time",
    "dedup_memory_id",
    "is_bookkeeping",
    "is_hidden",
    "is_live",
    "is_preference_slot",
    "merge_repeat",
    "normalize_content",
    "normalize_preference_key",
    "plan_forget_session",
    "preference_history_id",
    "preference_slot_id",
    "public_record",
    "public_type",
    "same_source",
    "slot_version",
]

Sources = list[dict[str, JsonValue]]
"""Provenances as JSON, as kept in ``metadata["also_from"]``."""

CHANGE_LOG_TYPE = "_change"
"""The internal memory type of change-log entries (never recalled, never indexed)."""
CHANGE_LOG_RETENTION = timedelta(days=365)
PREFERENCE_HISTORY_TYPE = "_preference_history"
"""The stored memory type of preference history records, shown to users as ``preference``
(:func:`public_record`). Internal, so that the store's type filter keeps a key's history
out of every read of the current preferences. History written before this type existed
has type ``preference``; it is hidden by ``invalid_from`` all the same."""
MAX_CONTENT_BYTES = 32 * 1024
"""Largest memory content (UTF-8); a memory is a sentence or a summary, not a document."""
MAX_METADATA_BYTES = 32 * 1024
MAX_TAGS = 32
MAX_TAG_CHARS = 64
MAX_KEY_CHARS = 200
MAX_VALUE_BYTES = 4 * 1024
MAX_ALSO_FROM = 20
"""Most provenances of repeats kept on one record; later repeats are not recorded."""
RESERVED_METADATA_KEYS = frozenset(
    {"also_from", "supersedes", "superseded_by", "preference_key", "preference_value",
     "history_of", "slot_version"}
)  # fmt: skip
"""Metadata keys tiermem manages; callers may not set them."""

_TRAILING_PUNCTUATION = " .,;:!?…。、！？・"


# ---------------------------------------------------------------- ids


def normalize_content(text: str) -> str:
    """The form two memories must share to be one: NFKC, case-folded, whitespace runs as
    one space, trailing punctuation dropped ("I like Seinen!" == "i  like seinen")."""
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return folded.rstrip(_TRAILING_PUNCTUATION)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def dedup_memory_id(memory_type: str, content: str) -> str:
    """The id of a remembered memory: from its type and normalised content, so the same
    fact remembered twice is one record. 128 bits of SHA-256."""
    return f"m-{_digest('v1', memory_type, normalize_content(content))}"


def normalize_preference_key(key: str) -> str:
    """A preference key as stored: NFKC, case-folded, whitespace runs as ``_``."""
    return "_".join(unicodedata.normalize("NFKC", key).casefold().split())


def preference_slot_id(key: str) -> str:
    """The id of the record holding the current value of a (normalised) preference key."""
    return f"pref-{_digest('v1', key)}"


def preference_history_id(slot_id: str, version: int) -> str:
    """The id of the history record of a slot's value at ``version``."""
    return f"{slot_id}-v{version}"


# ---------------------------------------------------------------- models


ChangeOp = Literal["remember", "upsert", "supersede", "forget"]


class ChangeEntry(FrozenModel):
    """One entry of a user's change log. Never holds memory content."""

    entry_id: str
    op: ChangeOp
    memory_id: str
    memory_type: str
    at: datetime
    summary: str
    related: str | None = None
    """The other memory of the change: the successor of a supersession."""


class UserMemoryStats(FrozenModel):
    """What :meth:`LongTermMemory.stats` reports about one user's memories."""

    user_id: str
    total: int
    """Current memories: unexpired, not superseded, not internal."""
    by_type: dict[str, int] = Field(default_factory=dict)
    total_tokens: int
    """Tokens (cl100k) of the current memories' content."""
    oldest_created_at: datetime | None
    newest_created_at: datetime | None
    superseded: int
    """Unexpired records hidden by supersession, preference history included."""
    expired_awaiting_collection: int
    """Records past their retention that the backend has not collected yet."""
    change_log_entries: int


# ---------------------------------------------------------------- record predicates


def is_hidden(record: MemoryRecord, now: datetime) -> bool:
    """Superseded (``invalid_from`` has passed) or internal: never recalled or indexed."""
    if is_internal_type(record.memory_type):
        return True
    return record.invalid_from is not None and record.invalid_from <= now


def is_bookkeeping(record: MemoryRecord) -> bool:
    """tiermem's own records (change log, knowledge documents): not a memory of the user,
    not even a hidden one. Preference history is internal but is the user's."""
    return is_internal_type(record.memory_type) and record.memory_type != PREFERENCE_HISTORY_TYPE


def public_type(memory_type: str) -> str:
    """The memory type users see: ``preference`` for preference history."""
    return "preference" if memory_type == PREFERENCE_HISTORY_TYPE else memory_type


def public_record(record: MemoryRecord) -> MemoryRecord:
    """The record as users see it: preference history as type ``preference``."""
    if record.memory_type == PREFERENCE_HISTORY_TYPE:
        return record.model_copy(update={"memory_type": public_type(record.memory_type)})
    return record


def is_live(record: MemoryRecord, now: datetime) -> bool:
    return record.expires_at is None or now < record.expires_at


def is_preference_slot(record: MemoryRecord) -> bool:
    key = record.metadata.get("preference_key")
    return (
        isinstance(key, str)
        and "history_of" not in record.metadata
        and record.memory_id == preference_slot_id(key)
    )


def also_from_sources(record: MemoryRecord) -> Sources:
    entries = record.metadata.get("also_from")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def same_source(a: Mapping[str, JsonValue], b: Provenance) -> bool:
    return {k: v for k, v in a.items() if k != "at"} == b.model_dump(mode="json")


def slot_version(record: MemoryRecord) -> int:
    version = record.metadata.get("slot_version")
    return version if isinstance(version, int) else 0


# ---------------------------------------------------------------- validation at the edge


def check_text(value: object, *, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ValidationError(f"{what} is empty; give the text to remember")
    size = len(text.encode())
    if size > limit:
        raise ValidationError(
            f"{what} is {size} bytes; the limit is {limit}. Remember a short statement or a "
            "summary, and keep documents in the knowledge base instead."
        )
    return text


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise ValidationError("tags must be a sequence of strings, not one string")
    out: list[str] = []
    for tag in tags:
        validate_id(tag, what="tag")
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationError(f"tag {tag[:20]!r}... is over {MAX_TAG_CHARS} characters")
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValidationError(f"{len(out)} tags; a memory may have at most {MAX_TAGS}")
    return tuple(out)


def check_importance(value: float | None, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValidationError(f"importance must be a number in [0, 1], got {value!r}")
    return float(value)


def check_metadata(metadata: Mapping[str, JsonValue] | None) -> dict[str, JsonValue]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise ValidationError("metadata must be a mapping with string keys")
    reserved = RESERVED_METADATA_KEYS & metadata.keys()
    if reserved:
        raise ValidationError(
            f"metadata keys {sorted(reserved)} are managed by tiermem; use other names"
        )
    try:
        size = len(json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"metadata must be JSON (str, number, bool, list, dict): {exc}"
        ) from exc
    if size > MAX_METADATA_BYTES:
        raise ValidationError(
            f"metadata is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}"
        )
    return dict(metadata)


def check_provenance(provenance: Provenance | None, default_source: str) -> Provenance:
    if provenance is None:
        return Provenance(source=default_source)
    if not isinstance(provenance, Provenance):
        raise ValidationError("provenance must be a tiermem.models.Provenance")
    if provenance.session_id is not None:
        validate_id(provenance.session_id, what="provenance.session_id")
    for memory_id in provenance.memory_ids:
        validate_id(memory_id, what="provenance.memory_ids[]")
    if any(i < 0 for i in provenance.turn_indexes):
        raise ValidationError("provenance.turn_indexes must be >= 0")
    return provenance


def check_time(value: datetime | None, *, what: str) -> datetime | None:
    if value is not None and not isinstance(value, datetime):
        raise ValidationError(f"{what} must be an aware datetime, got {type(value).__name__}")
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValidationError(f"{what} has no timezone; pass an aware datetime (UTC)")
    return value


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit must be an integer >= 1, got {limit!r}")
    return limit


# ---------------------------------------------------------------- merging a repeat


def merge_repeat(
    existing: MemoryRecord,
    incoming: MemoryRecord,
    *,
    importance_given: bool,
    now: datetime,
    expiry_given: bool = False,
) -> tuple[MemoryRecord | None, str]:
    """The record after ``incoming`` (same id) was remembered again, or None if unchanged.
    ``expiry_given``: the caller set ``incoming.expires_at`` itself, and it is kept as
    given (else a repeat only extends the retention)."""
    update: dict[str, Any] = {}
    tags = existing.tags + tuple(t for t in incoming.tags if t not in existing.tags)
    if tags != existing.tags:
        update["tags"] = tags[:MAX_TAGS]
    if importance_given and incoming.importance > existing.importance:
        update["importance"] = incoming.importance
    if expiry_given:
        if incoming.expires_at != existing.expires_at:
            update["expires_at"] = incoming.expires_at
    elif existing.expires_at is not None and (
        incoming.expires_at is None or incoming.expires_at > existing.expires_at
    ):
        update["expires_at"] = incoming.expires_at  # said again: retention starts again
    metadata = dict(existing.metadata)
    for key, value in incoming.metadata.items():
        if key not in ("also_from", "superseded_by"):
            metadata.setdefault(key, value)
    also = also_from_sources(existing)
    source = incoming.provenance
    new_ids = tuple(i for i in source.memory_ids if i not in existing.provenance.memory_ids)
    if new_ids:
        update["provenance"] = existing.provenance.model_copy(
            update={"memory_ids": existing.provenance.memory_ids + new_ids}
        )
        source = source.model_copy(update={"memory_ids": existing.provenance.memory_ids})
    known = source == existing.provenance or any(same_source(a, source) for a in also)
    if not known and len(also) < MAX_ALSO_FROM:
        metadata["also_from"] = [*also, {**source.model_dump(mode="json"), "at": now.isoformat()}]
    what = "merged a repeat"
    if existing.invalid_from is not None and existing.invalid_from <= now:
        update["invalid_from"] = None
        metadata.pop("superseded_by", None)
        what = "revived a superseded memory"
    if metadata != existing.metadata:
        update["metadata"] = metadata
    if not update:
        return None, ""
    update["version"] = existing.version + 1
    return existing.model_copy(update=update), what


# ---------------------------------------------------------------- forgetting a session


@dataclass
class ForgetPlan:
    """What :meth:`LongTermMemory.forget_session` does, decided from the user's records."""

    forgotten: set[str] = field(default_factory=set)
    """Memories whose content goes: said in the session, or derived from such a memory."""
    rollbacks: dict[str, str] = field(default_factory=dict)
    """Preference slot → the history record whose value becomes current again."""
    rewrites: dict[str, Sources] = field(default_factory=dict)
    """Memory → its remaining sources (first = new provenance, rest = ``also_from``)."""

    @property
    def deletions(self) -> list[str]:
        """Ids to delete: the forgotten ones except rolled-back slots, plus the history
        copies of the restored values (they are current again)."""
        return sorted((self.forgotten - self.rollbacks.keys()) | set(self.rollbacks.values()))


def plan_forget_session(records: Mapping[str, MemoryRecord], session_id: str) -> ForgetPlan:
    """Decide what forgetting ``session_id`` does to these records (all of one user's, by id).

    * A memory whose provenance is the session is forgotten, unless it was said in other
      sessions too (``also_from``): then it stays, attributed to the next of them.
    * A memory merely repeated in the session loses that source.
    * Every memory derived from a forgotten one (``provenance.memory_ids``) is forgotten,
      transitively.
    * An ending (a favourite retired by a dislike or by ``retire_preference``), current or
      in history, whose ended value was stated only in forgotten versions is forgotten
      too: "no longer favorite_genre: horror" would still say what the session said.
    * A forgotten preference slot rolls back to its newest history value that is not
      forgotten, if there is one.
    """
    plan = ForgetPlan()
    for record in records.values():
        if is_bookkeeping(record):
            continue
        also = also_from_sources(record)
        others = [a for a in also if a.get("session_id") != session_id]
        if record.provenance.session_id == session_id:
            plain = not is_preference_slot(record) and "history_of" not in record.metadata
            if others and plain:
                plan.rewrites[record.memory_id] = others  # said elsewhere too: keep it
            else:
                plan.forgotten.add(record.memory_id)
        elif len(others) != len(also):
            plan.rewrites[record.memory_id] = [record.provenance.model_dump(mode="json"), *others]
    changed = True
    while changed:
        changed = False
        for record in records.values():
            derived = plan.forgotten.intersection(record.provenance.memory_ids)
            if derived and record.memory_id not in plan.forgotten:
                plan.forgotten.add(record.memory_id)
                plan.rewrites.pop(record.memory_id, None)
                changed = True
    _forget_orphan_endings(records, plan)
    for slot_id in sorted(plan.forgotten):
        slot = records[slot_id]
        if not is_preference_slot(slot):
            continue
        history = [
            r
            for r in records.values()
            if r.metadata.get("history_of") == slot_id and r.memory_id not in plan.forgotten
        ]
        if history:
            plan.rollbacks[slot_id] = max(history, key=slot_version).memory_id
    return plan


def _forget_orphan_endings(records: Mapping[str, MemoryRecord], plan: ForgetPlan) -> None:
    """Add to ``plan.forgotten`` every ending whose ended value only forgotten versions of
    its slot stated (an ending with no stated version on record is left alone)."""
    stated: dict[tuple[str, str], list[str]] = {}
    for record in records.values():
        slot_id, value = record.metadata.get("history_of"), record.metadata.get("preference_value")
        if isinstance(slot_id, str) and isinstance(value, str) and not is_ending(record.metadata):
            stated.setdefault((slot_id, value), []).append(record.memory_id)
    for record in records.values():
        value = record.metadata.get("preference_value")
        if record.memory_id in plan.forgotten or not isinstance(value, str):
            continue
        if not is_ending(record.metadata):
            continue
        history_of = record.metadata.get("history_of")
        slot_id = history_of if isinstance(history_of, str) else record.memory_id
        versions = stated.get((slot_id, value), [])
        if versions and all(v in plan.forgotten for v in versions):
            plan.forgotten.add(record.memory_id)
            plan.rewrites.pop(record.memory_id, None)
