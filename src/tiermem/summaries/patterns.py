"""Behavioural patterns observed across a user's sessions (seed 000: ``behavioral_pattern``,
kept 30 days "for trend detection").

A detected habit is one the user *describes* ("I always buy the whole set":
:mod:`tiermem.longterm.detect`). This module adds the habits the service *observes*: the
same topic in several of the user's session summaries. The roll-up
(:class:`~tiermem.summaries.rollup.ProgressiveRollup`) derives them after every handoff
from the session summaries it already reads, and keeps one ``behavioral_pattern`` memory
per pattern.

**What counts as a session's topic** (:func:`session_topics`): the values the handoff
stored for the entity kinds of :attr:`PatternPolicy.kinds` (a series, a genre), and the
turns' intents (``add_turn(intent=...)``; the summary's ``topics`` that are neither an
entity value nor a slot name). Not the slot names ("budget", "favorite genre": what was
settled is a preference or a fact already), not ids, emails or amounts, not a word of
:attr:`PatternPolicy.ignored` ("manga", "book"...), and not a value the session
disliked (``opinion:genre:horror`` = ``dislikes``: "I don't like horror" three times is
no interest in horror).

**When a topic is a pattern** (:func:`observe_patterns`): the topic's newest session
ended at *L*, within :attr:`PatternPolicy.days` (30) of now, and at least
:attr:`PatternPolicy.min_sessions` (3) distinct sessions with the topic ended in the
``days`` up to *L*. The window is anchored at the latest observation, so the pattern's
text changes only when a session with the topic arrives or one is forgotten or redacted,
and the record -- written by the roll-up right after that session's handoff -- expires
``days`` after that session ended (``remember(expires_at=...)``), however late it was
written: it lapses 30 days after the user last brought the topic up.

**One record per pattern**, found again by ``metadata["observed_pattern"]`` (``series:
berserk``): a changed text supersedes it (the old text stays in history, as a digest's
does), a pattern no longer observed is forgotten (its support is gone: forgotten or
redacted sessions, or it lapsed), an unchanged one is left alone. Its provenance
(source ``observed``) lists the supporting session summaries in ``memory_ids``, so
forgetting one of those sessions forgets the pattern with them
(:meth:`LongTermMemory.forget_session`); the next roll-up writes it again if enough
sessions remain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tiermem.errors import ValidationError
from tiermem.longterm.detect import DISLIKES
from tiermem.longterm.memory import LongTermMemory
from tiermem.models import MemoryRecord, Provenance
from tiermem.models.base import JsonValue

__all__ = [
    "PATTERN_KEY",
    "PATTERN_TYPE",
    "ObservedPattern",
    "PatternPolicy",
    "observe_patterns",
    "session_topics",
    "write_patterns",
]

logger = logging.getLogger(__name__)

PATTERN_TYPE = "behavioral_pattern"
PATTERN_KEY = "observed_pattern"
"""Metadata key of an observed pattern's record: ``<kind>:<topic, case-folded>``."""
PATTERN_SOURCE = "observed"
MAX_SUPPORT_IDS = 50
"""Most supporting session summaries one pattern's provenance lists (the newest)."""
MAX_DAYS = 3_650
"""Longest window a policy may set (ten years; a longer one is a mistake, not a habit)."""
MAX_TOPIC_CHARS = 64
"""Longest topic counted (a tag's limit); a longer "topic" is a sentence, not a name."""
_PREFERENCE_PREFIX = "preference:"

DEFAULT_IGNORED = frozenset(
    {
        "manga", "comic", "comics", "book", "books", "anime", "novel", "novels", "title",
        "titles", "series", "volume", "volumes", "genre", "genres", "other", "others",
        "general", "misc", "unknown", "none", "n/a", "chat", "small talk", "smalltalk",
        "greeting", "hello", "thanks", "help", "question", "漫画", "マンガ", "まんが",
        "本", "コミック", "アニメ",
    }
)  # fmt: skip
"""Topics too general to be a habit (compared case-folded)."""


