"""Rolling summary tiers: hot turns → recent → middle → ancient (seed 004).

Pure planning plus one builder; no records here (the job in :mod:`tiermem.summaries.jobs`
reads and commits them).

**Tiers.** Each pass summarizes the turns since the last pass (up to ``keep_hot`` turns
before the newest, which stay raw) into a new *recent* tier; the previous recent span
becomes the *middle* tier; the previous middle and ancient spans become the *ancient*
tier. Each tier has a target size (:class:`TierTargets`, seed 004's token evolution:
recent 700, middle 500, ancient 300 tokens).

**Always from raw turns.** Every tier of a pass is summarized from the raw turns of its
span, with the newer tier's prior (the tier just older than it) as context -- never from
the text of the tier it replaces, so no summary is a summary of a summary (a verbatim
engine's ancient tier ranks its own lines again: below).

**Verbatim engines roll the ancient tier.** An engine whose every line is a sentence of a
raw turn as said, with its turn index (``verbatim = True``: the offline
:class:`~tiermem.summaries.offline.ExtractiveSummarizer`), builds the ancient tier from the
raw turns rolled into it (the previous middle span) with the previous ancient lines as
``prior``, which it ranks again with them: selecting among raw sentences again, not
summarizing a summary. So a pass reads and ranks about two passes' worth of turns whatever
the session's length, instead of every turn since the start. Any other engine (an LLM)
rebuilds the ancient tier from all its raw turns.

**When raw turns have expired** (the durable tier keeps turns 24 hours by default, the
summaries longer), a tier whose span is no longer complete in the archive is *kept*: its
text is the previous text that covered the span, unchanged, never summarized again. When
kept text exceeds the tier's target, its oldest sentences are cut (an extractive cut, so
nothing is paraphrased); structured memory, extracted from raw turns as they arrive,
keeps the facts.

**Triggers** (seed 001's critique): a pass is due when the unsummarized turns hold more
than ``trigger_tokens`` tokens (default: the smaller of 60% of the model's window and 8k)
or number ``every_turns`` (20), whichever comes first. Under token pressure the turns kept
raw shrink to what fits in half of ``trigger_tokens``, so a few huge tool outputs still
get summarized.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from tiermem.clock import Clock
from tiermem.errors import ValidationError
from tiermem.models.base import FrozenModel
from tiermem.models.turns import Turn
from tiermem.summaries._line_tokens import LineTokens
from tiermem.summaries._lru import counted
from tiermem.summaries.models import SessionSummarizer, SummaryText, SummaryTier
from tiermem.tokens import ModelSpec, TiktokenCounter, TokenCounter

__all__ = [
    "DEFAULT_TRIGGER_TOKENS",
    "TRIGGER_WINDOW_SHARE",
    "Compression",
    "RollingBuilder",
    "SummaryPolicy",
    "TierSpan",
    "TierTargets",
    "adjust_compression",
    "cut_to_tokens",
    "plan_pass",
    "plan_tiers",
    "summarized_through",
]

DEFAULT_TRIGGER_TOKENS = 8_000
"""Seed 001: "summarize when total context tokens exceed 8K"."""
TRIGGER_WINDOW_SHARE = 0.60
"""Seed 004: trigger at 60% of the model's window, not 90%."""

_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


@dataclass(frozen=True, slots=True)
class TierTargets:
    """Target size of each tier in tokens (seed 004: 700 / 500 / 300)."""

    recent: int = 700
    middle: int = 500
    ancient: int = 300

    def __post_init__(self) -> None:
        for name in ("recent", "middle", "ancient"):
            if getattr(self, name) < 16:
                raise ValidationError(f"tier target {name} must be at least 16 tokens")

    def of(self, tier: SummaryTier) -> int:
        return int(getattr(self, tier.value))


