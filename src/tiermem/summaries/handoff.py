"""Session handoff: what a session leaves in long-term memory when it closes or expires.

:class:`SessionHandoff` is the expiry sweeper's :data:`~tiermem.tiers.sweeper.Handoff`
and what :meth:`Session.close` runs. For one session it writes (seed 000, section 2.4):

* an ``interaction_summary`` memory: a short summary of the session (from its raw turns,
  with the rolling summaries as context -- only the turns the summaries do not cover when
  the session is over ``MAX_HANDOFF_RAW_TOKENS`` -- and the rolling summaries alone once
  the raw turns have expired), its topics and the user's sentiment, with provenance
  ``Provenance(source="handoff", session_id=...)`` and the session's time span and
  current facts in metadata (the progressive roll-up reads them);
* the preferences structured memory detected (``preference:<key>`` facts), as preference
  slots (:meth:`LongTermMemory.upsert_preference`) with the same provenance -- unless the
  session's auto-detection already set the slot (or ended it: a favourite a detected
  dislike retired stays ended), or it was set after the turn that stated the handoff's
  value (a late handoff never overwrites a newer value: the prepared content keeps each
  stating turn's time, and a value a handoff writes keeps it in ``metadata["stated_at"]``,
  so two handoffs compare when their values were said, not when they ran).

**Idempotent across crashes.** A handoff is two phases over the session record
``handoff``, compare-and-set on its version:

1. *prepare*: compute everything above and store it (``status: prepared``) with
   ``expected_version=0``; of two sweepers preparing at once, one wins and the other
   continues with the winner's content;
2. *apply*: write the memories from the stored content -- the summary's memory id follows
   from its content (``dedup_memory_id``) and a preference slot from its key, so applying
   twice writes each once -- then mark the record ``done``.

A sweeper that crashes anywhere leaves either no record (the next one prepares), a
prepared one (the next one applies the same content) or a done one (nothing to do).

**A reopened session is handed off again, whole.** The record says through which turn
it went (``last_turn``); a session that got turns after its handoff (a turn reopens a
closed session: :meth:`Session.close`) finds it ``done`` short of its last turn, and the
next handoff prepares over the done record (compare-and-set on its version, the done
summary's id in ``previous_memory_id``); the apply supersedes that summary with the new
one (:meth:`LongTermMemory.supersede`; applied again after a crash, it finishes the same
supersession), so the session keeps one live summary and the old one stays in history.
A summary that is gone or was rolled up into a digest meanwhile is not superseded: the
new one is remembered. A value the earlier handoff wrote to a preference slot gives way
to the one the session changed it to.

**A final summary pass** runs before the prepare (:meth:`SummaryJobs.wait_through` the
last turn; a no-op when a pass already got there): the turns after the last triggered pass
become summary lines, so they stay recallable after the raw turns expire.

**Redaction reaches the handoff** (:meth:`SessionHandoff.redacted`, run by
:meth:`Session.redact_turn` after the summaries were reset): when the handed-off turns
include the redacted one, the session's handoff summary (every version), the roll-up
digests built from it (and the digests built from those), and every preference value or
detected memory whose provenance cites the turn are deleted; then the handoff is prepared
again from what is left (the archive holds the redacted turn, the summaries were reset)
and applied, and the roll-up rebuilds the digests from the remaining session records.
Preference values of the slot that did not come from the turn are written back, oldest
first, with their own provenance (their timestamps become the rewrite's), the slot's
endings too: a favourite a dislike ended stays ended, unless the turn was the dislike's
(an ended slot is rewritten like a live one; before, its history kept the redacted
value). A handoff that ran concurrently with the redaction (it read the turn before the
redaction, the redaction found nothing handed off yet, or re-prepared under it) checks
after applying whether a turn it covered was redacted since its prepare, and undoes it
the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from pydantic import Field

from tiermem.clock import Clock
from tiermem.errors import ConflictError, NotFoundError, TierMemError, ValidationError
from tiermem.longterm.endings import ENDED_BY_KEY, ENDED_REASON, ending_matcher, is_ending
from tiermem.longterm.memory import LongTermMemory
from tiermem.models import MemoryRecord, Provenance, SessionRecord, Turn
from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime
from tiermem.store.contract import DurableStore
from tiermem.summaries.jobs import SummaryJobs
from tiermem.summaries.patterns import PATTERN_KEY
from tiermem.summaries.rolling import cut_to_tokens
from tiermem.summaries.structured import render_structured
from tiermem.tiers.tiered import SessionView
from tiermem.tokens import TokenCounter

__all__ = ["HANDOFF_RECORD", "HandoffContent", "SessionHandoff", "detect_sentiment"]

logger = logging.getLogger(__name__)

HANDOFF_RECORD = "handoff"
PREFERENCE_PREFIX = "preference:"
MAX_TOPICS = 8
MAX_FACTS = 40
MAX_VALUES = 10
MAX_ROUNDS = 4
"""Most times one handoff reads the ``handoff`` record again after losing a race on it."""
MAX_DERIVED = 10_000
"""Most of a user's memories a redaction reads to find what derives from the turn."""
MAX_HANDOFF_RAW_TOKENS = 16_000
"""Above this many tokens of raw turns, the handoff summarizes the turns after the rolling
summaries, with the summaries as context, instead of every raw turn."""
"""Earlier values kept per slot in the handoff (the newest ones)."""
_NOT_TOPICS = frozenset(
    {"volume", "price", "money", "date", "order_id", "asin", "isbn", "quantity", "language"}
)
"""Entity kinds that are details of a topic, not a topic ("vol 25", "¥990")."""