@dataclass(frozen=True, slots=True)
class PatternPolicy:
    """When topics of a user's session summaries become an observed behavioural pattern.

    ``min_sessions``: distinct sessions that must name the topic (3: two sessions on the
    same series are a coincidence as often as a habit). ``days``: the window those
    sessions must end in, counted back from the newest of them, and how long the pattern
    stands after it (30: seed 000's retention of the type). ``kinds``: the entity kinds
    whose values are topics (a series, a genre; ids, emails, amounts, dates and
    languages are details, not interests). ``intents``: the turns' intents count too.
    ``ignored``: topics never made a pattern (compared case-folded). ``max_patterns``:
    most observed patterns kept per user (the best supported).

    Raises:
        ValidationError: ``min_sessions`` < 2, ``days`` outside 1..3650, ``max_patterns``
            outside 1..100, ``ignored`` not a collection of strings.
    """

    min_sessions: int = 3
    days: int = 30
    kinds: frozenset[str] = frozenset({"series", "genre"})
    intents: bool = True
    ignored: frozenset[str] = DEFAULT_IGNORED
    max_patterns: int = 10

    def __post_init__(self) -> None:
        if self.min_sessions < 2:
            raise ValidationError("min_sessions must be at least 2: one session is no pattern")
        if not 1 <= self.days <= MAX_DAYS:
            raise ValidationError(f"days must be between 1 and {MAX_DAYS}")
        if not 1 <= self.max_patterns <= 100:
            raise ValidationError("max_patterns must be between 1 and 100")
        if isinstance(self.ignored, str) or not all(isinstance(w, str) for w in self.ignored):
            raise ValidationError("ignored must be a set of words (strings)")
        # Topics are compared case-folded: so are the words given ("Manga" ignores manga).
        object.__setattr__(self, "ignored", frozenset(w.casefold() for w in self.ignored))

    @property
    def window(self) -> timedelta:
        return timedelta(days=self.days)


@dataclass(frozen=True, slots=True)
class ObservedPattern:
    """A topic the user brought up in ``len(sessions)`` sessions (oldest first)."""

    key: str
    kind: str
    topic: str
    sessions: tuple[MemoryRecord, ...]
    ends: tuple[datetime, ...]

    @property
    def last(self) -> datetime:
        return self.ends[-1]

    @property
    def text(self) -> str:
        n = len(self.sessions)
        span = f"{n} sessions from {self.ends[0]:%Y-%m-%d} to {self.last:%Y-%m-%d}"
        if self.kind == "intent":
            return f"Recurring request: {self.topic.replace('_', ' ')} ({span})."
        return f"Often asks about {self.topic} ({span})."

    @property
    def memory_ids(self) -> tuple[str, ...]:
        return tuple(s.memory_id for s in self.sessions[-MAX_SUPPORT_IDS:])

    def metadata(self) -> dict[str, JsonValue]:
        return {
            PATTERN_KEY: self.key,
            "pattern_kind": self.kind,
            "topic": self.topic,
            "sessions": len(self.sessions),
            "first_seen": self.ends[0].isoformat(),
            "last_seen": self.last.isoformat(),
            "session_ids": [
                s.provenance.session_id
                for s in self.sessions[-MAX_SUPPORT_IDS:]
                if s.provenance.session_id
            ],
            "summary_ids": list(self.memory_ids),
        }


def session_topics(record: MemoryRecord, policy: PatternPolicy) -> dict[str, tuple[str, str]]:
    """The topics a session summary counts for: pattern key -> (kind, topic as written)."""
    meta = record.metadata
    raw = meta.get("facts")
    facts = {k: v for k, v in raw.items() if isinstance(v, str)} if isinstance(raw, dict) else {}
    disliked = {
        k.removeprefix(_PREFERENCE_PREFIX).split(":", 2)[2]
        for k, v in facts.items()
        if k.startswith(f"{_PREFERENCE_PREFIX}opinion:") and k.count(":") >= 3 and v in DISLIKES
    }
    found: dict[str, tuple[str, str]] = {}

    def add(kind: str, topic: str) -> None:
        topic = " ".join(topic.split())
        folded = topic.casefold()
        if not 2 <= len(folded) <= MAX_TOPIC_CHARS or not topic.isprintable():
            return  # a stray letter, or a sentence where a name should be
        if not any(c.isalpha() for c in folded):
            return
        if folded in policy.ignored or folded.replace(" ", "_") in disliked:
            return
        found.setdefault(f"{kind}:{folded}", (kind, topic))

    for kind in sorted(policy.kinds):
        value = facts.get(kind)
        if value is not None:
            add(kind, value)
    if policy.intents:
        # The handoff lists intents first, then entity values and slot names
        # (handoff.HandoffContent.topics); what is neither of those is an intent.
        values = {v.casefold() for v in facts.values()}
        slots = {k.removeprefix(_PREFERENCE_PREFIX).replace("_", " ") for k in facts}
        topics = meta.get("topics")
        for topic in topics if isinstance(topics, list) else []:
            if isinstance(topic, str) and topic.casefold() not in values and topic not in slots:
                add("intent", topic)
    return found