class Compression(FrozenModel):
    """The compression values in force for one session (quality-aware: see
    :func:`adjust_compression`)."""

    keep_hot: int
    """Newest turns left raw (not summarized) by a pass."""
    trigger_tokens: int
    """Unsummarized tokens that make a pass due."""
    every_turns: int
    """Unsummarized turns that make a pass due."""


@dataclass(frozen=True, slots=True)
class SummaryPolicy:
    """How and when a session is summarized.

    Quality-aware compression (seed 004): when a pass's first attempt preserved fewer than
    ``min_preservation`` of the structured slots, the session keeps ``adapt_keep_hot``
    more raw turns (up to ``max_keep_hot``) and triggers at ``adapt_trigger_factor`` times
    the tokens (up to ``max_trigger_factor`` times the base); once a pass preserves at
    least ``recover_preservation`` again, both step back toward the base values.
    ``every_turns`` does not adapt: it is at most the hot window, so no turn falls between
    the summaries and the hot window.
    """

    targets: TierTargets = field(default_factory=TierTargets)
    every_turns: int = 20
    trigger_tokens: int = DEFAULT_TRIGGER_TOKENS
    keep_hot: int = 6
    """Seed 004 keeps the last 5 turns raw ("excluding last 5"); 6 keeps 3 exchanges."""
    min_preservation: float = 0.9
    recover_preservation: float = 0.98
    adapt_keep_hot: int = 2
    max_keep_hot: int = 12
    adapt_trigger_factor: float = 1.25
    max_trigger_factor: float = 2.0
    record_retention: timedelta | None = timedelta(days=30)
    """How long summaries, structured memory and watermarks are kept (raw turns: the
    tier config's ``durable_ttl``, 24 h by default). None keeps them with the session."""
    handoff_tokens: int = 80
    """Target of the short session summary written to long-term memory at handoff."""
    validate: bool = True
    """Closed-loop validation of each pass (:mod:`tiermem.summaries.validate`)."""
    max_concurrent_passes: int = 1
    """Background passes running at once in a process (per :class:`SummaryJobs`). A pass is
    CPU work on the event loop: running more at once only interleaves them, and every
    ``add_turn`` then waits behind a stage of each. Callers waiting for a pass
    (``wait_through``, handoff) run theirs inline, not counted here."""

    def __post_init__(self) -> None:
        if self.every_turns < 1:
            raise ValidationError(f"every_turns must be >= 1, got {self.every_turns}")
        if self.trigger_tokens < 1:
            raise ValidationError(f"trigger_tokens must be >= 1, got {self.trigger_tokens}")
        if not 0 <= self.keep_hot <= self.max_keep_hot:
            raise ValidationError(
                f"need 0 <= keep_hot ({self.keep_hot}) <= max_keep_hot ({self.max_keep_hot})"
            )
        if not 0.0 <= self.min_preservation <= self.recover_preservation <= 1.0:
            raise ValidationError("need 0 <= min_preservation <= recover_preservation <= 1")
        if self.adapt_trigger_factor < 1.0 or self.max_trigger_factor < 1.0:
            raise ValidationError("trigger factors must be >= 1")
        if self.max_concurrent_passes < 1:
            raise ValidationError(
                f"max_concurrent_passes must be >= 1, got {self.max_concurrent_passes}"
            )
        if self.handoff_tokens < 16:
            raise ValidationError("handoff_tokens must be at least 16")
        if self.record_retention is not None and self.record_retention <= timedelta(0):
            raise ValidationError("record_retention must be positive, or None")

    @classmethod
    def for_model(cls, spec: ModelSpec | None, **changes: object) -> SummaryPolicy:
        """The default policy with ``trigger_tokens`` = min(60% of ``spec``'s window, 8k)."""
        tokens = DEFAULT_TRIGGER_TOKENS
        if spec is not None:
            tokens = min(int(spec.context_window * TRIGGER_WINDOW_SHARE), DEFAULT_TRIGGER_TOKENS)
        return cls(**{"trigger_tokens": tokens, **changes})  # type: ignore[arg-type]

    def base_compression(self) -> Compression:
        return Compression(
            keep_hot=self.keep_hot,
            trigger_tokens=self.trigger_tokens,
            every_turns=self.every_turns,
        )


