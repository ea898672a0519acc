"""Progressive roll-up of a user's session summaries (seed 000, section 2.4).

A user's ``interaction_summary`` memories (one per session, written at handoff) are kept
individually for 7 days; older ones are rolled into one summary per ISO week, and weeks
that ended more than 30 days ago into one summary per month. The user's long-term history
(:meth:`ProgressiveRollup.history`) then stays within 800 tokens however many sessions
they had: individual sessions within 500 (newest first; the overflow rolls into its week
early), weeks within 200, months within 100 -- seed 000's table.

**Not a summary of a summary.** A week or month is a digest built from the *session*
records of its period (their topics, sentiment, facts and first sentence), never from
the text of an earlier roll-up: a month is built from the sessions, not from its weeks.

**Superseded stays superseded.** Facts are folded over all of the user's sessions in
time order; a value a later session changed ("budget ¥5,000" then "¥8,000") is left out
of every digest, and a digest's sentences that state it are dropped. Roll-ups are
rewritten when that changes.

**Nothing is deleted.** Rolled-up records are superseded
(:meth:`LongTermMemory.supersede`: hidden from recall, kept in history with
``superseded_by``), and so is a week's digest when its week joins a month. The roll-up
is idempotent: run again with nothing new, it writes nothing.

**Observed habits.** From the same session summaries, the roll-up keeps the user's
observed behavioural patterns (a series or genre brought up, or an intent, in 3 sessions
within 30 days: one ``behavioral_pattern`` memory each, lapsing 30 days after the topic's
last session; :mod:`tiermem.summaries.patterns`). They are read in the same list call as
the summaries (and the summaries again on their own when that call is full).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tiermem.clock import Clock
from tiermem.errors import ValidationError
from tiermem.longterm.memory import LongTermMemory
from tiermem.models import MemoryRecord, Provenance
from tiermem.models.base import FrozenModel, JsonValue
from tiermem.summaries.patterns import (
    PATTERN_TYPE,
    PatternPolicy,
    observe_patterns,
    write_patterns,
)
from tiermem.summaries.structured import states_value
from tiermem.tokens import TokenCounter

__all__ = ["ProgressiveRollup", "RollupPolicy", "UserHistory"]

logger = logging.getLogger(__name__)

SUMMARY_TYPE = "interaction_summary"
MAX_RECORDS = 2_000
"""Most interaction summaries one roll-up reads (newest first)."""
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")
_SESSION_PREFIX = re.compile(r"^Session on \d{4}-\d{2}-\d{2}:\s*")


@dataclass(frozen=True, slots=True)
class RollupPolicy:
    """Ages and token budgets of the roll-up (seed 000: 7 days, 30 days; 500/200/100), and
    the observed patterns it keeps."""

    individual_days: int = 7
    monthly_after_days: int = 30
    individual_tokens: int = 500
    weekly_tokens: int = 200
    monthly_tokens: int = 100
    min_digest_tokens: int = 16
    patterns: PatternPolicy | None = field(default_factory=PatternPolicy)
    """When topics of the sessions become observed behavioural patterns
    (:class:`~tiermem.summaries.patterns.PatternPolicy`: 3 sessions within 30 days);
    None: the roll-up keeps none."""

    def __post_init__(self) -> None:
        if not 0 < self.individual_days < self.monthly_after_days:
            raise ValidationError("need 0 < individual_days < monthly_after_days")
        if min(self.individual_tokens, self.weekly_tokens, self.monthly_tokens) < 16:
            raise ValidationError("roll-up budgets must be at least 16 tokens each")

    @property
    def total_tokens(self) -> int:
        return self.individual_tokens + self.weekly_tokens + self.monthly_tokens


class UserHistory(FrozenModel):
    """A user's long-term history as context: session, week and month summaries."""

    text: str
    tokens: int
    sessions: tuple[str, ...] = ()
    weeks: tuple[str, ...] = ()
    months: tuple[str, ...] = ()
    memory_ids: tuple[str, ...] = ()


@dataclass
class _Digest:
    kind: str  # "week" or "month"
    period: str
    start: datetime
    sessions: list[MemoryRecord]
    folded_weeks: list[MemoryRecord]