def observe_patterns(
    sessions: Iterable[MemoryRecord],
    now: datetime,
    policy: PatternPolicy,
    *,
    ended: Callable[[MemoryRecord], datetime],
) -> list[ObservedPattern]:
    """The patterns ``sessions`` (one summary per session) show at ``now``, best supported
    first (then the most recent), at most ``policy.max_patterns``."""
    window = policy.window
    by_key: dict[str, list[tuple[datetime, MemoryRecord, str, str]]] = {}
    for record in sessions:
        when = ended(record)
        if now - when >= 2 * window:
            continue  # support ends within ``window`` of now and spans less than ``window``
        for key, (kind, topic) in session_topics(record, policy).items():
            by_key.setdefault(key, []).append((when, record, kind, topic))
    found: list[ObservedPattern] = []
    for key, seen in by_key.items():
        if len(seen) < policy.min_sessions:
            continue
        seen.sort(key=lambda s: (s[0], s[1].memory_id))
        last = seen[-1][0]
        if now - last >= window:
            continue  # lapsed: the user has not brought it up for ``days``
        support = [s for s in seen if last - s[0] < window]
        if len(support) < policy.min_sessions:
            continue
        _, _, kind, topic = support[-1]  # as the newest session wrote it
        found.append(
            ObservedPattern(
                key=key,
                kind=kind,
                topic=topic,
                sessions=tuple(s[1] for s in support),
                ends=tuple(s[0] for s in support),
            )
        )
    found.sort(key=lambda p: (-len(p.sessions), -p.last.timestamp(), p.key))
    return found[: policy.max_patterns]


async def write_patterns(
    longterm: LongTermMemory,
    user_id: str,
    observed: Sequence[ObservedPattern],
    records: Sequence[MemoryRecord],
    summary_ids: Collection[str],
    now: datetime,
    window: timedelta = timedelta(days=30),
) -> int:
    """Make the user's observed-pattern records match ``observed``; ``records`` are the
    user's ``behavioral_pattern`` memories (any; described habits are left alone),
    ``summary_ids`` the ids of every session summary they have (superseded ones too).
    Returns how many writes it made (0 when nothing changed).

    A pattern written expires ``window`` (the policy's ``days``) after its last session
    ended, whenever it is written: one written again late (after a forget, a redaction or
    a re-handoff) does not count its days from that write.

    A pattern record, current or superseded, that was counted from a summary no longer
    there (a redaction deleted it) is deleted first, as redaction deletes the digests built
    from it: its text counted the redacted session. The pattern is then written afresh.

    Raises:
        ConflictError: a pattern record kept changing (a concurrent roll-up); run again.
        BackendError: the durable tier failed; run again.
    """
    held: dict[str, MemoryRecord] = {}
    doomed: list[MemoryRecord] = []
    written = 0
    for record in sorted(records, key=lambda r: (r.created_at, r.memory_id), reverse=True):
        key = record.metadata.get(PATTERN_KEY)
        if not isinstance(key, str):
            continue
        cited = record.metadata.get("summary_ids")
        if isinstance(cited, list) and any(i not in summary_ids for i in cited):
            written += 1 if await longterm.forget(user_id, record.memory_id) else 0
            continue
        if _hidden(record, now):
            continue
        if key in held:
            doomed.append(record)  # two roll-ups raced: keep the newest
        else:
            held[key] = record
    for pattern in observed:
        lapses = pattern.last + window
        if lapses <= now:
            continue  # lapses now: not written (a record of it is forgotten below)
        current = held.pop(pattern.key, None)
        ids = pattern.memory_ids
        provenance = Provenance(source=PATTERN_SOURCE, memory_ids=ids)
        text = pattern.text
        if current is not None and current.content == text:
            if set(ids) <= set(current.provenance.memory_ids) and _expires_at(current, lapses):
                continue  # unchanged
            # The same count over other summaries (a session handed off again, or
            # redacted), or a record whose expiry was counted from its write (written
            # before expires_at existed): remembering the same text merges the new ids
            # into its provenance and sets the expiry.
            current = None
        if current is None:
            await longterm.remember(
                user_id,
                text,
                memory_type=PATTERN_TYPE,
                tags=[pattern.topic],
                metadata=pattern.metadata(),
                provenance=provenance,
                expires_at=lapses,
            )
        else:
            await longterm.supersede(
                user_id,
                current.memory_id,
                text,
                tags=[pattern.topic],
                metadata=pattern.metadata(),
                provenance=provenance,
                expires_at=lapses,
            )
        written += 1
    for record in [*held.values(), *doomed]:
        # No longer observed: its sessions were forgotten or redacted, or it lapsed.
        if await longterm.forget(user_id, record.memory_id):
            logger.debug("observed pattern %s of user %s ended", record.memory_id, user_id)
            written += 1
    return written


def _expires_at(record: MemoryRecord, when: datetime) -> bool:
    """Whether ``record`` expires at ``when`` (to the second: a store may keep less than
    microseconds)."""
    expires = record.expires_at
    return expires is not None and abs(expires - when) < timedelta(seconds=1)


def _hidden(record: MemoryRecord, now: datetime) -> bool:
    return record.invalid_from is not None and record.invalid_from <= now