def adjust_compression(
    current: Compression, policy: SummaryPolicy, preservation: float | None
) -> Compression:
    """The compression values after a pass whose first attempt preserved ``preservation``
    of the checked slots (None: nothing was checked; no change)."""
    if preservation is None:
        return current
    cap_tokens = int(policy.trigger_tokens * policy.max_trigger_factor)
    if preservation < policy.min_preservation:
        return current.model_copy(
            update={
                "keep_hot": min(current.keep_hot + policy.adapt_keep_hot, policy.max_keep_hot),
                "trigger_tokens": min(
                    int(current.trigger_tokens * policy.adapt_trigger_factor), cap_tokens
                ),
            }
        )
    if preservation >= policy.recover_preservation:
        return current.model_copy(
            update={
                "keep_hot": max(current.keep_hot - policy.adapt_keep_hot, policy.keep_hot),
                "trigger_tokens": max(
                    int(current.trigger_tokens / policy.adapt_trigger_factor),
                    policy.trigger_tokens,
                ),
            }
        )
    return current


def plan_pass(
    pending: Sequence[tuple[int, int]],
    summarized: int,
    compression: Compression,
    *,
    last: int | None = None,
) -> int | None:
    """The turn index a pass should summarize through, or None if none is due.

    ``pending``: ``(index, token_count)`` of the archived turns after ``summarized`` (the
    index the summaries reach; -1 for none), oldest first. ``last``: the session's last
    turn index (default: the last pending one); the turns are counted by index, so turns
    that expired before they were summarized still count.
    """
    if not pending:
        return None
    tokens = sum(t for _, t in pending)
    count = (pending[-1][0] if last is None else last) - summarized
    by_count = count >= compression.every_turns
    by_tokens = tokens > compression.trigger_tokens
    if not (by_count or by_tokens):
        return None
    keep = min(compression.keep_hot, len(pending))
    if by_tokens:
        # Keep raw only the newest turns that fit in half the trigger (at least one).
        room, fitting = compression.trigger_tokens // 2, 0
        for _, count in reversed(pending[len(pending) - keep :]):
            if count > room:
                break
            room -= count
            fitting += 1
        keep = max(1, fitting) if keep else 0
    if keep >= len(pending):
        return None
    return pending[len(pending) - 1 - keep][0]


@dataclass(frozen=True, slots=True)
class TierSpan:
    """The raw turns ``first..through`` (inclusive) one tier of a pass summarizes."""

    tier: SummaryTier
    first: int
    through: int


def summarized_through(tiers: Sequence[SummaryText]) -> int:
    """The last turn index the tiers cover (-1 for none)."""
    return max((t.through_index for t in tiers), default=-1)


def plan_tiers(current: Sequence[SummaryText], through: int) -> list[TierSpan]:
    """The tiers after a pass through ``through``, oldest first (see module docstring).

    Raises:
        ValidationError: ``through`` does not extend the current tiers.
    """
    done = summarized_through(current)
    if through <= done:
        raise ValidationError(f"a pass must go past turn {done}, got {through}")
    held = {t.tier: t for t in current}
    spans = [TierSpan(SummaryTier.RECENT, done + 1, through)]
    recent = held.get(SummaryTier.RECENT)
    if recent is not None:
        spans.insert(0, TierSpan(SummaryTier.MIDDLE, recent.first_index, recent.through_index))
    older = [held[t] for t in (SummaryTier.ANCIENT, SummaryTier.MIDDLE) if t in held]
    if older:
        first = min(t.first_index for t in older)
        last = max(t.through_index for t in older)
        spans.insert(0, TierSpan(SummaryTier.ANCIENT, first, last))
    return spans