class ProgressiveRollup:
    """Rolls a user's session summaries up into weeks and months (module docstring)."""

    def __init__(
        self,
        longterm: LongTermMemory,
        *,
        clock: Clock,
        tokens: TokenCounter,
        policy: RollupPolicy | None = None,
    ) -> None:
        self.longterm = longterm
        self.clock = clock
        self.tokens = tokens
        self.policy = policy or RollupPolicy()

    async def roll_up(self, user_id: str) -> int:
        """Roll the user's older session summaries up and bring their observed patterns up
        to date; returns how many records were written (0 when nothing changed).

        Raises:
            ValidationError: a bad id.
            ConflictError: records kept changing; run again.
            BackendError: the durable tier failed; run again (it is idempotent).
        """
        now = self.clock.now()
        patterns = self.policy.patterns
        if patterns is not None and PATTERN_TYPE not in self.longterm.types.names():
            patterns = None  # a deployment whose registry has no such type keeps none
        # One list call for both types (one Redis script; on DynamoDB one more query of
        # the type index, run concurrently).
        types = [SUMMARY_TYPE] if patterns is None else [SUMMARY_TYPE, PATTERN_TYPE]
        listed = await self.longterm.list(
            user_id, types=types, include_superseded=True, limit=MAX_RECORDS
        )
        records = [r for r in listed if r.memory_type == SUMMARY_TYPE]
        if patterns is not None and len(listed) >= MAX_RECORDS:
            # Full: the patterns' versions (newer than most summaries) may have pushed the
            # oldest summaries out. Read those on their own (one more call, for such users).
            records = await self.longterm.list(
                user_id, types=[SUMMARY_TYPE], include_superseded=True, limit=MAX_RECORDS
            )
        sessions = sorted(_latest_per_session(r for r in records if not _is_rollup(r)), key=_when)
        live_rollups = {
            (str(r.metadata["rollup"]), str(r.metadata.get("period"))): r
            for r in records
            if _is_rollup(r) and not _hidden(r, now)
        }
        current, stale = _fold_facts(sessions)
        digests = self._plan(sessions, now)
        weeks = {d.period for d in digests.values() if d.kind == "week"}
        written = 0
        for digest in digests.values():
            text = self._digest_text(digest, current, stale)
            written += await self._write(user_id, digest, text, live_rollups, weeks, now)
        if patterns is not None:
            observed = observe_patterns(sessions, now, patterns, ended=_when)
            held = [r for r in listed if r.memory_type == PATTERN_TYPE]
            ids = {r.memory_id for r in records}
            written += await write_patterns(
                self.longterm, user_id, observed, held, ids, now, patterns.window
            )
        return written

    def _plan(self, sessions: Sequence[MemoryRecord], now: datetime) -> dict[str, _Digest]:
        policy = self.policy
        recent = [s for s in sessions if now - _when(s) < timedelta(days=policy.individual_days)]
        keep: set[str] = set()
        used = 0
        for record in sorted(recent, key=_when, reverse=True):
            cost = self.tokens.count(record.content)
            if used + cost > policy.individual_tokens:
                break  # this one and every older one roll into their week early
            keep.add(record.memory_id)
            used += cost
        digests: dict[str, _Digest] = {}
        for record in sessions:
            if record.memory_id in keep:
                continue
            week_start = _week_start(_when(record))
            if now - (week_start + timedelta(days=7)) >= timedelta(days=policy.monthly_after_days):
                # A week belongs to the month of its Thursday (as ISO weeks to years).
                thursday = week_start + timedelta(days=3)
                key, kind = f"{thursday:%Y-%m}", "month"
                start = thursday.replace(day=1)
            else:
                year, week, _ = week_start.isocalendar()
                key, kind, start = f"{year}-W{week:02d}", "week", week_start
            digest = digests.setdefault(f"{kind}:{key}", _Digest(kind, key, start, [], []))
            digest.sessions.append(record)
        return digests

    def _digest_text(
        self, digest: _Digest, current: Mapping[str, str], stale: Mapping[str, set[str]]
    ) -> str:
        policy = self.policy
        label = (
            f"Week of {digest.start:%Y-%m-%d}"
            if digest.kind == "week"
            else f"Month {digest.period}"
        )
        n = len(digest.sessions)
        parts = [f"{label} ({n} session{'s' if n != 1 else ''})."]
        topics = Counter(
            str(t)
            for s in digest.sessions
            for t in _list(s.metadata.get("topics"))
            if isinstance(t, str)
        )
        if topics:
            parts.append("Topics: " + ", ".join(t for t, _ in topics.most_common(6)) + ".")
        facts: dict[str, str] = {}
        for session in digest.sessions:
            for slot, value in _facts(session).items():
                facts[slot] = value
        shown = {k: v for k, v in facts.items() if current.get(k) == v}
        if shown:
            parts.append("Facts: " + "; ".join(f"{k}: {v}" for k, v in shown.items()) + ".")
        moods = Counter(str(s.metadata.get("sentiment", "neutral")) for s in digest.sessions)
        if moods and moods.most_common(1)[0][0] != "neutral":
            parts.append(f"Mood: mostly {moods.most_common(1)[0][0]}.")
        for session in digest.sessions:
            sentence = _first_sentence(session.content)
            if sentence and not _states_stale(sentence, stale):
                parts.append(sentence)
        budget = policy.weekly_tokens if digest.kind == "week" else policy.monthly_tokens
        target = max(policy.min_digest_tokens, budget // self._share(digest.kind))
        text = ""
        for part in parts:
            candidate = f"{text} {part}".strip()
            if self.tokens.count(candidate) > target:
                break
            text = candidate
        return text or parts[0]

    def _share(self, kind: str) -> int:
        # Weeks between the individual horizon and the monthly one; months up to the
        # interaction summaries' retention (90 days).
        if kind == "week":
            return max(
                1, -(-(self.policy.monthly_after_days - self.policy.individual_days) // 7) + 1
            )
        return 3

    async def _write(
        self,
        user_id: str,
        digest: _Digest,
        text: str,
        live: dict[tuple[str, str], MemoryRecord],
        weeks: set[str],
        now: datetime,
    ) -> int:
        """Write ``digest``'s record (new, superseding the period's previous one, or
        unchanged) and supersede what it now covers: its live sessions, and for a month the
        live digests of its weeks that are no longer weeks of their own (``weeks``)."""
        ids = tuple(s.memory_id for s in digest.sessions)
        provenance = Provenance(source="rollup", memory_ids=ids[:200])
        metadata: dict[str, JsonValue] = {
            "rollup": digest.kind,
            "period": digest.period,
            "period_start": digest.start.isoformat(),
            "sessions": len(digest.sessions),
        }
        written = 0
        existing = live.get((digest.kind, digest.period))
        if existing is not None and existing.content == text:
            target = existing
        elif existing is not None:
            target = await self.longterm.supersede(
                user_id, existing.memory_id, text, metadata=metadata, provenance=provenance
            )
            written += 1
        else:
            target = await self.longterm.remember(
                user_id,
                text,
                memory_type=SUMMARY_TYPE,
                metadata=metadata,
                provenance=provenance,
                valid_from=digest.start,
            )
            written += 1
        live[(digest.kind, digest.period)] = target
        # Fold in what this digest now covers: live sessions, and a month's live weeks.
        covered = [s for s in digest.sessions if not _hidden(s, now)]
        if digest.kind == "month":
            covered += [
                r
                for (kind, period), r in list(live.items())
                if kind == "week"
                and period not in weeks
                and _week_month(r) == digest.period
                and not _hidden(r, now)
            ]
        for record in covered:
            if record.memory_id == target.memory_id:
                continue
            await self.longterm.supersede(
                user_id, record.memory_id, text, metadata=metadata, provenance=provenance
            )
            written += 1
        return written

    async def history(self, user_id: str) -> UserHistory:
        """The user's history as context: individual sessions (newest first), then weeks,
        then months, each within its budget, so the whole stays within
        ``policy.total_tokens`` (800)."""
        now = self.clock.now()
        records = await self.longterm.list(user_id, types=[SUMMARY_TYPE], limit=MAX_RECORDS)
        live = [r for r in records if not _hidden(r, now)]
        groups: dict[str, list[MemoryRecord]] = {"session": [], "week": [], "month": []}
        for record in sorted(live, key=_when, reverse=True):
            groups[str(record.metadata.get("rollup", "session"))].append(record)
        budgets = {
            "session": self.policy.individual_tokens,
            "week": self.policy.weekly_tokens,
            "month": self.policy.monthly_tokens,
        }
        lines: list[str] = []
        chosen: dict[str, list[MemoryRecord]] = {}
        for kind, group in groups.items():
            used = 0
            for record in group:
                cost = self.tokens.count(record.content) + 1
                if used + cost > budgets[kind]:
                    continue
                used += cost
                chosen.setdefault(kind, []).append(record)
                lines.append(record.content)
        text = "\n".join(lines)
        return UserHistory(
            text=text,
            tokens=self.tokens.count(text),
            sessions=tuple(r.memory_id for r in chosen.get("session", [])),
            weeks=tuple(str(r.metadata.get("period")) for r in chosen.get("week", [])),
            months=tuple(str(r.metadata.get("period")) for r in chosen.get("month", [])),
            memory_ids=tuple(r.memory_id for rs in chosen.values() for r in rs),
        )


def _latest_per_session(records: Iterable[MemoryRecord]) -> list[MemoryRecord]:
    """One record per handed-off session, its newest: a session reopened after its
    handoff was handed off again, and that summary superseded (or, rolled up already,
    replaced) the earlier one, which must not count as a session of its own."""
    latest: dict[str, MemoryRecord] = {}
    for record in records:
        prov = record.provenance
        key = (
            f"session:{prov.session_id}"
            if prov.source == "handoff" and prov.session_id
            else f"memory:{record.memory_id}"
        )
        held = latest.get(key)
        if held is None or _coverage(record) > _coverage(held):
            latest[key] = record
    return list(latest.values())


def _coverage(record: MemoryRecord) -> tuple[int, datetime]:
    """How far a session summary goes: its last turn, then when it was written."""
    turns = record.metadata.get("turn_range")
    last = turns[-1] if isinstance(turns, list) and turns and isinstance(turns[-1], int) else -1
    return last, record.created_at


def _is_rollup(record: MemoryRecord) -> bool:
    return record.metadata.get("rollup") in ("week", "month")


def _hidden(record: MemoryRecord, now: datetime) -> bool:
    return record.invalid_from is not None and record.invalid_from <= now


def _when(record: MemoryRecord) -> datetime:
    """When a session ended, or when a roll-up's period started."""
    raw = record.metadata.get("session_ended", record.metadata.get("period_start"))
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.astimezone(UTC)
    return record.valid_from or record.created_at


def _week_start(when: datetime) -> datetime:
    day = when.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def _week_month(record: MemoryRecord) -> str | None:
    raw = record.metadata.get("period_start")
    if not isinstance(raw, str):
        return None
    try:
        return f"{datetime.fromisoformat(raw) + timedelta(days=3):%Y-%m}"
    except ValueError:
        return None


def _list(value: JsonValue | None) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _facts(record: MemoryRecord) -> dict[str, str]:
    raw = record.metadata.get("facts")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(v, str)}


def _fold_facts(
    sessions: Sequence[MemoryRecord],
) -> tuple[dict[str, str], dict[str, set[str]]]:
    """The latest value of each slot over the user's sessions (oldest first), and the
    values each slot had before (including values a session corrected itself)."""
    current: dict[str, str] = {}
    stale: dict[str, set[str]] = {}
    for session in sessions:
        corrected = session.metadata.get("superseded_values")
        if isinstance(corrected, dict):
            for slot, values in corrected.items():
                stale.setdefault(slot, set()).update(v for v in _list(values) if isinstance(v, str))
        for slot, value in _facts(session).items():
            held = current.get(slot)
            if held is not None and held != value:
                stale.setdefault(slot, set()).add(held)
            current[slot] = value
    for slot, value in current.items():
        stale.get(slot, set()).discard(value)
    return current, stale


def _first_sentence(content: str) -> str:
    body = _SESSION_PREFIX.sub("", content.strip())
    return _SENTENCE.split(body, maxsplit=1)[0].strip() if body else ""


def _states_stale(sentence: str, stale: Mapping[str, set[str]]) -> bool:
    return any(
        states_value(sentence, value, slot=slot)
        for slot, values in stale.items()
        for value in values
    )