_POSITIVE = frozenset(
    [
        "thanks",
        "thank",
        "great",
        "perfect",
        "love",
        "awesome",
        "excellent",
        "helpful",
        "amazing",
        "wonderful",
        "nice",
        "appreciate",
        "glad",
        "happy",
        "ありがとう",
        "助かります",
    ]
)
_NEGATIVE = frozenset(
    [
        "angry",
        "terrible",
        "awful",
        "bad",
        "frustrated",
        "frustrating",
        "disappointed",
        "disappointing",
        "annoyed",
        "useless",
        "wrong",
        "broken",
        "worst",
        "complaint",
        "refund",
        "damaged",
        "late",
        "never",
        "hate",
        "最悪",
        "残念",
    ]
)
_WORD = re.compile(r"[\w']+", re.UNICODE)


def detect_sentiment(turns: Sequence[Turn]) -> str:
    """``positive``, ``negative``, ``mixed`` or ``neutral`` from the user's words (a
    lexicon: cheap, offline, and good enough to flag an unhappy customer)."""
    pos = neg = 0
    for turn in turns:
        if turn.role != "user":
            continue
        words = {w.casefold() for w in _WORD.findall(turn.text)}
        pos += len(words & _POSITIVE)
        neg += len(words & _NEGATIVE)
    if pos and neg:
        return (
            "mixed"
            if min(pos, neg) * 2 > max(pos, neg)
            else ("positive" if pos > neg else "negative")
        )
    return "positive" if pos else "negative" if neg else "neutral"


class HandoffContent(FrozenModel):
    """What a handoff writes, fixed at the prepare phase (module docstring)."""

    status: str = "prepared"
    summary: str
    topics: tuple[str, ...] = ()
    sentiment: str = "neutral"
    preferences: tuple[tuple[str, str, int], ...] = ()
    """``(key, value, turn_index)`` of each detected preference."""
    facts: dict[str, str] = Field(default_factory=dict)
    """The session's current facts and entities (slot → value), for the roll-up."""
    superseded: dict[str, list[str]] = Field(default_factory=dict)
    """Values the session itself corrected (slot → earlier values)."""
    first_turn: int = 0
    last_turn: int = -1
    started_at: UtcDatetime
    ended_at: UtcDatetime
    memory_id: str | None = None
    previous_memory_id: str | None = None
    """The summary of the session's previous handoff, which this one supersedes (the
    session was reopened: it got turns after that handoff)."""
    redacted: tuple[int, ...] = ()
    """Turns that were already redacted when the content was prepared."""
    stated_at: tuple[UtcDatetime | None, ...] = ()
    """When the turn stating each of ``preferences`` was written, in their order (None:
    the archive no longer held it). Empty in content prepared before session 16: then
    the session's end stands for it."""


