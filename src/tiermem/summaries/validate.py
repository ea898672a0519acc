"""Closed-loop validation of a summarization pass (seed 001's critique).

The structured slots -- active entities, facts, key decisions and unresolved intentions --
are checked against the text of every tier after a pass. Each slot is checked against the
tiers as a whole (a fact said at turn 3 lives in the ancient tier), and only slots of turns
the pass summarized (turns kept raw are in the context anyway). Then:

0. sentences that present a superseded value (of a fact or an entity kind) as current are
   dropped from every tier, whichever pass built it (:func:`drop_stale`: an older tier
   cannot know a later correction);
1. nothing lost: done;
2. lost slots: the tiers that should hold them (the tier whose span has the slot's turn)
   are summarized again from their raw turns, once, with the lost items as ``must_keep``
   (each as a readable line, :attr:`SlotItem.line`: ``budget: ¥8,000``, never a bare
   value);
3. still lost: the items' lines are appended to their tier verbatim (``Also: ...``), so
   the next inference can still see them.

Each pass records, in the summary record and in the service's stats:

* ``fact_preservation_first``: share of checked slots the first attempt kept (this is
  what quality-aware compression reacts to: the final text always keeps them all);
* ``fact_preservation``: share kept by the final text (1.0 unless no fallback was possible);
* ``entity_drift``: share of the current entity values the previous summary mentioned that
  the new first attempt no longer mentions (names aggregated into "various titles", or
  lost across passes);
* ``compression_ratio``: summary tokens / raw tokens of the tiers built from raw turns.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from tiermem.extraction.entities import DEFAULT_READER, RuleEntityExtractor
from tiermem.longterm.detect import split_sentences
from tiermem.models.base import FrozenModel
from tiermem.summaries._lru import INLINE_KEY, Lru, text_key
from tiermem.summaries.models import StructuredMemory, SummaryText, SummaryTier
from tiermem.summaries.rolling import BuiltTier, RollingBuilder, TierSpan
from tiermem.summaries.structured import (
    ProbeSet,
    SaidIn,
    ValueProbe,
    same_value,
    slot_statement,
    stated_in,
    states_value,
    value_probe,
    whole_key,
)

__all__ = [
    "OPINION_PREFIX",
    "PassQuality",
    "SlotItem",
    "drop_stale",
    "lost_slots",
    "mentions",
    "opinion_item",
    "slot_items",
    "validated_pass",
]

ITEM_WORD_SHARE = 0.6
"""A decision or intention counts as kept when this share of its content words appear in
the summary (the model may rephrase a sentence; it may not drop its substance). Entity and
fact values must appear as the same value (:func:`~tiermem.summaries.structured.states_value`:
"¥8,000" is found as "8000円", never inside "¥18,000")."""

_WORD = re.compile(r"[\w$¥€£%.,:/-]+", re.UNICODE)
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "to",
        "of",
        "and",
        "or",
        "for",
        "in",
        "on",
        "at",
        "is",
        "are",
        "was",
        "were",
        "be",
        "i",
        "you",
        "we",
        "it",
        "this",
        "that",
        "my",
        "me",
        "with",
        "want",
        "wants",
        "would",
        "like",
        "please",
        "can",
        "could",
        "should",
        "will",
    ]
)


class PassQuality(FrozenModel):
    """Quality of one pass (module docstring)."""

    checked: int = 0
    lost_first: tuple[str, ...] = ()
    retried_tiers: tuple[str, ...] = ()
    appended: tuple[str, ...] = ()
    fact_preservation_first: float | None = None
    fact_preservation: float | None = None
    entity_drift: float | None = None
    compression_ratio: float | None = None
    raw_tokens: int = 0
    summary_tokens: int = 0
    kept_tiers: tuple[str, ...] = ()
    """Tiers kept as they were because their raw turns had expired."""
    stale_dropped: int = 0
    """Sentences dropped for presenting a superseded fact value as current."""


@dataclass(frozen=True, slots=True)
class SlotItem:
    """One structured slot to find in a summary."""

    kind: str
    """``entity``, ``fact``, ``decision`` or ``unresolved``."""
    slot: str | None
    """The entity kind or fact slot (None for decisions and intentions)."""
    text: str
    """What must appear: a value as written, or a decision's / intention's sentence (an
    opinion's subject, :func:`slot_items`)."""
    turn_index: int
    exact: bool
    """Values must appear as written; sentences by :data:`ITEM_WORD_SHARE` of their words."""
    said: str = ""
    """How a summary says the item when ``text`` alone would not read as it (an opinion:
    "User loves seinen."); "" for the others (:attr:`line`)."""

    @property
    def line(self) -> str:
        """The item as a readable line: what a retry's ``must_keep`` asks for, what a last
        resort appends and what the pass's quality lists. Never a bare value: a slot is
        ``slot: value`` (:func:`~tiermem.summaries.structured.slot_statement`, which the
        offline summarizer reads back as a statement of that slot), an opinion a sentence,
        a decision or an intention its own sentence."""
        if self.said:
            return self.said
        if self.slot is not None and self.kind in ("entity", "fact"):
            return slot_statement(self.slot, self.text)
        return self.text


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _words(text: str) -> frozenset[str]:
    """The content words of ``text``; kept (LRU): a pass asks them of one summary text
    once per item."""
    return _WORDS.get(whole_key(text), partial(_words_by_line, text))


def _words_by_line(text: str) -> frozenset[str]:
    """:func:`_read_words` of ``text`` as the union of its lines' (each kept: a pass's
    summary is mostly the previous pass's lines). The same set: a newline neither
    composes nor reorders with its neighbours under NFKC, case folding is per character,
    and a word never holds whitespace, so no word spans two lines."""
    lines = text.split("\n")
    if len(lines) == 1:
        return _read_words(text)
    words: set[str] = set()
    held = _LINE_WORDS.held
    for line in lines:
        key = line if len(line) <= INLINE_KEY else text_key(line)
        said = held(key)  # most are: no partial made for a hit
        if said is None:
            said = _LINE_WORDS.get(key, partial(_read_words, line))
        words.update(said)
    return frozenset(words)


def _read_words(text: str) -> frozenset[str]:
    return frozenset({w.strip(".,:") for w in _WORD.findall(_norm(text))} - _STOP - {""})


_WORDS: Lru[str | bytes, frozenset[str]] = Lru(4_096, max_chars=4_000_000, weigh=len)
_LINE_WORDS: Lru[str | bytes, frozenset[str]] = Lru(16_384, max_chars=4_000_000, weigh=len)


def mentions(summary: str, item: SlotItem) -> bool:
    """Whether ``summary`` states ``item`` (module rules)."""
    if item.exact:
        return states_value(summary, item.text, slot=item.slot)
    wanted = _words(item.text)
    if not wanted:
        return True
    return len(wanted & _words(summary)) / len(wanted) >= ITEM_WORD_SHARE


def slot_items(structured: StructuredMemory, through: int) -> list[SlotItem]:
    """The slots said at or before turn ``through``: current entity and fact values,
    decisions and unresolved intentions (goals are not checked: seed 001's slot list).

    A slot is checked as a summary would state it. Most values are what was said ("my
    budget is ¥8,000" keeps ``¥8,000``); an opinion's value is its sentiment ("I love
    seinen" is ``preference:opinion:genre:seinen`` = ``loves``), a word no summary needs
    to write, so an opinion is checked by its subject (:func:`opinion_item`)."""
    items: list[SlotItem] = []
    for kind, slots in (("entity", structured.entities), ("fact", structured.facts)):
        for slot, fact in slots.items():
            if fact.turn_index <= through and fact.value.strip():
                if slot.startswith(OPINION_PREFIX):
                    items.append(opinion_item(slot, fact.value, fact.turn_index))
                else:
                    items.append(SlotItem(kind, slot, fact.value, fact.turn_index, exact=True))
    for kind, group in (("decision", structured.decisions), ("unresolved", structured.unresolved)):
        for item in group:
            if item.turn_index <= through and item.text.strip():
                items.append(SlotItem(kind, None, item.text, item.turn_index, exact=False))
    return items


OPINION_PREFIX = "preference:opinion:"
"""The slot prefix of an opinion (:mod:`tiermem.longterm.detect`'s ``opinion:<kind>:<value>``
and ``opinion:<slug>`` keys, as preferences)."""


def opinion_item(slot: str, sentiment: str, turn_index: int) -> SlotItem:
    """The item of an opinion slot: its subject must appear, as the same entity for
    ``opinion:<kind>:<value>`` (seinen as the genre, in any spelling the entity rules
    read), else by its words (the slug's; as written when it is not ASCII, which the word
    rule cannot split). The sentiment is not checked: "I love seinen", "loves seinen" and
    "a big fan of seinen" all say it in words no rule lists; a superseded one is what
    :func:`drop_stale` removes."""
    subject, check_slot = _opinion_subject(slot)
    exact = check_slot is not None or not subject.isascii()
    said = f"User {sentiment} {subject}."
    return SlotItem("fact", check_slot, subject, turn_index, exact=exact, said=said)


def _opinion_subject(slot: str) -> tuple[str, str | None]:
    """What an opinion slot is about, readable ("seinen", "japanese editions"), and the
    entity kind it is when the key names one (``opinion:genre:seinen``)."""
    topic = slot[len(OPINION_PREFIX) :]
    kind, colon, value = topic.partition(":")
    if colon and value:
        return value.replace("_", " "), kind
    return topic.replace("_", " "), None


def lost_slots(summary: str, items: Sequence[SlotItem]) -> list[SlotItem]:
    """The items ``summary`` does not state: values by
    :func:`~tiermem.summaries.structured.states_value` (the rule
    :func:`~tiermem.summaries.quality.lost_items` and quality measurements use), decisions
    and intentions by their words (:func:`mentions`)."""
    return _lost(stated_in(summary), summary, items)


def _lost(
    stated: Callable[[str, str | None], bool], summary: str, items: Sequence[SlotItem]
) -> list[SlotItem]:
    """:func:`lost_slots` with ``stated`` = ``stated_in(summary)`` already made (a pass
    asks it of one text for its slots and for the drift)."""
    words: frozenset[str] | None = None
    lost = []
    for item in items:
        if item.exact:
            if not stated(item.text, item.slot):
                lost.append(item)
            continue
        wanted = _words(item.text)
        if not wanted:
            continue
        if words is None:
            words = _words(summary)
        if len(wanted & words) / len(wanted) < ITEM_WORD_SHARE:
            lost.append(item)
    return lost


def drop_stale(
    text: str, structured: StructuredMemory, *, extractor: RuleEntityExtractor | None = None
) -> tuple[str, int]:
    """``text`` without the sentences that present a superseded value as current (a
    sentence stating an earlier value of a slot -- a fact or an entity kind -- and not its
    latest one), and how many were dropped. Sentences are deleted, never reworded.
    ``extractor`` (with a title catalogue) finds a series by any of its names.

    A tier summarizes its own span, so an older tier cannot know a later correction ("my
    budget is ¥5,000" in ancient, "actually ¥8,000" in recent; "I'm reading Berserk" in
    ancient, then "make it Blame!"): this is where the pass makes the whole of its tiers
    agree with structured memory, whichever pass built each tier. Entity kinds count too:
    structured memory records an entity's earlier value only when the user replaced it, and
    a sentence naming the replaced series or ASIN alone reads as the current one."""
    values = _stale_values(structured)
    if values is None or not text:
        return text, 0
    reader = extractor or DEFAULT_READER
    verdicts = _LINE_VERDICTS.get(reader)
    if verdicts is None:
        verdicts = _LINE_VERDICTS[reader] = Lru(16_384, max_chars=8_000_000, weigh=_verdict_chars)
    dropped = 0
    lines: list[str] = []
    stale_key = values.key
    held = verdicts.held
    for line in text.splitlines():
        # A line's verdict depends only on it and the stale values: kept across passes.
        line_key = line if len(line) <= INLINE_KEY else text_key(line)
        key = (line_key, stale_key)
        verdict = held(key)
        if verdict is None:
            sentences = _SENTENCES.get(line_key, partial(_split, line))
            verdict = verdicts.get(key, partial(_verdict, sentences, values.probes(), reader))
        count, kept = verdict
        if len(kept) == count:
            lines.append(line)
            continue
        dropped += count - len(kept)
        if kept:
            lines.append(" ".join(s.strip() for s in kept))
    return "\n".join(lines), dropped


@dataclass(frozen=True, slots=True)
class _StaleValues:
    """The superseded values of one structured memory, for :func:`drop_stale`: ``key``
    names them (one string: its hash is computed once, where a tuple's is computed at
    every lookup of every line's verdict); their probes are worked out when a line first
    needs them."""

    stale: tuple[tuple[str, str, str], ...]
    """``(slot, earlier value, latest value)``."""
    key: str
    _probes: list[tuple[ProbeSet, tuple[ValueProbe, ...]]]

    def probes(self) -> tuple[ProbeSet, tuple[ValueProbe, ...]]:
        """The earlier values' probes, and the latest values' (in ``stale``'s order)."""
        if not self._probes:
            self._probes[:] = [
                (
                    ProbeSet([value_probe(old, slot=slot) for slot, old, _ in self.stale]),
                    tuple(value_probe(new, slot=slot) for slot, _, new in self.stale),
                )
            ]
        return self._probes[0]


_LAST_STALE: list[tuple[StructuredMemory, _StaleValues | None]] = []
"""The structured memory :func:`_stale_values` last read, and its values: a pass asks
them of each of its tiers (and again after a retry), with the same structured memory."""


_LAST_FACTS: list[dict[tuple[str, str, tuple[str, ...]], tuple[tuple[str, str, str], ...]]] = []
"""The stale triples of each slot of the structured memory :func:`_stale_values` last
read, by ``(slot, value, previous)`` (one memory's slots: replaced at every read): the
next pass's memory has mostly the same slots (its extraction sets few), so only the others
are compared value by value."""


def _stale_values(structured: StructuredMemory) -> _StaleValues | None:
    """The values ``structured`` records as superseded by a different latest value (None:
    none). Kept for the last structured memory asked (by identity: it is frozen); when the
    values are those of the last one, its :class:`_StaleValues` (with its probes, worked
    out already) is the answer again."""
    last = _LAST_STALE[-1] if _LAST_STALE else None
    if last is not None and last[0] is structured:
        return last[1]
    known = _LAST_FACTS[-1] if _LAST_FACTS else {}
    slots_read: dict[tuple[str, str, tuple[str, ...]], tuple[tuple[str, str, str], ...]] = {}
    stale: list[tuple[str, str, str]] = []
    for slots in (structured.facts, structured.entities):
        for slot, fact in slots.items():
            if not fact.previous:
                continue
            slot_key = (slot, fact.value, fact.previous)
            triples = known.get(slot_key)
            if triples is None:
                # ``same_value`` is pure: a slot with the same value and earlier values
                # has the same stale triples.
                triples = tuple(
                    (slot, old, fact.value)
                    for old in fact.previous
                    if old.strip() and not same_value(old, fact.value, slot=slot)
                )
                if triples and slot.startswith(OPINION_PREFIX):
                    # An opinion's value is a sentiment: "loves" alone would make every
                    # sentence that loves anything stale. A stale opinion is its
                    # sentiment about its subject ("loves seinen", as an appended line).
                    subject = _opinion_subject(slot)[0]
                    triples = tuple(
                        (slot, f"{old} {subject}", f"{new} {subject}") for _, old, new in triples
                    )
            slots_read[slot_key] = triples
            stale += triples
    _LAST_FACTS[:] = [slots_read]
    values: _StaleValues | None = None
    if stale:
        before = last[1] if last is not None else None
        if before is not None and before.stale == tuple(stale):
            values = before  # the same values: its key and probes are still right
        else:
            triples = tuple(stale)
            key = "\x1e".join("\x1f".join(triple) for triple in triples)
            values = _StaleValues(triples, key, [])
    _LAST_STALE[:] = [(structured, values)]
    return values


def _verdict(
    sentences: tuple[str, ...],
    stale: tuple[ProbeSet, tuple[ValueProbe, ...]],
    reader: RuleEntityExtractor,
) -> tuple[int, tuple[str, ...]]:
    """A line's verdict: how many sentences it has, then those that state no superseded
    value (``stale``: the earlier values' probes, then the latest values') without the
    latest value of its slot."""
    earlier, latest = stale
    kept = []
    for sentence in sentences:
        said = SaidIn(sentence, reader)
        if not any(not said.states(latest[at]) for at in earlier.stated_by(said)):
            kept.append(sentence)
    return len(sentences), tuple(kept)


def _verdict_chars(verdict: tuple[int, tuple[str, ...]]) -> int:
    return 16 + sum(map(len, verdict[1]))


def _split(line: str) -> tuple[str, ...]:
    return tuple(split_sentences(line))


def _chars(sentences: tuple[str, ...]) -> int:
    return 16 + sum(map(len, sentences))


_SENTENCES: Lru[str | bytes, tuple[str, ...]] = Lru(16_384, max_chars=8_000_000, weigh=_chars)
"""Sentences of summary lines (a pass's tiers are mostly the previous pass's lines)."""
_LINE_VERDICTS: weakref.WeakKeyDictionary[
    RuleEntityExtractor,
    Lru[tuple[str | bytes, str], tuple[int, tuple[str, ...]]],
] = weakref.WeakKeyDictionary()
"""The verdicts of lines (:func:`_verdict`: the sentences :func:`drop_stale` keeps of a
line), by line and stale values (:attr:`_StaleValues.key`), per entity reader (its title
catalogue decides what names a series)."""


def _tier_of(spans: Sequence[TierSpan], turn_index: int) -> SummaryTier | None:
    for span in spans:
        if span.first <= turn_index <= span.through:
            return span.tier
    return None


def _joined(tiers: Sequence[BuiltTier]) -> str:
    return "\n".join(t.text.text for t in tiers)


def _drift(
    previous_text: str | None,
    first_text: str,
    first_stated: Callable[[str, str | None], bool],
    structured: StructuredMemory,
) -> float | None:
    """Share of the entity values ``previous_text`` states that ``first_text`` does not
    (``first_stated``: its :func:`stated_in`). Each text is read once for every value."""
    if not previous_text or not structured.entities:
        return None
    previous = stated_in(previous_text)
    before = [
        SlotItem("entity", k, f.value, f.turn_index, exact=True)
        for k, f in structured.entities.items()
        if previous(f.value, k)
    ]
    if not before:
        return None
    return len(_lost(first_stated, first_text, before)) / len(before)


async def validated_pass(
    builder: RollingBuilder,
    spans: Sequence[TierSpan],
    previous: Sequence[SummaryText],
    structured: StructuredMemory,
    *,
    check: bool = True,
    extractor: RuleEntityExtractor | None = None,
) -> tuple[list[BuiltTier], PassQuality]:
    """Build the tiers of a pass, check them against ``structured``, retry once with
    ``must_keep``, then append what is still lost (module docstring). ``previous``: the
    tiers before the pass (fallback text for expired spans, and the drift baseline).
    ``extractor``: the entity reader of the structured extractor (its title catalogue), so
    a superseded series is found by any of its names.

    Yields to the event loop between its stages (each tier's build, the check, the retry,
    the verbatim appends), so the response path never waits behind a whole pass."""
    prev = list(previous)
    built = await builder.build(spans, prev)
    await asyncio.sleep(0)
    cleaned: dict[str, tuple[str, int]] = {}
    first, stale = _without_stale(builder, built, structured, extractor, cleaned)
    through = max(s.through for s in spans)
    items = slot_items(structured, through) if check else []
    first_text = _joined(first)
    first_stated = stated_in(first_text)
    lost = _lost(first_stated, first_text, items)
    previous_text = "\n".join(p.text for p in prev) or None
    drift = _drift(previous_text, first_text, first_stated, structured)
    final = first
    retried: list[str] = []
    appended: list[str] = []
    if lost:
        by_tier: dict[SummaryTier, list[str]] = {}
        for item in lost:
            tier = _tier_of(spans, item.turn_index)
            if tier is not None:
                by_tier.setdefault(tier, []).append(item.line)
        retry = {t: keep for t, keep in by_tier.items() if _raw(first, t)}
        if retry:
            reuse = {b.span.tier: b for b in first if b.span.tier not in retry}
            rebuilt = await builder.build(spans, prev, must_keep=retry, reuse=reuse)
            final, more = _without_stale(builder, rebuilt, structured, extractor, cleaned)
            stale += more
            retried = [t.value for t in retry]
            await asyncio.sleep(0)
        still = lost if final is first else lost_slots(_joined(final), lost)
        if still:
            final = _append(builder, final, spans, still)
            appended = [i.line for i in still]
    # The first attempt's text, unchanged, lost what it lost: no need to read it again.
    lost_final = lost if final is first else lost_slots(_joined(final), items)
    kept_after = len(items) - len(lost_final)
    # A rolled ancient tier read only the turns rolled into it: the ratio is of the tiers
    # built from all their raw turns.
    built_raw = [b for b in final if b.from_raw and not b.rolled]
    raw_tokens = sum(b.raw_tokens for b in built_raw)
    summary_tokens = sum(b.text.tokens for b in built_raw)
    quality = PassQuality(
        checked=len(items),
        lost_first=tuple(i.line for i in lost),
        retried_tiers=tuple(retried),
        appended=tuple(appended),
        fact_preservation_first=(len(items) - len(lost)) / len(items) if items else None,
        fact_preservation=kept_after / len(items) if items else None,
        entity_drift=drift,
        compression_ratio=summary_tokens / raw_tokens if raw_tokens else None,
        raw_tokens=raw_tokens,
        summary_tokens=summary_tokens,
        kept_tiers=tuple(b.span.tier.value for b in final if not b.from_raw),
        stale_dropped=stale,
    )
    return final, quality


def _without_stale(
    builder: RollingBuilder,
    tiers: Sequence[BuiltTier],
    structured: StructuredMemory,
    extractor: RuleEntityExtractor | None,
    cleaned: dict[str, tuple[str, int]],
) -> tuple[list[BuiltTier], int]:
    """Every tier of the pass (rebuilt, rolled or kept) without its stale sentences.
    ``cleaned``: :func:`drop_stale` of the texts this pass has cleaned already (a retry
    rebuilds some tiers; the others come back as the first attempt cleaned them, most
    often with nothing dropped, so as the same text)."""
    out: list[BuiltTier] = []
    dropped = 0
    for tier in tiers:
        text = tier.text.text
        held = cleaned.get(text)
        if held is None:
            held = cleaned[text] = drop_stale(text, structured, extractor=extractor)
        text, count = held
        out.append(builder.retexted(tier, text))
        dropped += count
    return out, dropped


def _raw(tiers: Sequence[BuiltTier], tier: SummaryTier) -> bool:
    return any(b.span.tier is tier and b.from_raw for b in tiers)


def _append(
    builder: RollingBuilder,
    tiers: Sequence[BuiltTier],
    spans: Sequence[TierSpan],
    still: Sequence[SlotItem],
) -> list[BuiltTier]:
    by_tier: dict[SummaryTier, list[str]] = {}
    newest = spans[-1].tier
    for item in still:
        by_tier.setdefault(_tier_of(spans, item.turn_index) or newest, []).append(item.line)
    return [builder.appended(b, by_tier.get(b.span.tier, ())) for b in tiers]
