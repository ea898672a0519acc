"""The offline structured extractor: structured memory from raw turns, with rules.

:class:`RuleStructuredExtractor` reads each sentence of each turn with the entity rules of
:mod:`tiermem.extraction.entities`, the detection rules of :mod:`tiermem.longterm.detect`
and the slot rules of :mod:`tiermem.longterm._detect_rules`, and keeps the latest value of
each slot. What it reads:

=====================  =========================================  ==========================
slot                   said                                       kept as
=====================  =========================================  ==========================
entity kinds           "Is Berserk vol 42 in stock?",             ``entities``: ``series``,
                       "order ORD-48213", "B0C4X7K2PQ",           ``volume``, ``order_id``,
                       "ISBN 978-4-08-851234-1", "¥990"           ``asin``, ``isbn``,
                                                                  ``price``, ``date`` …
                                                                  (canonical entity value)
``<noun>``             "my postcode is 150-0001", "our team       ``facts[noun]``, as said
                       size is 12", "予算は8000円です"
``budget``             "my budget is ¥5,000", "I can spend up     ``facts["budget"]``
                       to ¥5,000", "keep it under ¥5,000"
``delivery_date``      "I need it delivered by 2026-03-14"        ``facts``
``location``           "I live in Osaka", "I'm based in Lisbon"   ``facts``
``name`` …             "my name is Ken Sato", "call me Ken",      ``facts["name"]``,
``preference:<key>``   "my favorite genre is seinen", "I prefer   ``facts["preference:
                       Japanese editions" (the detection rules)   favorite_genre"]`` …
decisions              "I'll take vol 3", "we decided to go with  ``decisions``
                       the hardcover", "put it in my cart"
goals                  "I'm looking for a gift", "I want to…"     ``goals``
unresolved             "I'll think about it", "remind me…",       ``unresolved``
                       "let me check with my wife first",
                       "notify me when it's restocked", and
                       requests asked as questions ("can you
                       let me know when vol 43 is back?");
                       assistant: "I'll check and get back…"
=====================  =========================================  ==========================

Rules that keep the memory honest:

* **Latest wins.** A new value of a slot replaces the old one, which moves to ``previous``;
  a correction's wrong value ("actually my budget is ¥8,000, not ¥5,000"; "3巻じゃなくて4巻")
  is never taken as a value.
* **Validated ids.** A noun that names an entity kind ("my ASIN is …", "my order number is
  …") takes only a well-formed entity of that kind: "B07-1234" or an ISBN with a bad check
  digit is rejected, not stored (the entity rules validate; nothing else matches).
* **Whose statement.** Slots are read from what the user wrote, in text blocks: not from
  tool results (a search listing holds forty ASINs that are nobody's choice), not from the
  assistant (its suggestions are not the user's values), not from quoted lines ("> …" of a
  pasted email), statements about someone else ("my friend's order is …", "another
  customer's …") or hypotheticals ("if my budget were …"). Facts are not read from
  questions; entities are ("is vol 42 in stock?" makes vol 42 active).
* **Explicit switch.** "Forget that, show me Naruto" expires the active product entities
  (series, volume, ASIN, ISBN, price) before the sentence's own are set (seed 001).

Items (decisions, goals, unresolved intentions) are kept as said, the newest
``max_items`` of each. An intention is not marked resolved by a later turn: telling that
takes understanding the rules do not have.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from tiermem.errors import ValidationError
from tiermem.extraction.entities import DEFAULT_READER, RuleEntityExtractor
from tiermem.longterm import _detect_rules as rules
from tiermem.longterm.detect import (
    RuleMemoryDetector,
    SentenceSignals,
    clean_object,
    favorite_key,
    is_question,
    read_sentences,
    split_sentences,
)
from tiermem.models.content import TextBlock
from tiermem.models.turns import Turn
from tiermem.policies.phrases import TextView, normal_form
from tiermem.policies.turn_text import rule_window
from tiermem.summaries._lru import INLINE_KEY, Lru, text_key
from tiermem.summaries.models import Fact, Item, StructuredMemory
from tiermem.text_caches import track_table

__all__ = [
    "ENTITY_SLOTS",
    "SUBJECT_SLOTS",
    "ProbeSet",
    "RuleStructuredExtractor",
    "SaidIn",
    "SentenceReading",
    "SlotValue",
    "ValueProbe",
    "readable_value",
    "render_structured",
    "same_value",
    "slot_statement",
    "stated_in",
    "states_value",
    "turn_said",
    "value_key",
    "value_probe",
    "wrong_regions",
]

logger = logging.getLogger(__name__)

ENTITY_SLOTS: Mapping[str, str] = {"money": "price"}
"""Entity kinds kept under another slot name (a money amount is a ``price``); every other
kind is its own slot."""
_SLOT_KINDS = {"price": "money"}
_ENTITY_KINDS = frozenset(
    {"order_id", "asin", "isbn", "email", "money", "date", "volume", "language", "genre", "series"}
)
SUBJECT_SLOTS = frozenset({"series", "volume", "asin", "isbn", "price"})
"""The active entities an explicit switch of subject expires."""
# Kinds whose canonical value is a name or an id that can be found as written; a volume
# ("3"), an amount or a date can only be found as an entity.
_NAMED_KINDS = frozenset({"series", "language", "genre", "email", "order_id", "asin", "isbn"})
_DIGIT_COMMA = re.compile(r"(?<=[0-9]),(?=[0-9]{3})")
_COMMA_MASK = "\x00"
_SPACES = re.compile(r"\s+")
READ_CACHE = 16_384
"""Texts whose sentence readings an extractor keeps (a pass re-reads its tiers' turns)."""
VALUE_CACHE = 16_384
"""Values, texts and entity sets the value functions keep (pure; validation repeats them)."""
CACHE_CHARS = 8_000_000
"""Characters of text each of those caches holds at most."""


@dataclass(frozen=True, slots=True)
class SlotValue:
    """One slot's value stated in a sentence; ``entity`` says which map it goes to."""

    slot: str
    value: str
    entity: bool


@dataclass(frozen=True, slots=True)
class SentenceReading:
    """What the slot rules read in one sentence (see the module docstring).

    Of the sentence's :class:`~tiermem.longterm.detect.SentenceSignals` it keeps whether
    there were entities and memory drafts, not the drafts and entities themselves: the
    readings of thousands of sentences are kept between passes (:data:`READ_CACHE`), and
    each kept entity was two objects the garbage collector walks at every full collection
    (issue #8); what was found is in ``slots`` and ``wrong``."""

    text: str
    named: bool
    """The sentence names an entity (the entity rules found one)."""
    memorable: bool
    """The memory rules drafted a memory from it (a preference, a name, a correction)."""
    has_number: bool
    slots: tuple[SlotValue, ...]
    wrong: tuple[str, ...]
    """Values the sentence says are wrong ("not ¥5,000"), as written."""
    switch: bool
    about_user: bool
    """False for quoted lines, statements about someone else and hypotheticals."""
    decision: bool
    goal: bool
    unresolved: bool

    @property
    def salient(self) -> bool:
        """As :attr:`~tiermem.longterm.detect.SentenceSignals.salient`: the sentence says
        something a later turn may need."""
        return self.named or self.memorable or self.has_number


def turn_said(turn: Turn) -> str:
    """The text a speaker wrote in ``turn``: its text blocks (not tool calls or results)."""
    content = turn.content
    if len(content) == 1 and type(content[0]) is TextBlock:
        return content[0].text  # most turns
    return "\n".join(b.text for b in content if isinstance(b, TextBlock))


class RuleStructuredExtractor:
    """The deterministic :class:`~tiermem.summaries.models.StructuredExtractor` (see the
    module docstring). Pure and cheap; safe to share.

    ``known_titles`` (alias → canonical title, as for
    :class:`~tiermem.extraction.entities.RuleEntityExtractor`) lets series titles be read.
    ``max_items`` bounds each list of items. Raises
    :class:`~tiermem.errors.ValidationError` for ``max_items`` below 1 or an empty title.
    """

    name = "rules"

    def __init__(
        self, known_titles: Mapping[str, str] | None = None, *, max_items: int = 20
    ) -> None:
        if max_items < 1:
            raise ValidationError(f"max_items must be at least 1, got {max_items}")
        # Without a catalogue, the process's default reader: its kept line readings are the
        # ones validation's checks read with (one reading of a new summary line, not two).
        self._entities = RuleEntityExtractor(known_titles) if known_titles else DEFAULT_READER
        self._detector = RuleMemoryDetector(known_titles)
        self._max_items = max_items
        # Extractors with the same catalogue read alike: they share their kept readings
        # (the service's extractor and its summarizer's read the same turns).
        catalogue = tuple(sorted(known_titles.items())) if known_titles else ()
        readings = _READINGS.get(catalogue)
        if readings is None:
            readings = _READINGS[catalogue] = Lru(
                READ_CACHE, max_chars=CACHE_CHARS, weigh=_reading_chars
            )
        self._readings = readings

    @property
    def entities(self) -> RuleEntityExtractor:
        """The entity rules this extractor reads with (and its title catalogue)."""
        return self._entities

    async def extract(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        return self.extract_sync(turns, prior=prior)

    def extract_sync(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        """``prior`` updated with ``turns`` (oldest first): the sync core of :meth:`extract`.
        Turns at or before ``prior.through_index`` are skipped, so a retried job adds
        nothing twice."""
        base = prior or StructuredMemory()
        # Slots set here are kept as (value, turn, previous) until the end: a restated
        # slot is one tuple, not a model copied at each statement.
        entities: dict[str, Fact | _Slot] = dict(base.entities)
        facts: dict[str, Fact | _Slot] = dict(base.facts)
        items = {"decision": list(base.decisions), "goal": list(base.goals),
                 "unresolved": list(base.unresolved)}  # fmt: skip
        through = base.through_index
        for turn in turns:
            if turn.index <= base.through_index or turn.redacted:
                through = max(through, turn.index)
                continue
            through = max(through, turn.index)
            for reading in self._readings_of(turn_said(turn), turn.role == "user"):
                if reading.switch:
                    for slot in SUBJECT_SLOTS:
                        entities.pop(slot, None)
                for slot_value in reading.slots:
                    target = entities if slot_value.entity else facts
                    _set(target, slot_value.slot, slot_value.value, turn.index)
                if reading.decision:
                    _add_item(items["decision"], reading.text, turn.index)
                if reading.goal:
                    _add_item(items["goal"], reading.text, turn.index)
                if reading.unresolved:
                    _add_item(items["unresolved"], reading.text, turn.index)
        entities_out = {slot: _fact(held) for slot, held in entities.items()}
        facts_out = {slot: _fact(held) for slot, held in facts.items()}
        # An item that names a value since superseded ("I want the Japanese edition" after
        # "make it the French edition") would present the old value as current: it goes.
        superseded = [
            (slot, old)
            for slot, fact in (*entities_out.items(), *facts_out.items())
            for old in fact.previous
        ]
        if superseded:
            probes = ProbeSet([value_probe(old, slot=slot) for slot, old in superseded])
            for kind in items:
                items[kind] = [
                    item
                    for item in items[kind]
                    if not probes.stated_by(SaidIn(item.text, self._entities))
                ]
        return StructuredMemory(
            entities=entities_out,
            facts=facts_out,
            decisions=tuple(items["decision"][-self._max_items :]),
            goals=tuple(items["goal"][-self._max_items :]),
            unresolved=tuple(items["unresolved"][-self._max_items :]),
            through_index=through,
        )

    # ------------------------------------------------------------------ sentences

    def read(self, text: str, *, role: str) -> list[SentenceReading]:
        """Each sentence of ``text`` said by ``role`` ("user" or "assistant"), read.

        Of a long text only the rule window is read (its first 8,000 and last 4,000
        characters, :mod:`tiermem.policies.turn_text`), as every rule engine does: the
        middle of a 200 KB paste or tool output holds someone else's values, and reading it
        all would cost the rules time in proportion.

        A reading is a pure function of the text and the role, and every pass reads the
        turns of its tiers again: the last :data:`READ_CACHE` texts' readings are kept."""
        return list(self._readings_of(text, role == "user"))

    def _readings_of(self, text: str, user: bool) -> tuple[SentenceReading, ...]:
        """:meth:`read`'s readings, as kept (not copied: they are read, never changed)."""
        key = (user, 0, text_key(text))
        return self._readings.get(key, partial(self._read, text, user=user))

    def read_salient(self, text: str, *, role: str, limit: int) -> list[SentenceReading]:
        """The first ``limit`` salient sentences of ``text`` (:meth:`read`'s readings whose
        ``signals.salient`` holds, cut at ``limit``), reading sentences only until they
        are found: of a large tool output the summarizer keeps a line or two, so the rest
        is split but not read. Kept like :meth:`read`."""
        if limit < 1:
            return []
        user = role == "user"
        key = (user, limit, text_key(text))
        return list(self._readings.get(key, lambda: self._salient(text, user, limit)))

    def _salient(self, text: str, user: bool, limit: int) -> tuple[SentenceReading, ...]:
        out: list[SentenceReading] = []
        for sentence in split_sentences(rule_window(text)):
            # As read_sentences reads each sentence (one sentence at a time).
            signals = SentenceSignals(
                text=sentence,
                entities=self._entities.extract(sentence),
                memories=self._detector.detect(sentence),
                has_number=bool(rules.DIGIT.search(sentence)),
            )
            if signals.salient:
                out.append(self._sentence(signals, user=user))
                if len(out) == limit:
                    break
        return tuple(out)

    def _read(self, text: str, *, user: bool) -> tuple[SentenceReading, ...]:
        return tuple(
            self._sentence(signals, user=user)
            for signals in read_sentences(
                rule_window(text), entities=self._entities, detector=self._detector
            )
        )

    def _sentence(self, signals: SentenceSignals, *, user: bool) -> SentenceReading:
        normal = signals.text
        folded = TextView(normal).folded
        about_user = not (
            rules.QUOTED_LINE.match(normal)
            or rules.EN_THIRD_PARTY.search(folded)
            or rules.EN_HYPOTHETICAL.match(folded)
        )
        question = is_question(normal)
        spans = self._entities.find(normal)
        regions = wrong_regions(normal, folded)
        current = [s for s in spans if not _inside(s[0], s[1], regions)]
        wrong = tuple(normal[s:e] for s, e, _, _ in spans if _inside(s, e, regions))
        slots: list[SlotValue] = []
        if user and about_user:
            if not question:
                slots += self._statements(normal, folded, signals, current)
            # An entity inside a stated value is that slot's, not an active entity of its
            # own: "my favorite character is Frieren" does not make Frieren the series.
            consumed = {_SLOT_KINDS.get(slot.slot, slot.slot) for slot in slots}
            for slot in slots:
                consumed.update(kind for _, _, kind, _ in self._entities.find(slot.value))
            latest: dict[str, str] = {}
            for _, _, kind, value in current:
                if kind not in consumed:
                    latest.pop(kind, None)
                    latest[kind] = value
            slots += [SlotValue(ENTITY_SLOTS.get(k, k), v, True) for k, v in latest.items()]
        statement = about_user and not question
        return SentenceReading(
            text=normal,
            named=bool(signals.entities),
            memorable=bool(signals.memories),
            has_number=signals.has_number,
            slots=tuple(slots),
            wrong=wrong + _wrong_words(normal, regions, spans),
            switch=user and bool(rules.EN_SWITCH.match(folded) or rules.JA_SWITCH.match(normal)),
            about_user=about_user,
            decision=statement and bool(rules.EN_DECISION.search(folded)),
            goal=user and statement and bool(rules.EN_GOAL.search(folded)),
            unresolved=_unresolved(folded, user=user, about_user=about_user, question=question),
        )

    def _statements(
        self,
        normal: str,
        folded: str,
        signals: SentenceSignals,
        current: list[tuple[int, int, str, str]],
    ) -> list[SlotValue]:
        out: list[SlotValue] = []
        for memory in signals.memories:
            if memory.key and memory.value:
                slot = (
                    memory.key
                    if memory.key in ("name", "addressed_as")
                    else (f"preference:{memory.key}")
                )
                out.append(SlotValue(slot, memory.value, False))
        if match := rules.EN_POSSESSIVE.search(folded):
            noun = " ".join(match.group("noun").split())
            found = self._noun_slot(noun, normal[match.start("obj") :])
            if found is not None:
                out.append(found)
        elif match := (
            rules.EN_SLOT_CHANGE.search(folded)
            or rules.EN_SLOT_USE.search(folded)
            or rules.EN_SLOT_REVERSED.match(folded)
        ):
            noun = " ".join(match.group("noun").split())
            raw = normal[match.start("obj") : match.end("obj")]
            found = self._noun_slot(noun, raw, restated=True)
            if found is not None:
                out.append(found)
        elif match := rules.JA_SLOT.search(normal):
            noun = rules.JA_SLOT_NOUNS[match.group("noun")]
            found = self._noun_slot(noun, match.group("obj").strip(rules.END_PUNCT))
            if found is not None:
                out.append(found)
        stated = {slot.slot for slot in out}
        money = [normal[s:e] for s, e, kind, _ in current if kind == "money"]
        if "budget" not in stated and money and rules.EN_BUDGET.search(folded):
            out.append(SlotValue("budget", money[-1], False))
        dates = [normal[s:e] for s, e, kind, _ in current if kind == "date"]
        if "delivery_date" not in stated and dates and rules.EN_DELIVERY.search(folded):
            out.append(SlotValue("delivery_date", dates[-1], False))
        if match := rules.EN_LOCATION.search(folded):
            place = _object(normal[match.start("obj") :])
            if place and place[0].isupper():
                out.append(SlotValue("location", place, False))
        return out

    def _noun_slot(self, noun: str, raw: str, *, restated: bool = False) -> SlotValue | None:
        """The slot of "my <noun> is <raw>", validated; None if it names no slot.

        ``restated``: said another way ("change the <noun> to …", "<raw> is my favorite
        <noun>"), which the preference rules do not read, so a favourite is read here."""
        head, _, rest = noun.partition(" ")
        if restated and head in rules.PREFERENCE_HEADS and rest:
            value = _object(raw)
            return SlotValue(f"preference:{favorite_key(rest)}", value, False) if value else None
        if not noun or noun in rules.NOUN_STOP or head in rules.NOUN_STOP:
            return None
        value = _object(raw)
        if value is None:
            return None
        kind = rules.NOUN_ENTITY_KINDS.get(noun)
        if kind is not None:
            found = [v for _, _, k, v in self._entities.find(value) if k == kind]
            if not found:
                logger.debug("rejected a malformed %s: %r", kind, value)
                return None
            return SlotValue(ENTITY_SLOTS.get(kind, kind), found[0], True)
        slot = rules.SLOT_NOUNS.get(noun, noun.replace(" ", "_").replace("-", "_"))
        needs_money = noun in rules.NOUN_NEEDS_MONEY or slot == "budget"
        if needs_money and not any(k == "money" for _, _, k, _ in self._entities.find(value)):
            return None
        return SlotValue(slot, value, False)


def _unresolved(folded: str, *, user: bool, about_user: bool, question: bool) -> bool:
    """The sentence states an unresolved intention: a statement ("I'll think about it",
    "let me check with my wife first"), or a user's request for something later, which
    ends in "?" as often as not ("can you let me know when vol 43 is back?"); never an
    ordinary question ("is vol 43 in stock?")."""
    if not about_user:
        return False
    if not question:
        rule = rules.EN_UNRESOLVED if user else rules.EN_ASSISTANT_UNRESOLVED
        return bool(rule.search(folded))
    return user and bool(rules.EN_REQUESTED_UNRESOLVED.search(folded))


# ---------------------------------------------------------------- values


def _object(raw: str) -> str | None:
    """The value phrase of a statement: the detection rules' clean-up, with the commas of
    "¥8,000" kept."""
    masked = _DIGIT_COMMA.sub(_COMMA_MASK, raw)
    value = clean_object(masked)
    return value.replace(_COMMA_MASK, ",") if value else None


def wrong_regions(normal: str, folded: str) -> list[tuple[int, int]]:
    """Where a sentence names wrong values: "not …", "instead of …", "rather than …" up to
    the next comma, and the part before じゃなくて/ではなく (positions in ``normal``, which
    ``folded`` matches character for character)."""
    regions = [(m.start(), m.end()) for m in rules.EN_NEGATED_TAIL.finditer(folded)]
    if rules.CJK.search(normal) and (contrast := rules.JA_CONTRAST.search(normal)):
        regions.append((contrast.start("a"), contrast.end("a")))
    return regions


def _wrong_words(
    normal: str, regions: list[tuple[int, int]], spans: list[tuple[int, int, str, str]]
) -> tuple[str, ...]:
    """Wrong values without an entity in them ("…, not Aoyama 3-4"), cleaned."""
    out = []
    for start, end in regions:
        if any(_inside(s, e, [(start, end)]) for s, e, _, _ in spans):
            continue
        words = re.sub(r"^(?:not|instead\s+of|rather\s+than)\s+", "", normal[start:end], flags=re.I)
        value = _object(words)
        if value:
            out.append(value)
    return tuple(out)


def _inside(start: int, end: int, regions: list[tuple[int, int]]) -> bool:
    return any(a <= start and end <= b for a, b in regions)


_Slot = tuple[str, str, int, tuple[str, ...]]
"""A slot set during one extraction: ``slot, value, turn_index, previous`` (the fields of
the :class:`Fact` it becomes)."""


def _set(store: dict[str, Fact | _Slot], slot: str, value: str, turn_index: int) -> None:
    """Set ``slot`` to ``value`` said at ``turn_index``: the same value (as
    :func:`same_value`) moves to the new turn; another one replaces it, the old value
    joining ``previous`` (and any earlier statement of the new value leaving it)."""
    old = store.get(slot)
    if old is None:
        store[slot] = (slot, value, turn_index, ())
        return
    if isinstance(old, Fact):
        named, old_value, old_previous = old.slot, old.value, old.previous
    else:
        named, old_value, _, old_previous = old
    if same_value(old_value, value, slot=slot):
        store[slot] = (named, old_value, turn_index, old_previous)
    else:
        previous = tuple(v for v in old_previous if not same_value(v, value, slot=slot))
        store[slot] = (slot, value, turn_index, (*previous, old_value))


def _fact(held: Fact | _Slot) -> Fact:
    if isinstance(held, Fact):
        return held  # not set by this extraction
    slot, value, turn_index, previous = held
    return Fact(slot=slot, value=value, turn_index=turn_index, previous=previous)


def _add_item(items: list[Item], text: str, turn_index: int) -> None:
    key = text.casefold()
    items[:] = [item for item in items if item.text.casefold() != key]
    items.append(Item(text=text, turn_index=turn_index))


_READINGS: dict[
    tuple[tuple[str, str], ...], Lru[tuple[bool, int, str | bytes], tuple[SentenceReading, ...]]
] = {}
"""Kept sentence readings, one cache per title catalogue (few per process)."""
_EntitySet = tuple[str, ...]
"""Distinct entities, flat: ``kind, value, kind, value, ...`` (sorted). Flat strings, not a
frozenset of pairs: the garbage collector stops tracking a tuple of strings at the first
collection it survives, and never a frozenset (thousands are kept: issue #8)."""
_ENTITY_SETS: weakref.WeakKeyDictionary[RuleEntityExtractor, Lru[str | bytes, _EntitySet]]
_ENTITY_SETS = weakref.WeakKeyDictionary()
_VALUE_KEYS: Lru[tuple[str | bytes, str | None], str] = Lru(
    VALUE_CACHE, max_chars=CACHE_CHARS, weigh=len
)
_STATED: weakref.WeakKeyDictionary[
    RuleEntityExtractor, Lru[tuple[str | bytes, str, str | None], bool]
] = weakref.WeakKeyDictionary()
_HAYSTACKS: Lru[str | bytes, str] = Lru(VALUE_CACHE, max_chars=CACHE_CHARS, weigh=len)
STATED_TEXTS = 64
"""Texts whose :func:`stated_in` checks (and answers) are kept, per reader."""
_STATED_TEXTS: weakref.WeakKeyDictionary[RuleEntityExtractor, Lru[str | bytes, _TextChecks]]
_STATED_TEXTS = weakref.WeakKeyDictionary()
_PROBES: Lru[tuple[str | bytes, str | None], ValueProbe] = Lru(VALUE_CACHE)
_SAID: weakref.WeakKeyDictionary[RuleEntityExtractor, Lru[str | bytes, _SaidEntities]]
_SAID = weakref.WeakKeyDictionary()


RECENT_KEYS = 8
"""Long texts whose :func:`~tiermem.summaries._lru.text_key` is remembered (:func:`whole_key`)."""
RECENT_KEY_CHARS = 65_536
"""Only texts up to this many characters are remembered: at most 8 x 64 K characters held."""
_RECENT_KEYS: list[tuple[str, str | bytes]] = []
"""``(text, text_key(text))`` of the last long texts asked, most recent first."""
track_table(_RECENT_KEYS.clear)  # texts of summaries


def whole_key(text: str) -> str | bytes:
    """``text_key(text)``, remembered for the last :data:`RECENT_KEYS` long texts.

    Why: a pass asks the key of the same tier text several times (its checks, its entity
    lines, its folded form; the next pass's drift baseline is the same text again), and a
    long key is a digest of the whole text (~30 instructions a character), where finding
    the text again is a comparison (a pointer, else a length, else ~1 per character).
    Lock-free: a racing thread can only miss an entry or keep one twice, and every entry
    is a text with its own key. An entry is moved by itself, not by the position it was
    found at: another thread may have moved entries since (an index could then be past
    the end, or name another entry)."""
    if len(text) <= INLINE_KEY:
        return text
    recent = _RECENT_KEYS
    for at, entry in enumerate(recent):
        held, key = entry
        if held is text or held == text:
            if at:
                with contextlib.suppress(ValueError):  # another thread took it out meanwhile
                    recent.remove(entry)  # this very tuple first (identity), else an equal one
                recent.insert(0, entry)
                del recent[RECENT_KEYS:]
            return key
    key = text_key(text)
    if len(text) <= RECENT_KEY_CHARS:
        recent.insert(0, (text, key))
        del recent[RECENT_KEYS:]
    return key


def _reading_chars(readings: tuple[SentenceReading, ...]) -> int:
    return 64 + sum(len(r.text) for r in readings)


def _entity_cache(extractor: RuleEntityExtractor) -> Lru[str | bytes, _EntitySet]:
    cache = _ENTITY_SETS.get(extractor)
    if cache is None:
        cache = _ENTITY_SETS[extractor] = Lru(VALUE_CACHE)
    return cache


def _entities_in(text: str, extractor: RuleEntityExtractor) -> _EntitySet:
    """Every ``(kind, value)`` in ``text`` (flat: :data:`_EntitySet`), read line by line
    so that a long text is read whole (the rules read a window of each text they are
    given). Each line's entities are kept per extractor: a pass's summary is mostly the
    previous pass's lines, and validation asks this of it once per slot."""
    cache = _entity_cache(extractor)
    return cache.get(whole_key(text), partial(_read_entities, text, extractor, cache))


class _LineEntities:
    """The entities of a text (as :func:`_entities_in` reads them: the union of its
    lines'), read only as far as a question needs: its lines are looked at newest first,
    those whose entities are kept at once, the others (read by the entity rules) only
    once no kept line has the value; and only until the value is found.

    Why: a pass asks whether its tiers state each current entity value (the latest said,
    so most often in the newest lines); the tiers are mostly the previous pass's lines, of
    which those read then are kept, so a value is usually found after a few lines, none of
    them read again (each costs the entity rules). A value not found is looked for in
    every line, so the answer is the same as reading them all."""

    __slots__ = ("_cache", "_found", "_lines", "_next", "_reader", "_unread", "_unread_at")

    def __init__(self, text: str, reader: RuleEntityExtractor) -> None:
        cache = _entity_cache(reader)
        self._cache = cache
        self._reader = reader
        self._found: dict[str, set[str]] = {}
        self._unread: list[str] = []
        """Lines looked at whose entities are not kept, newest first."""
        self._unread_at = 0
        whole = cache.held(whole_key(text))
        if whole is not None:
            self._add(whole)
            self._lines: list[str] = []
        else:
            self._lines = text.splitlines()
        self._next = len(self._lines) - 1
        """The next line to look at (newest first; -1: all looked at)."""

    def _add(self, entities: _EntitySet) -> None:
        found = self._found
        for at in range(0, len(entities), 2):
            kind, value = entities[at], entities[at + 1]
            held = found.get(kind)
            if held is None:
                found[kind] = {value.casefold()}
            else:
                held.add(value.casefold())

    def has(self, kind: str, canonical: str) -> bool:
        """Whether a line holds the entity ``kind`` whose folded value is ``canonical``."""
        found = self._found
        if canonical in found.get(kind, ()):
            return True
        cache, lines, unread = self._cache, self._lines, self._unread
        held_of = cache.held
        at = self._next
        while at >= 0:
            line = lines[at]
            at -= 1
            if not line.strip():
                continue
            held = held_of(line if len(line) <= INLINE_KEY else text_key(line))
            if held is None:
                unread.append(line)
            elif held:
                self._add(held)
                if canonical in found.get(kind, ()):
                    self._next = at
                    return True
        self._next = -1
        reader = self._reader
        while self._unread_at < len(unread):
            line = unread[self._unread_at]
            self._unread_at += 1
            self._add(cache.get(text_key(line), partial(_read_entities, line, reader, cache)))
            if canonical in found.get(kind, ()):
                return True
        return False


def _read_entities(
    text: str, extractor: RuleEntityExtractor, cache: Lru[str | bytes, _EntitySet]
) -> _EntitySet:
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1:
        return _flat({(e.kind, e.value) for e in extractor.extract(lines[0])})
    found: set[tuple[str, str]] = set()
    for line in lines:
        found.update(
            _pairs(cache.get(text_key(line), partial(_read_entities, line, extractor, cache)))
        )
    return _flat(found)


def _flat(entities: set[tuple[str, str]]) -> _EntitySet:
    return tuple(field for pair in sorted(entities) for field in pair)


def _pairs(entities: _EntitySet) -> Iterator[tuple[str, str]]:
    """The ``(kind, value)`` pairs of ``entities``."""
    fields = iter(entities)
    return zip(fields, fields, strict=True)


def _haystack(text: str) -> str:
    key = whole_key(text)
    held = _HAYSTACKS.held(key)  # most are: no closure made for a hit
    if held is None:
        held = _HAYSTACKS.get(key, lambda: _spaced(normal_form(text).casefold()))
    return held


def _spaced(text: str) -> str:
    """``_SPACES.sub(" ", text)``: each run of whitespace as one space. Split and joined
    (``\\s`` and ``str.split`` know the same whitespace), because the pattern's one
    replacement per space cost a millisecond on a tier's text (validation folds each
    pass's text whole)."""
    words = text.split()
    if not words:
        return " " if text else ""
    spaced = " ".join(words)
    if text[0].isspace():
        spaced = " " + spaced
    if text[-1].isspace():
        spaced += " "
    return spaced


def value_key(value: str, *, slot: str | None = None) -> str:
    """A value in the form two statements of it share: ``"kind:canonical"`` when it is one
    entity ("¥8,000" and "8000円" are both ``money:JPY 8000``; "vol 3" under ``volume`` is
    ``volume:3``), else its folded text with whitespace collapsed. Pure, so kept (LRU)."""
    key = (value if len(value) <= INLINE_KEY else text_key(value), slot)
    held = _VALUE_KEYS.held(key)  # most are: no closure made for a hit
    if held is None:
        held = _VALUE_KEYS.get(key, lambda: _value_key(value, slot))
    return held


def _value_key(value: str, slot: str | None) -> str:
    kind = _SLOT_KINDS.get(slot, slot) if slot else None
    found = DEFAULT_READER.find(value)
    if kind in _ENTITY_KINDS:
        of_kind = [v for _, _, k, v in found if k == kind]
        return f"{kind}:{(of_kind[0] if of_kind else value).casefold()}"
    if len(found) == 1:
        start, end, found_kind, canonical = found[0]
        if end - start >= len(normal_form(value).strip()) - 1:
            return f"{found_kind}:{canonical.casefold()}"
    return _SPACES.sub(" ", normal_form(value).casefold()).strip()


def same_value(a: str, b: str, *, slot: str | None = None) -> bool:
    """``a`` and ``b`` are one value of ``slot`` (see :func:`value_key`)."""
    return value_key(a, slot=slot) == value_key(b, slot=slot)


def states_value(
    text: str,
    value: str,
    *,
    slot: str | None = None,
    extractor: RuleEntityExtractor | None = None,
) -> bool:
    """``text`` states ``value`` (of ``slot``): as the same entity, or as written (folded,
    on word boundaries, so "¥8,000" is not found in "¥18,000"). A volume, an amount or a
    date is found only as an entity: "3" alone is not volume 3. ``extractor`` (with a title
    catalogue) finds series by any of their names. Pure, so kept (LRU per extractor):
    validation and the summarizer's stale-line check ask it of the same texts every pass."""
    reader = extractor or DEFAULT_READER
    cache = _STATED.get(reader)
    if cache is None:
        cache = _STATED[reader] = Lru(VALUE_CACHE)
    key = (whole_key(text), value, slot)
    return cache.get(key, lambda: _states_value(text, value, slot, reader))


def stated_in(
    text: str, *, extractor: RuleEntityExtractor | None = None
) -> Callable[[str, str | None], bool]:
    """``states_value`` of one ``text`` for many values: ``check(value, slot)``. The text
    is read at most once (its entities, its folded form), not once per value, as
    validation asks it of every slot of structured memory; of its lines whose entities are
    not kept, only as many as a value not found yet needs (:class:`_LineEntities`).

    The checks of the last :data:`STATED_TEXTS` texts are kept per reader, with their
    answers: a pass asks them of its tiers' text, and the next pass asks the same values
    of that text again (its entity drift baseline)."""
    reader = extractor or DEFAULT_READER
    kept = _STATED_TEXTS.get(reader)
    if kept is None:
        kept = _STATED_TEXTS[reader] = Lru(STATED_TEXTS, max_chars=CACHE_CHARS, weigh=_text_chars)
    return kept.get(whole_key(text), partial(_TextChecks, text, reader)).check


class _TextChecks:
    """:func:`stated_in`'s check of one text, answers kept (a pure function of the text,
    the value and the slot). A lock keeps its lazily read state whole if two threads ask
    at once (the engines may run in worker threads)."""

    __slots__ = ("_answers", "_entities", "_haystack", "_lock", "_reader", "text")

    def __init__(self, text: str, reader: RuleEntityExtractor) -> None:
        self.text = text
        self._reader = reader
        self._entities: _LineEntities | None = None
        self._haystack: str | None = None
        self._answers: dict[tuple[str, str | None], bool] = {}
        self._lock = threading.Lock()

    def check(self, value: str, slot: str | None) -> bool:
        answer = self._answers.get((value, slot))
        if answer is None:
            with self._lock:
                answer = self._answers[(value, slot)] = self._check(value, slot)
        return answer

    def _check(self, value: str, slot: str | None) -> bool:
        key = value_key(value, slot=slot)
        kind, _, canonical = key.partition(":")
        if kind in _ENTITY_KINDS and canonical:
            if self._entities is None:
                self._entities = _LineEntities(self.text, self._reader)
            if self._entities.has(kind, canonical):
                return True
            if kind not in _NAMED_KINDS:
                return False
            needle = canonical
        else:
            needle = _SPACES.sub(" ", normal_form(value).casefold()).strip()
        if not needle:
            return False
        if self._haystack is None:
            self._haystack = _haystack(self.text)
        return _found_whole(needle, self._haystack)


def _text_chars(checks: _TextChecks) -> int:
    return 256 + len(checks.text)


@dataclass(frozen=True, slots=True)
class ValueProbe:
    """What :func:`states_value` looks for of one value of one slot, worked out once
    (:func:`value_probe`) for asking it of many texts (:class:`SaidIn`): the stale-line
    checks ask every line of a tier about every superseded value."""

    entity: str
    """``kind\x1fcanonical`` when the value is one entity of a kind the rules read (found
    among a text's entities: :meth:`SaidIn.entities`), else ""."""
    named: bool
    """An entity that may also be found as written (a name or an id)."""
    needle: str
    """What is looked for as written ("": never found that way)."""


def value_probe(value: str, *, slot: str | None = None) -> ValueProbe:
    """:class:`ValueProbe` of ``value`` (of ``slot``), kept (pure)."""
    key = (value if len(value) <= INLINE_KEY else text_key(value), slot)
    held = _PROBES.held(key)  # most are: no partial made for a hit
    if held is None:
        held = _PROBES.get(key, partial(_value_probe, value, slot))
    return held


def _value_probe(value: str, slot: str | None) -> ValueProbe:
    kind, _, canonical = value_key(value, slot=slot).partition(":")
    if kind in _ENTITY_KINDS and canonical:
        return ValueProbe(f"{kind}\x1f{canonical}", kind in _NAMED_KINDS, canonical)
    needle = _SPACES.sub(" ", normal_form(value).casefold()).strip()
    return ValueProbe("", False, needle)


_SaidEntities = tuple[str, ...]
"""A text's entities as :class:`SaidIn` reads them: ``kind\x1ffolded value``, sorted (a
kind never holds the separator, so each is one pair). A tuple of strings, which the
garbage collector stops tracking (thousands are kept)."""


def _said_entities(text: str, reader: RuleEntityExtractor) -> _SaidEntities:
    return tuple(sorted({f"{k}\x1f{v.casefold()}" for k, v in _pairs(_entities_in(text, reader))}))


def _said_chars(entities: _SaidEntities) -> int:
    return 64 + sum(map(len, entities))


class SaidIn:
    """:func:`states_value` of one text for many :class:`ValueProbe`: the text's entities
    (kept per reader, by text) and its folded form are looked up once, when a probe first
    needs them, not once a value. ``SaidIn(text, reader).states(value_probe(v, slot=s))``
    is ``states_value(text, v, slot=s, extractor=reader)``."""

    __slots__ = ("_entities", "_haystack", "_reader", "_text")

    def __init__(self, text: str, reader: RuleEntityExtractor | None = None) -> None:
        self._text = text
        self._reader = reader or DEFAULT_READER
        self._entities: _SaidEntities | None = None
        self._haystack: str | None = None

    def states(self, probe: ValueProbe) -> bool:
        if probe.entity:
            if probe.entity in self.entities():
                return True
            if not probe.named:
                return False
        if not probe.needle:
            return False
        return self.writes(probe.needle)

    def entities(self) -> tuple[str, ...]:
        """The text's entities, each ``kind\x1ffolded value``."""
        entities = self._entities
        if entities is None:
            reader = self._reader
            kept = _SAID.get(reader)
            if kept is None:
                kept = _SAID[reader] = Lru(VALUE_CACHE, max_chars=CACHE_CHARS, weigh=_said_chars)
            text = self._text
            key = text if len(text) <= INLINE_KEY else text_key(text)
            entities = kept.held(key)
            if entities is None:
                entities = kept.get(key, partial(_said_entities, text, reader))
            self._entities = entities
        return entities

    def writes(self, needle: str) -> bool:
        """The folded text holds ``needle`` as written (touching no letter or digit)."""
        return _found_whole(needle, self.folded())

    def folded(self) -> str:
        """The text as a needle is looked for in it (:func:`_haystack`)."""
        haystack = self._haystack
        if haystack is None:
            haystack = self._haystack = _haystack(self._text)
        return haystack


class ProbeSet:
    """Many :class:`ValueProbe` asked of many texts: :meth:`stated_by` finds those a text
    states by one look at its entities (a dictionary of the probes' entities) and one
    search a probe that may be found as written, instead of every probe in turn."""

    __slots__ = ("_by_entity", "_written", "probes")

    def __init__(self, probes: Sequence[ValueProbe]) -> None:
        self.probes = tuple(probes)
        self._by_entity: dict[str, list[int]] = {}
        self._written: list[tuple[int, str]] = []
        for at, probe in enumerate(self.probes):
            if probe.entity:
                self._by_entity.setdefault(probe.entity, []).append(at)
                if not probe.named:
                    continue
            if probe.needle:
                self._written.append((at, probe.needle))

    def stated_by(self, said: SaidIn) -> set[int]:
        """The positions of the probes ``said`` states (``said.states(probe)``)."""
        found: set[int] = set()
        by_entity = self._by_entity
        if by_entity:
            for pair in said.entities():
                hits = by_entity.get(pair)
                if hits is not None:
                    found.update(hits)
        written = self._written
        if written:
            haystack = said.folded()
            for at, needle in written:
                # ``in`` first: a sentence holds few of the stale values (a pass asks about
                # every one, a hundred in a long session), and a miss then costs no call.
                if needle in haystack and at not in found and _found_whole(needle, haystack):
                    found.add(at)
        return found


def _states_value(text: str, value: str, slot: str | None, reader: RuleEntityExtractor) -> bool:
    key = value_key(value, slot=slot)
    kind, _, canonical = key.partition(":")
    if kind in _ENTITY_KINDS and canonical:
        if any(
            k == kind and v.casefold() == canonical for k, v in _pairs(_entities_in(text, reader))
        ):
            return True
        if kind not in _NAMED_KINDS:
            return False
        needle = canonical
    else:
        needle = _SPACES.sub(" ", normal_form(value).casefold()).strip()
    if not needle:
        return False
    return _found_whole(needle, _haystack(text))


def _found_whole(needle: str, haystack: str) -> bool:
    """Whether ``needle`` occurs in ``haystack`` touching no Latin letter or digit
    (:func:`_is_edge`) on either side: what ``(?<![edge])needle(?![edge])`` finds,
    without compiling a pattern per needle (validation asks this of every slot value)."""
    size = len(needle)
    end = len(haystack)
    at = haystack.find(needle)
    while at >= 0:
        after = at + size
        if (at == 0 or not _is_edge(haystack[at - 1])) and (
            after >= end or not _is_edge(haystack[after])
        ):
            return True
        at = haystack.find(needle, at + 1)
    return False


def _is_edge(char: str) -> bool:
    """``char`` is a folded Latin letter or digit, ``[0-9a-z\u00c0-\u024f]``: what a value
    found as written may not touch."""
    return "0" <= char <= "9" or "a" <= char <= "z" or "\u00c0" <= char <= "\u024f"


def readable_value(slot: str, value: str) -> str:
    """``value`` of ``slot`` written so that a reader, and the entity rules, read it back as
    the same value: a volume's canonical ``"3"`` is ``"vol 3"``, a price's ``"JPY 990"`` is
    ``"990 JPY"``; any other value as it is."""
    kind = _SLOT_KINDS.get(slot, slot)
    if kind == "volume" and value.isdigit():
        return f"vol {value}"
    if kind == "money":
        currency, _, amount = value.partition(" ")
        if currency.isalpha() and amount:
            return f"{amount} {currency}"
    return value


def slot_statement(slot: str, value: str) -> str:
    """``"slot: value"`` (:func:`readable_value`): how to state a lost slot as a
    ``must_keep`` item. :func:`~tiermem.summaries.quality.lost_items` finds the value in it,
    and the offline summarizer reads it back as a statement of that slot, so a later
    correction supersedes it."""
    return f"{slot}: {readable_value(slot, value)}"


def render_structured(memory: StructuredMemory) -> str:
    """Structured memory as compact text, for a prompt and for counting its tokens: the
    latest value of each slot (:func:`readable_value`), then the items. Superseded values
    are not shown."""
    lines = []
    for label, slots in (("Active", memory.entities), ("Facts", memory.facts)):
        if slots:
            pairs = (f"{k}={readable_value(k, f.value)}" for k, f in slots.items())
            lines.append(f"{label}: " + "; ".join(pairs))
    for label, items in (("Decisions", memory.decisions), ("Goals", memory.goals),
                         ("Unresolved", memory.unresolved)):  # fmt: skip
        if items:
            lines.append(f"{label}: " + " | ".join(item.text for item in items))
    return "\n".join(lines)