class SessionHandoff:
    """The handoff of closed and expired sessions into long-term memory."""

    def __init__(
        self,
        durable: DurableStore,
        longterm: LongTermMemory,
        jobs: SummaryJobs,
        *,
        clock: Clock,
        tokens: TokenCounter,
        after: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self.durable = durable
        self.longterm = longterm
        self.jobs = jobs
        self.clock = clock
        self.tokens = tokens
        self.after = after
        """Called with the user id after a handoff is done (the roll-up); its failure is
        logged, never undoes the handoff."""
        self.handed_off = 0
        self.failures = 0

    async def __call__(self, view: SessionView) -> None:
        """Hand ``view``'s session off (idempotent: see the module docstring). A session
        handed off before and given turns since (reopened) is handed off again, whole.

        Raises:
            TierMemError: a model or backend failed; run it again (the sweeper does).
            ConflictError: the ``handoff`` record kept changing under ``MAX_ROUNDS``
                attempts (concurrent handoffs and redactions); run it again.
            NotFoundError: the record vanished under it (the session was cleared).
        """
        meta = view.metadata
        sid, user = meta.session_id, meta.user_id
        last = view.next_index - 1
        record = await self.durable.get_record(sid, HANDOFF_RECORD)
        for _ in range(MAX_ROUNDS):
            if (
                record is not None
                and record.data.get("status") == "done"
                and HandoffContent.model_validate(record.data).last_turn >= last
            ):
                return  # done through the view's last turn: nothing new
            if record is None or record.data.get("status") == "done":
                try:
                    record = await self._prepare_over(view, record)
                except ConflictError:
                    # Another handoff (or a redaction) finished it meanwhile: look again.
                    record = await self._latest(sid)
                    continue
            content = HandoffContent.model_validate(record.data)
            memory_id = await self._apply(user, sid, content)
            done = content.model_copy(update={"status": "done", "memory_id": memory_id})
            try:
                await self.durable.put_record(
                    sid,
                    HANDOFF_RECORD,
                    done.model_dump(mode="json"),
                    expected_version=record.version,
                    expires_at=self.jobs.record_expiry(),
                )
            except ConflictError:
                if await self._recheck(view, content):
                    return  # a redaction re-prepared it meanwhile: what we wrote is rebuilt
                # Another handoff finished it (our writes were repeats) or prepared it
                # again: look again.
                record = await self._latest(sid)
                continue
            self.handed_off += 1
            await self._recheck(view, content)
            if self.after is not None:
                try:
                    await self.after(user)
                except TierMemError as exc:
                    self.failures += 1
                    logger.warning("roll-up after the handoff of session %s failed: %s", sid, exc)
            if content.last_turn >= last:
                return
            # Prepared before the session got its last turns (a crash, then a reopen):
            # the next round hands the whole session off again.
            record = await self._latest(sid)
        raise ConflictError(
            f"the handoff of session {sid!r} kept changing under {MAX_ROUNDS} attempts; "
            "run it again"
        )

    async def _latest(self, sid: str) -> SessionRecord:
        """The ``handoff`` record after losing a race on it. Raises NotFoundError when it
        is gone (the session was cleared meanwhile)."""
        record = await self.durable.get_record(sid, HANDOFF_RECORD)
        if record is None:
            raise NotFoundError(
                f"the handoff record of session {sid!r} vanished during its handoff (the "
                "session was cleared?); nothing to hand off"
            )
        return record

    async def _prepare_over(
        self, view: SessionView, previous: SessionRecord | None
    ) -> SessionRecord:
        """Prepare the handoff and store it over ``previous`` (None: no handoff yet; a
        ``done`` record: the session was reopened since, and the new summary replaces the
        one it wrote). Of two handoffs preparing at once, one wins and the other continues
        with the winner's content.

        Raises:
            ConflictError: ``previous`` was replaced by something other than a prepared
                record (another handoff finished meanwhile): read it again.
        """
        sid = view.metadata.session_id
        await self._final_pass(sid, view.next_index - 1)
        content = await self._prepare(view)
        if previous is not None:
            replaced = HandoffContent.model_validate(previous.data).memory_id
            content = content.model_copy(update={"previous_memory_id": replaced})
        try:
            return await self.durable.put_record(
                sid,
                HANDOFF_RECORD,
                content.model_dump(mode="json"),
                expected_version=0 if previous is None else previous.version,
                expires_at=self.jobs.record_expiry(),
            )
        except ConflictError:
            record = await self.durable.get_record(sid, HANDOFF_RECORD)
            if record is None or record.data.get("status") != "prepared":
                raise
            return record

    async def _recheck(self, view: SessionView, content: HandoffContent) -> bool:
        """After applying ``content``: if a turn it covers was redacted since it was
        prepared (a redaction that ran while this handoff did, and found nothing to
        undo yet), undo and rebuild now. Returns whether it did."""
        sid = view.metadata.session_id
        turns = await self.durable.get_turns(sid, content.first_turn, content.last_turn + 1)
        late = [t.index for t in turns if t.redacted and t.index not in content.redacted]

        async def same_view(_: str) -> SessionView:
            return view

        for index in late:
            await self.redacted(view.metadata.user_id, sid, index, same_view)
        return bool(late)

    async def _final_pass(self, sid: str, last: int) -> None:
        """Summarize the session through its last turn before the handoff reads the
        records: the turns after the last triggered pass would otherwise never become
        summary lines, and be lost to recall when the raw turns expire (24 h). A no-op when
        the summaries already reach ``last`` (a retried handoff); a failure is logged and
        counted, and the handoff goes on (it reads the raw turns anyway). Then the
        session's summary lines are written to the recall index (passes write them only
        every few hours: :meth:`SummaryJobs.refresh_lines`)."""
        if last < 0:
            return
        try:
            await self.jobs.wait_through(sid, last)
            await self.jobs.refresh_lines(sid)
        except TierMemError as exc:
            self.failures += 1
            logger.warning("final summary pass of session %s failed: %s", sid, exc)

    async def redacted(
        self,
        user_id: str,
        session_id: str,
        index: int,
        view: Callable[[str], Awaitable[SessionView | None]],
    ) -> bool:
        """Turn ``index`` of the session was redacted: delete what long-term memory derived
        from it and hand the session off again without it (module docstring). ``view``
        reads the session from the durable tier. Returns whether anything was rebuilt.
        Run it after the summaries were reset, so that the new handoff cannot read the
        turn's content from them. Idempotent: a failed call is repaired by calling again.

        Raises:
            TierMemError: a model or backend failed; redact the turn again.
        """
        record = await self.durable.get_record(session_id, HANDOFF_RECORD)
        records = await self.longterm.list(user_id, include_superseded=True, limit=MAX_DERIVED)
        cited = [r for r in records if _cites(r, session_id, index)]
        if record is None and not cited:
            return False
        if record is not None:
            old = HandoffContent.model_validate(record.data)
            covered = old.first_turn <= index <= old.last_turn
        else:
            old, covered = None, False
        if not covered and not cited:
            return False
        doomed = {r.memory_id for r in cited if r.memory_type != "preference"}
        if covered:
            doomed |= {
                r.memory_id
                for r in records
                if r.memory_type == SUMMARY_TYPE
                and r.provenance.source == "handoff"
                and r.provenance.session_id == session_id
            }
            if old is not None and old.memory_id:
                doomed.add(old.memory_id)
        doomed |= _derived(records, doomed)
        for memory_id in sorted(doomed):
            await self.longterm.forget(user_id, memory_id)
        keys = {
            str(r.metadata["preference_key"])
            for r in cited
            if r.memory_type == "preference" and isinstance(r.metadata.get("preference_key"), str)
        }
        for key in sorted(keys):
            await self._rewrite_preference(user_id, key, session_id, index)
        if record is None or old is None:
            if doomed:
                await self._roll_up(user_id, session_id)
            return True
        current = await view(session_id)
        if current is not None:
            # Rebuild the reset summaries first (without the turn): the session's summary
            # lines stay recallable after its raw turns expire.
            await self._final_pass(session_id, current.next_index - 1)
            content = await self._prepare(current)
        else:
            # The session is gone from the durable tier: nothing to summarize again.
            content = old.model_copy(
                update={
                    "summary": "",
                    "topics": (),
                    "preferences": (),
                    "facts": {},
                    "superseded": {},
                    "memory_id": None,
                    "previous_memory_id": None,
                    "status": "prepared",
                }
            )
        await self.durable.put_record(
            session_id,
            HANDOFF_RECORD,
            content.model_dump(mode="json"),
            expected_version=record.version,
            expires_at=self.jobs.record_expiry(),
        )
        if current is not None:
            await self(current)  # applies the prepared content, then the roll-up
        else:
            done = content.model_copy(update={"status": "done"})
            latest = await self.durable.get_record(session_id, HANDOFF_RECORD)
            await self.durable.put_record(
                session_id,
                HANDOFF_RECORD,
                done.model_dump(mode="json"),
                expected_version=latest.version if latest else 0,
                expires_at=self.jobs.record_expiry(),
            )
            await self._roll_up(user_id, session_id)
        return True

    async def _roll_up(self, user_id: str, session_id: str) -> None:
        if self.after is None:
            return
        try:
            await self.after(user_id)
        except TierMemError as exc:
            self.failures += 1
            logger.warning("roll-up after redacting in session %s failed: %s", session_id, exc)

    async def _rewrite_preference(self, user_id: str, key: str, sid: str, index: int) -> None:
        """Forget preference ``key`` (slot and history), then replay, oldest first, the
        versions that do not cite turn ``index`` of session ``sid``.

        A value is set again; an ending (a favourite a dislike or the application retired:
        :func:`~tiermem.longterm.endings.is_ending`) ends the value again if that value is
        then current. So a favourite
        ended after the redacted turn stays ended, the values the turn stated are gone from
        its history too, and redacting the dislike's turn brings the value back (as
        forgetting that session does)."""
        slot = await self.longterm.get_preference(user_id, key, include_retired=True)
        if slot is None:
            return
        history = await self.longterm.preference_history(user_id, key, limit=MAX_VALUES * 10)
        # A retired slot is also the newest entry of its history: replayed once, last.
        kept = [r for r in history if r.memory_id != slot.memory_id and not _cites(r, sid, index)]
        versions = sorted(kept, key=lambda r: _int(r.metadata.get("slot_version")))
        if not _cites(slot, sid, index):
            versions.append(slot)
        await self.longterm.forget(user_id, slot.memory_id)
        for version in versions:
            raw = version.metadata.get("preference_value")
            if not isinstance(raw, str):
                continue
            if is_ending(version.metadata):
                await self._end_again(user_id, version)
                continue
            said = version.metadata.get(STATED_AT)
            await self.longterm.upsert_preference(
                user_id,
                key,
                raw,
                text=version.content,
                provenance=version.provenance,
                # A handed-off value keeps when it was said (_current_stands reads it).
                metadata={STATED_AT: said} if isinstance(said, str) else None,
            )

    async def _end_again(self, user_id: str, ending: MemoryRecord) -> None:
        """Replay ``ending`` (a retired version of a favourite): the slot is retired again
        if its value then is one the ending ended (:func:`ending_matcher`: what the
        dislike's matcher takes -- the redacted turn may have stated the value in other
        words, "Japanese", "日本語" -- or, for an explicit ending, the value itself)."""
        key = ending.metadata.get("preference_key")
        if not isinstance(key, str):
            return
        ended_by = ending.metadata.get("retired_by")
        dislike = await self.longterm.get(user_id, ended_by) if isinstance(ended_by, str) else None
        reason = ending.metadata.get(ENDED_REASON)
        if isinstance(ended_by, str) and dislike is None:
            # The dislike was forgotten since: the ending still stood, and says what it was.
            if not isinstance(reason, str):  # an ending from before session 16
                said = ending.metadata.get("preference_value")
                reason = ending.content.removeprefix(f"no longer {key}: {said} (")
                reason = reason.removesuffix(")")
            by_key = ending.metadata.get(ENDED_BY_KEY)
            dislike = ending.model_copy(
                update={
                    "memory_id": ended_by,
                    "content": reason,
                    "metadata": {"preference_key": by_key} if isinstance(by_key, str) else {},
                }
            )
        dislike_key = dislike.metadata.get("preference_key") if dislike is not None else None
        matches = ending_matcher(
            ending.metadata, dislike_key if isinstance(dislike_key, str) else None
        )
        # LongTermMemory's own retirement, so the replayed ending is written, indexed and
        # logged as the first one was.
        await self.longterm._retire_preference(
            user_id,
            key,
            matches,
            provenance=ending.provenance,
            retired_by=dislike,
            reason=reason if dislike is None and isinstance(reason, str) else None,
        )

    async def _prepare(self, view: SessionView) -> HandoffContent:
        meta = view.metadata
        sid = meta.session_id
        summaries = await self.jobs.read(sid)
        turns = await self.durable.get_turns(sid)
        structured = summaries.structured
        fresh = [t for t in turns if t.index > structured.through_index]
        if fresh:
            structured = await self.jobs.extractor.extract(fresh, prior=structured)
        target = self.jobs.policy.handoff_tokens
        context = summaries.text or None
        source = turns
        if context and sum(t.token_count for t in turns) > MAX_HANDOFF_RAW_TOKENS:
            # A long session: its rolling summaries stand for the turns they cover, so one
            # call stays within any model's window.
            done = summaries.watermarks.summarized_through
            source = [t for t in turns if t.index > done] or turns[-1:]
        if source:
            # The prior is the summary of the turns before the source (the summarizer's
            # contract): a tier of the source's own turns would give each of their lines
            # twice, once carried from the tier and once read from its turn.
            first = source[0].index
            prior = "\n".join(t.text for t in summaries.tiers if t.text and t.first_index < first)
            text = await self.jobs.summarizer.summarize(
                source, prior=prior or None, target_tokens=target
            )
            text = _unique_lines(text)
        else:
            text = cut_to_tokens(context or render_structured(structured), target, self.tokens)
        day = meta.created_at.date().isoformat()
        summary = f"Session on {day}: {text.strip()}" if text.strip() else ""
        topics: list[str] = []
        for turn in turns:
            # A redacted turn keeps its intent (Turn.redact), which its content gave: no
            # topic of the summary, nor of an observed pattern counted from it.
            if turn.intent and not turn.redacted and turn.intent not in topics:
                topics.append(turn.intent)
        for kind, fact in structured.entities.items():
            named = kind not in _NOT_TOPICS and any(c.isalpha() for c in fact.value)
            if named and fact.value not in topics:
                topics.append(fact.value)
        for slot in structured.facts:
            # Without a title catalogue the rules name few things: what was settled (the
            # budget, a favourite genre) says what the session was about.
            topic = slot.removeprefix(PREFERENCE_PREFIX).replace("_", " ")
            if topic not in topics:
                topics.append(topic)
        preferences = tuple(
            (slot.removeprefix(PREFERENCE_PREFIX), fact.value, fact.turn_index)
            for slot, fact in structured.facts.items()
            if slot.startswith(PREFERENCE_PREFIX)
        )
        written = {t.index: t.timestamp for t in turns}
        facts = {**{k: f.value for k, f in structured.entities.items()}}
        facts.update({k: f.value for k, f in structured.facts.items()})
        superseded = {
            k: list(f.previous[-MAX_VALUES:])
            for k, f in (*structured.entities.items(), *structured.facts.items())
            if f.previous
        }
        last_seen = max((t.timestamp for t in turns), default=meta.last_activity)
        return HandoffContent(
            summary=summary,
            topics=tuple(topics[:MAX_TOPICS]),
            sentiment=detect_sentiment(turns),
            preferences=preferences,
            facts=dict(list(facts.items())[:MAX_FACTS]),
            superseded=dict(list(superseded.items())[:MAX_FACTS]),
            first_turn=turns[0].index if turns else 0,
            # Through every turn the view counts (one the archive could not read is not
            # handed off again and again), and any appended since it was read.
            last_turn=max(turns[-1].index if turns else -1, view.next_index - 1),
            started_at=meta.created_at,
            ended_at=max(last_seen, meta.last_activity),
            redacted=tuple(t.index for t in turns if t.redacted),
            stated_at=tuple(written.get(turn) for _, _, turn in preferences),
        )

    async def _apply(self, user: str, sid: str, content: HandoffContent) -> str | None:
        provenance = Provenance(source="handoff", session_id=sid)
        memory_id: str | None = None
        if content.summary:
            metadata: dict[str, JsonValue] = {
                "topics": list(content.topics),
                "sentiment": content.sentiment,
                "session_started": _iso(content.started_at),
                "session_ended": _iso(content.ended_at),
                "turn_range": [content.first_turn, content.last_turn],
                "facts": dict(content.facts),
                "superseded_values": {k: list(v) for k, v in content.superseded.items()},
            }
            tags = [t[:64] for t in content.topics]
            record = None
            if content.previous_memory_id is not None:
                record = await self._supersede(
                    user, content.previous_memory_id, content.summary, tags, metadata, provenance
                )
            if record is None:
                record = await self.longterm.remember(
                    user,
                    content.summary,
                    memory_type=SUMMARY_TYPE,
                    tags=tags,
                    metadata=metadata,
                    provenance=provenance,
                    valid_from=content.ended_at,
                )
            memory_id = record.memory_id
        for at, (key, value, turn) in enumerate(content.preferences):
            stated = content.stated_at[at] if at < len(content.stated_at) else None
            try:
                # A favourite this session ended (a detected dislike) is current here too:
                # the session's own detection wins over the summary's value.
                current = await self.longterm.get_preference(user, key, include_retired=True)
                if current is not None and _current_stands(current, sid, value, stated, content):
                    continue
                await self.longterm.upsert_preference(
                    user,
                    key,
                    value,
                    provenance=provenance.model_copy(update={"turn_indexes": (turn,)}),
                    metadata={STATED_AT: _iso(stated or content.ended_at)},
                )
            except ValidationError as exc:
                # A key that cannot be an id, say: the rest of the handoff still counts.
                logger.warning("preference %r of session %s not handed off: %s", key, sid, exc)
        return memory_id

    async def _supersede(
        self,
        user: str,
        previous: str,
        summary: str,
        tags: list[str],
        metadata: dict[str, JsonValue],
        provenance: Provenance,
    ) -> MemoryRecord | None:
        """Replace the summary of the session's previous handoff by ``summary``
        (:meth:`LongTermMemory.supersede`: the old one stays in history, hidden; applied
        again after a crash, it finishes the same supersession). None when there is nothing
        to supersede (the old summary was forgotten, expired, rolled up into a digest, or
        says the same): then the summary is remembered as a new memory.

        Raises:
            ConflictError: the old summary kept changing; run the handoff again.
        """
        try:
            return await self.longterm.supersede(
                user, previous, summary, tags=tags, metadata=metadata, provenance=provenance
            )
        except NotFoundError:
            return None
        except ValidationError:
            return None  # the same content (after normalisation): remembering it merges
        except ConflictError as exc:
            if exc.actual is None:
                raise  # it kept changing, not superseded by something else
            return None


SUMMARY_TYPE = "interaction_summary"
STATED_AT = "stated_at"
"""Metadata of a preference value a handoff wrote: when the turn stating it was written."""


def _current_stands(
    current: MemoryRecord,
    sid: str,
    value: str,
    stated: datetime | None,
    content: HandoffContent,
) -> bool:
    """Whether ``current`` (the slot of a preference, retired or not) stays rather than
    session ``sid``'s handed-off ``value``, stated at ``stated`` (None: unknown; the
    session's end stands for it):

    * this session's auto-detection wrote it (or ended it): the session's own detection
      wins over its summary's value -- but a value this session's earlier handoff wrote
      gives way to the one it changed to after it was reopened;
    * it was set (or ended) after the value was stated: the newer statement wins, however
      late this handoff runs. A value a handoff wrote counts from the turn that stated it
      (``metadata["stated_at"]``), not from when that handoff ran;
    * a dislike ended this very value (compared as detection compares them) no earlier
      than it was stated (or when is unknown): the ending stands."""
    prov = current.provenance
    if prov.session_id == sid and (
        prov.source != "handoff" or current.metadata.get("preference_value") == value
    ):
        return True
    if _set_at(current) > (stated or content.ended_at):
        return True
    if not is_ending(current.metadata) or not ending_matcher(current.metadata)(value):
        return False
    ended_at = current.invalid_from or current.valid_from or current.created_at
    return stated is None or ended_at >= stated


def _set_at(record: MemoryRecord) -> datetime:
    """When ``record``'s value was said: a handoff's value when its turn was written, any
    other when it was written (a retirement: when the value was ended). ``stated_at`` of
    a value the application set is its own metadata, not ours: not read."""
    said = record.metadata.get(STATED_AT)
    if (
        isinstance(said, str)
        and record.provenance.source == "handoff"
        and not is_ending(record.metadata)
    ):
        try:
            when = datetime.fromisoformat(said)
        except ValueError:
            when = None  # not ours: fall back to the record's own time
        if when is not None and when.tzinfo is not None:
            return when
    return record.valid_from or record.created_at


def _cites(record: MemoryRecord, session_id: str, index: int) -> bool:
    """Whether ``record``'s provenance names turn ``index`` of the session (a detected
    memory or preference; a repeat also said elsewhere is left alone)."""
    prov = record.provenance
    return (
        prov.session_id == session_id
        and index in prov.turn_indexes
        and "also_from" not in record.metadata
    )


def _derived(records: Sequence[MemoryRecord], roots: set[str]) -> set[str]:
    """The summaries built, directly or not, from the memories ``roots`` (roll-up digests
    and their later versions: ``provenance.memory_ids``), and the observed patterns counted
    from them (:mod:`tiermem.summaries.patterns`). Deleted here, not left to the roll-up
    the redaction runs next: that roll-up may fail, or keep no patterns any more."""
    found: set[str] = set()
    frontier = set(roots)
    while frontier:
        step = {
            r.memory_id
            for r in records
            if (r.memory_type == SUMMARY_TYPE or PATTERN_KEY in r.metadata)
            and r.memory_id not in roots
            and r.memory_id not in found
            and frontier & set(r.provenance.memory_ids)
        }
        found |= step
        frontier = step
    return found


def _int(value: JsonValue | None) -> int:
    return value if isinstance(value, int) else 0


def _iso(value: datetime) -> str:
    return value.isoformat()


def _unique_lines(text: str) -> str:
    """``text`` with each line once (the first time): a tier that spans the source's
    first turn (the raw turns before it expired) still shares lines with the source."""
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        key = line.strip()
        if key and key in seen:
            continue
        seen.add(key)
        lines.append(line)
    return "\n".join(lines)