def cut_to_tokens(text: str, target: int, counter: TokenCounter) -> str:
    """``text`` with its oldest sentences dropped until it fits ``target`` tokens (the
    newest sentence is cut by words if it alone is too long). Never paraphrases."""
    if counter.count(text) <= target:
        return text
    sentences = [s for s in _SENTENCE_END.split(text) if s.strip()]
    kept: list[str] = []
    used = 0
    for sentence in reversed(sentences):
        cost = counter.count(sentence) + 1
        if used + cost > target:
            break
        kept.insert(0, sentence)
        used += cost
    if kept:
        return " ".join(kept)
    words = text.split()
    out: list[str] = []
    for word in reversed(words):
        if counter.count(" ".join([word, *out])) > target:
            break
        out.insert(0, word)
    return " ".join(out)


TurnSource = Callable[[int, int], Awaitable[Sequence[Turn]]]
"""Reads the archived turns ``first..through`` (inclusive)."""


@dataclass
class BuiltTier:
    """One tier a pass produced, and how."""

    text: SummaryText
    span: TierSpan
    from_raw: bool
    """False when the span's raw turns had expired and older text was kept."""
    raw_tokens: int = 0
    rolled: bool = False
    """An ancient tier a verbatim engine re-ranked from its own lines and the raw turns
    rolled into it (:meth:`RollingBuilder.build`); its ``raw_tokens`` are those turns'."""


class RollingBuilder:
    """Builds the tiers of one pass from raw turns (see the module docstring)."""

    def __init__(
        self,
        summarizer: SessionSummarizer,
        *,
        targets: TierTargets,
        counter: TokenCounter,
        clock: Clock,
        turns: TurnSource,
    ) -> None:
        self.summarizer = summarizer
        self.targets = targets
        self.counter = counter
        self.clock = clock
        self._turns = turns
        self._cache: dict[tuple[int, int], Sequence[Turn]] = {}
        self.verbatim = getattr(summarizer, "verbatim", False) is True
        """The engine's lines are sentences of raw turns as said, with their turn indexes
        (:class:`~tiermem.summaries.offline.ExtractiveSummarizer`)."""
        self._lines = (
            summarizer
            if isinstance(summarizer, LineTokens)
            and (
                summarizer.counter is counter
                or type(summarizer.counter) is type(counter) is TiktokenCounter
            )
            else None
        )
        """The engine's own line counts, when it counts as this builder's counter does
        (the same counter, or both the project's tiktoken counter: one encoding): a text
        validation rewrites is counted from its lines (:meth:`retexted`)."""

    async def raw(self, first: int, through: int) -> Sequence[Turn]:
        key = (first, through)
        if key not in self._cache:
            self._cache[key] = await self._turns(first, through)
        return self._cache[key]

    async def build(
        self,
        spans: Sequence[TierSpan],
        previous: Sequence[SummaryText],
        *,
        must_keep: Mapping[SummaryTier, Sequence[str]] | None = None,
        reuse: Mapping[SummaryTier, BuiltTier] | None = None,
    ) -> list[BuiltTier]:
        """Each span's tier, oldest first; the tier just older is the prior of the next.
        ``reuse`` keeps tiers already built in this pass (validation re-runs only the
        tiers that lost something). Yields to the event loop before each tier it builds,
        so a turn waits behind one tier's work at most, not a whole pass's."""
        built: list[BuiltTier] = []
        prior: str | None = None
        for span in spans:
            done = (reuse or {}).get(span.tier)
            if done is None:
                # One tier is one stage of CPU work: let the turns waiting run first.
                await asyncio.sleep(0)
                keep = (must_keep or {}).get(span.tier, ())
                done = await self._tier(span, previous, prior, keep)
            built.append(done)
            prior = done.text.text or prior
        return built

    def rolled_into(
        self, span: TierSpan, previous: Sequence[SummaryText]
    ) -> tuple[SummaryText, int, int] | None:
        """For a verbatim engine, the ancient tier ``span`` as the previous ancient tier
        plus the raw turns ``first..through`` of the previous middle tier rolled into it;
        None when the tier is built from all its raw turns (see the module docstring)."""
        if span.tier is not SummaryTier.ANCIENT or not self.verbatim:
            return None
        held = {t.tier: t for t in previous}
        ancient, middle = held.get(SummaryTier.ANCIENT), held.get(SummaryTier.MIDDLE)
        if ancient is None or middle is None or ancient.engine != self.summarizer.name:
            return None
        if (ancient.first_index, middle.through_index) != (span.first, span.through):
            return None
        if middle.first_index != ancient.through_index + 1:
            return None
        return ancient, middle.first_index, middle.through_index

    def first_needed(self, spans: Sequence[TierSpan], previous: Sequence[SummaryText]) -> int:
        """The first raw turn the pass's tiers are built from (one archive read)."""
        firsts = []
        for span in spans:
            rolled = self.rolled_into(span, previous)
            firsts.append(span.first if rolled is None else rolled[1])
        return min(firsts)

    async def _tier(
        self,
        span: TierSpan,
        previous: Sequence[SummaryText],
        prior: str | None,
        must_keep: Sequence[str],
    ) -> BuiltTier:
        target = self.targets.of(span.tier)
        rolled = self.rolled_into(span, previous)
        if rolled is not None:
            old, first, through = rolled
            turns = await self.raw(first, through)
            if len(turns) == through - first + 1:
                # The old ancient lines are verbatim sentences of raw turns, each with its
                # turn index: ranked again with the rolled-in turns, never reworded.
                text = await self.summarizer.summarize(
                    turns, prior=old.text, target_tokens=target, must_keep=tuple(must_keep)
                )
                return BuiltTier(
                    self._text(span, text, engine=self.summarizer.name),
                    span,
                    from_raw=True,
                    raw_tokens=self._raw_tokens(turns),
                    rolled=True,
                )
        turns = await self.raw(span.first, span.through)
        complete = len(turns) == span.through - span.first + 1
        covering = [
            p for p in previous if p.first_index >= span.first and p.through_index <= span.through
        ]
        if not complete and covering:
            text = cut_to_tokens(" ".join(p.text for p in covering), target, self.counter)
            return BuiltTier(self._text(span, text, engine="kept"), span, from_raw=False)
        text = await self.summarizer.summarize(
            turns, prior=prior, target_tokens=target, must_keep=tuple(must_keep)
        )
        return BuiltTier(
            self._text(span, text, engine=self.summarizer.name),
            span,
            from_raw=True,
            raw_tokens=self._raw_tokens(turns),
        )

    def _raw_tokens(self, turns: Sequence[Turn]) -> int:
        return sum(t.token_count or self.counter.count(t.text) for t in turns)

    def _text(self, span: TierSpan, text: str, *, engine: str) -> SummaryText:
        return SummaryText(
            tier=span.tier,
            text=text,
            tokens=counted(self.counter, text),
            first_index=span.first,
            through_index=span.through,
            created_at=self.clock.now(),
            engine=engine,
        )

    def appended(self, tier: BuiltTier, items: Sequence[str]) -> BuiltTier:
        """``tier`` with ``items`` appended verbatim (validation's last resort)."""
        if not items:
            return tier
        text = tier.text.text.rstrip()
        text = f"{text}\nAlso: " if text else "Also: "
        text += "; ".join(items) + "."
        return self.retexted(tier, text)

    def retexted(self, tier: BuiltTier, text: str) -> BuiltTier:
        """``tier`` with its text replaced (and counted again)."""
        if text == tier.text.text:
            return tier
        lines = self._lines
        tokens = counted(self.counter, text) if lines is None else lines.count_text(text)
        summary = tier.text.model_copy(update={"text": text, "tokens": tokens})
        return replace(tier, text=summary)
