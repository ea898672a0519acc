"""The offline summarizer: extractive summaries of raw turns, with rules, in a token budget.

:class:`ExtractiveSummarizer` is the default :class:`~tiermem.summaries.models.SessionSummarizer`
when no LLM is configured. It keeps sentences as they were said, one line each, with the
index of the turn that said them (``- [12] User: My budget is ¥8,000.``), so a reader can
trace every line to its turn and the next pass can rank it again.

How a summary is made:

1. **Candidates.** Every sentence of the span's turns that carries something a later turn
   may need (the sentence rules shared with
   :class:`~tiermem.managers.summary.RuleSummarizer`: an entity, a number, a preference, a
   name, a correction), plus the decisions, goals and unresolved intentions of the slot
   rules (:mod:`tiermem.summaries.structured`), each tool call, and the first few such
   sentences of each tool result. The lines of ``prior`` are candidates too, with their
   turn indexes: the prior summary is context that is ranked again, not summarized again.
2. **Stale lines go.** When two lines state the same slot (the budget, the active volume,
   the postcode), only the latest stays; a line that mentions a value a later line
   superseded ("options under ¥5,000" after "actually my budget is ¥8,000") goes too,
   unless it also states the new value. A wrong value named by a correction ("…, not
   ¥5,000") counts as superseded.
3. **Ranking.** A line scores by what it carries (a user's slot statement first, then
   preferences and corrections, decisions and intentions, entities, numbers; the user's
   words above the assistant's, the assistant's above tool output) plus recency.
4. **Budget.** ``must_keep`` items are stated first, verbatim, one line each (an item
   written ``slot: value`` with a structured memory slot name, e.g. ``budget: ¥8,000``, is
   read as a statement of that slot by the next pass, so a later correction supersedes
   it); then the best
   lines that fit ``target_tokens`` (counted with :mod:`tiermem.tokens`), printed in turn
   order. The summary never exceeds ``target_tokens``, except when the ``must_keep`` items
   alone exceed it: they are all stated anyway (closed-loop validation asked for them) and
   nothing else is.

When no sentence qualifies, the first sentence of each user turn is kept, so a summary says
what was talked about. Deterministic: the same turns, prior and budget give the same text.

This module owns the summarizer and what it keeps across passes; a candidate line's layout,
score and the stale-line rule are in :mod:`tiermem.summaries._candidates`, the lines' exact
token counts in :mod:`tiermem.summaries._line_tokens`.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from functools import partial

from tiermem.errors import ValidationError
from tiermem.longterm.detect import split_sentences
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.models.turns import Turn
from tiermem.summaries._candidates import (
    _CARRIED_UNINDEXED,
    _COST,
    _FIELDS,
    _IDX,
    _LINE,
    _LINE_AT,
    _RECENCY,
    _ROLE_WEIGHT,
    _SCORE,
    _SLOT,
    _SLOT_LINE,
    _TOOL_CALL,
    _TOPIC,
    _UNINDEXED,
    _body_of,
    _carried_chars,
    _drop_stale,
    _LineFields,
    _lines_chars,
    _merge,
    _Row,
    _score,
    _slot_keys,
    _Slots,
)
from tiermem.summaries._candidates import _JOINED as _JOINED  # named from here by tests
from tiermem.summaries._candidates import _mentions_stale as _mentions_stale  # same
from tiermem.summaries._line_tokens import LINE_CACHE, LineTokens
from tiermem.summaries._lru import INLINE_KEY, Lru, text_key
from tiermem.summaries.structured import (
    RuleStructuredExtractor,
    SentenceReading,
    value_key,
)
from tiermem.text_caches import track
from tiermem.tokens import TokenCounter

__all__ = ["ExtractiveSummarizer"]

TURN_CACHE = 16_384
"""Text blocks whose candidate lines a summarizer keeps. A turn is ranked by about three
passes (its recent tier, the middle tier, the ancient tier it rolls into), from the same
text, index and role each time: its lines, scores and token counts are computed once."""
TURN_CACHE_CHARS = 8_000_000
"""Characters of kept candidate lines, at most (a line is at most ``max_sentence_chars``)."""
PRIORS = 4
"""Priors whose rows a summarizer keeps whole (a pass has three; one is the next's)."""
PRIOR_CHARS = 65_536
"""Longer priors are not kept whole (a tier's text is a few thousand characters)."""
SPANS = 8
"""Spans of turns whose rows a summarizer keeps whole (a pass has three; two are the
next passes')."""
SPAN_TURNS = 256
"""Longer spans are not kept whole (a pass's span is about ``every_turns`` turns)."""
SPAN_CHARS = TURN_CACHE_CHARS // SPANS
"""Spans whose candidate lines are longer (in characters) are not kept whole: the kept
spans stay within the text cache's bound (a span of long tool results, 1 MB a turn, has
long lines)."""

RANKINGS = 4
"""Candidate rankings a summarizer keeps (:meth:`ExtractiveSummarizer._ranking`): a pass's
middle tier ranks the same prior and span as the next pass's ancient tier (the new ancient
text, and the recent span rolled into it), and a validation retry ranks its tier's again."""

SAID_CACHE = TURN_CACHE
"""Text blocks whose index-free candidate lines a summarizer keeps
(:meth:`ExtractiveSummarizer._said_lines`), by role and text."""
SAID_CHARS = TURN_CACHE_CHARS // 2
"""Characters they hold (bodies, slot values, wrong values), at most: a slot's value is
not cut with its body, so a long sentence's value may be longer than the line."""
_SaidLines = tuple[float | _Slots | tuple[str, ...] | str | int | None, ...]
"""Per line, flat: ``score, slots, wrong, body, body tokens, newline change``
(:meth:`ExtractiveSummarizer._said_lines`). Flat, as :data:`_LineFields` is, so that a
young and a middle collection untrack it (one nesting level fewer than a tuple of
tuples)."""
_SAID_FIELDS = 6

CARRIED_SAID = 8_192
"""Carried lines whose index-free part a summarizer keeps, by speaker and sentence (a
sentence is at most ``max_sentence_chars``)."""
CARRIED_SAID_CHARS = TURN_CACHE_CHARS // 8
"""Characters of their slot and wrong values, at most (a carried line of an LLM's summary
is not cut, and a value in it may run to thousands of characters)."""
_CarriedSaid = tuple[float, _Slots, tuple[str, ...], int | None, int | None]
"""``score, slots, wrong, body tokens, newline change`` of a carried line
(:meth:`ExtractiveSummarizer._carried_said_of`)."""


_Ranked = list[tuple[float, int, int]]
"""``(-score, -index, -order)`` of the rows that stay, best first (:func:`_ranked`)."""
_Ranking = tuple[tuple["weakref.ref[Turn]", ...], list[_Row], _Ranked]
"""A kept ranking (:meth:`ExtractiveSummarizer._ranking`): the kept span's references to
its turns (held, so that their id is not reused while it is kept), the candidate rows,
and their ranking. Neither list is changed once kept."""


def _ranked(rows: list[_Row], kept: list[int]) -> _Ranked:
    """The ``kept`` rows (positions in ``rows``), best first: by score with recency (the
    newest turn gets :data:`_RECENCY` more, the oldest nothing, by rank among the kept
    rows' turns); ties to the newer turn, then the later line."""
    indexes = sorted({rows[at][_IDX] for at in kept})
    top = max(len(indexes) - 1, 1)
    # Each turn's recency once (the same expression, so the same floats), not a row's.
    recency = {index: _RECENCY * position / top for position, index in enumerate(indexes)}
    ranked: _Ranked = []
    rank = ranked.append
    for at in kept:
        row = rows[at]
        index = row[_IDX]
        rank((-(row[_SCORE] + recency[index]), -index, -at))
    ranked.sort()
    return ranked


def _values_chars(slots: _Slots, wrong: tuple[str, ...]) -> int:
    return sum(map(len, slots)) + sum(map(len, wrong))


def _said_chars(said: _SaidLines) -> int:
    fields = _SAID_FIELDS
    bodies: tuple[str, ...] = said[3::fields]  # type: ignore[assignment]
    slots: tuple[_Slots, ...] = said[1::fields]  # type: ignore[assignment]
    wrong: tuple[tuple[str, ...], ...] = said[2::fields]  # type: ignore[assignment]
    return 64 + sum(map(len, bodies)) + sum(map(_values_chars, slots, wrong))


def _carried_said_chars(said: _CarriedSaid) -> int:
    return 64 + _values_chars(said[1], said[2])


class ExtractiveSummarizer(LineTokens):
    """The deterministic :class:`~tiermem.summaries.models.SessionSummarizer` (see the
    module docstring). Pure and cheap; safe to share.

    ``counter`` counts the budget (default: the project's tiktoken counter, built once).
    ``known_titles`` (alias → canonical title) lets series titles count as entities;
    ``extractor`` replaces the slot rules (it carries its own titles). A kept sentence
    longer than ``max_sentence_chars`` is cut with "…"; a tool result gives at most
    ``max_result_sentences`` lines. Raises :class:`~tiermem.errors.ValidationError` for a
    limit below 1.
    """

    name = "extractive"
    verbatim = True
    """Every line is a sentence of a raw turn as said (cut past ``max_sentence_chars``)
    with its turn index, or a ``must_keep`` item: the rolling tiers may rank an old tier's
    lines again instead of re-reading all its turns (:mod:`tiermem.summaries.rolling`)."""

    def __init__(
        self,
        counter: TokenCounter | None = None,
        *,
        known_titles: Mapping[str, str] | None = None,
        extractor: RuleStructuredExtractor | None = None,
        max_sentence_chars: int = 240,
        max_result_sentences: int = 2,
    ) -> None:
        if max_sentence_chars < 1 or max_result_sentences < 0:
            raise ValidationError(
                "max_sentence_chars must be at least 1 and max_result_sentences at least 0"
            )
        super().__init__(counter)
        self._reader = extractor or RuleStructuredExtractor(known_titles)
        self._max_chars = max_sentence_chars
        self._max_results = max_result_sentences
        self._text_cache: Lru[tuple[int, str, str | bytes], _LineFields] = Lru(
            TURN_CACHE, max_chars=TURN_CACHE_CHARS, weigh=_lines_chars
        )
        self._said: Lru[tuple[str, str, str | bytes], _SaidLines] = Lru(
            SAID_CACHE, max_chars=SAID_CHARS, weigh=_said_chars
        )
        self._carried_said: Lru[tuple[str, str | bytes], _CarriedSaid] = Lru(
            CARRIED_SAID, max_chars=CARRIED_SAID_CHARS, weigh=_carried_said_chars
        )
        self._carried_lines: Lru[str | bytes, _Row] = Lru(
            LINE_CACHE, max_chars=TURN_CACHE_CHARS, weigh=_carried_chars
        )
        self._whole_lock = threading.Lock()
        """Held to change :attr:`_priors` or :attr:`_spans` (a summarizer may be shared by
        threads); a lookup takes no lock (one dictionary call)."""
        self._priors: dict[str, tuple[_Row, ...]] = {}
        """The rows of the last :data:`PRIORS` priors (:meth:`_carried`)."""
        self._spans: dict[
            tuple[int, int], tuple[tuple[weakref.ref[Turn], ...], tuple[_Row, ...]]
        ] = {}
        """The rows of the last :data:`SPANS` spans of turns, by first index and length,
        with weak references to the turns (:meth:`_from_turns`)."""
        self._rankings: dict[tuple[str, int], _Ranking] = {}
        """The candidates and their ranking of the last :data:`RANKINGS` summaries of a
        prior and a kept span (:meth:`_ranking`), by the prior and the id of the span's
        references to its turns (:meth:`_from_turns`)."""
        track(self, "forget_texts")

    def forget_texts(self) -> None:
        """Drop the rows and rankings kept whole (:attr:`_priors`, :attr:`_spans`,
        :attr:`_rankings`: texts of turns and summaries); the line caches are
        :class:`~tiermem.summaries._lru.Lru`, emptied on their own
        (:func:`~tiermem.text_caches.forget_texts`)."""
        with self._whole_lock:
            self._priors.clear()
            self._spans.clear()
            self._rankings.clear()

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        return self.summarize_sync(
            turns, prior=prior, target_tokens=target_tokens, must_keep=must_keep
        )

    def summarize_sync(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        """The summary of ``turns`` (oldest first): the sync core of :meth:`summarize`.

        Raises:
            ValidationError: ``target_tokens`` is below 1.
        """
        if target_tokens < 1:
            raise ValidationError(f"target_tokens must be at least 1, got {target_tokens}")
        rows, ranked = self._ranking(turns, prior or "")
        kept_items = [f"- {item.strip()}" for item in must_keep if item.strip()]
        return self._fit(kept_items, rows, ranked, target_tokens)

    def _ranking(self, turns: Sequence[Turn], prior: str) -> tuple[list[_Row], _Ranked]:
        """The candidate rows of ``prior`` and ``turns``, and those that stay ranked best
        first (:meth:`_ranked`): a pure function of the two, kept for the last
        :data:`RANKINGS` pairs whose span's rows are kept whole (:meth:`_from_turns`: the
        same turns, by identity). A pass's middle tier and the next pass's ancient tier
        rank the same prior (the ancient text) and span (the turns rolled into it), with
        other targets; so do a tier's first build and its validation retry."""
        rows = self._carried(prior)
        span = self._from_turns(turns, rows)
        key = (prior, id(span))
        if span is not None:
            held = self._rankings.get(key)
            if held is not None and held[0] is span:  # the entry holds it: an id not reused
                return held[1], held[2]
        if not any(row[_SCORE] > _TOPIC for row in rows):
            rows += self._topics(turns)
        ranked = _ranked(rows, _drop_stale(rows))
        if span is not None and len(prior) <= PRIOR_CHARS:
            with self._whole_lock:
                rankings = self._rankings
                rankings.pop(key, None)
                rankings[key] = (span, rows, ranked)
                if len(rankings) > RANKINGS:
                    del rankings[next(iter(rankings))]  # the oldest kept
        return rows, ranked

    # ------------------------------------------------------------------ candidates

    def _carried(self, prior: str) -> list[_Row]:
        """The candidate rows of ``prior``'s lines. A pass's new ancient tier is the prior
        of its middle tier and, at the next pass, of the ancient tier again: the rows of
        the last few priors are kept whole (:data:`PRIORS`)."""
        whole = self._priors.get(prior)
        if whole is not None:
            return list(whole)
        out = self._carried_rows(prior)
        if len(prior) <= PRIOR_CHARS:
            with self._whole_lock:
                priors = self._priors
                priors[prior] = tuple(out)
                if len(priors) > PRIORS:
                    del priors[next(iter(priors))]  # the oldest kept
        return out

    def _carried_rows(self, prior: str) -> list[_Row]:
        out: list[_Row] = []
        lines = self._carried_lines
        held = lines.held
        for raw in prior.splitlines():
            line = raw.strip()
            if not line:
                continue
            key = line if len(line) <= INLINE_KEY else text_key(line)
            kept = held(key)  # most lines were carried by the pass before: no call more
            if kept is None:
                kept = lines.get(key, partial(self._carried_line, line))
            out.append(kept)
        return out

    def _carried_line(self, line: str) -> _Row:
        """One line of a prior summary as a candidate (:data:`_Row`). A pure
        function of the line (and this summarizer's reader), so kept: a tier's lines are
        carried again by the next passes."""
        match = _LINE.match(line)
        if match is None:
            text = line[2:] if line.startswith("- ") else line
            stated = _SLOT_LINE.match(text)
            slots: _Slots = ()
            if stated:
                slot, value = stated.group("slot"), stated.group("value").strip()
                slots = (slot, value_key(value, slot=slot), value)
            score = _SLOT if stated else _CARRIED_UNINDEXED
            carried = f"- {text}"
            cost = self._line_tokens(carried)
            joined = self._newline_tokens(carried)
            return (_UNINDEXED, carried, score, slots, (), _body_of(carried), cost, joined)
        who, text, digits = match.group("who"), match.group("text"), match.group("index")
        key = (who, text if len(text) <= INLINE_KEY else text_key(text))
        said = self._carried_said.held(key)
        if said is None:
            said = self._carried_said.get(key, partial(self._carried_said_of, who, text))
        score, slots, wrong, body_cost, change = said
        if body_cost is None or change is None or not (digits.isascii() and digits.isdigit()):
            cost = self._indexed_tokens(line, digits, who, text)
            joined = self._newline_tokens(line)
        else:
            cost = self._prefix_tokens(digits, who) + body_cost
            joined = cost + change
        return (int(digits), line, score, slots, wrong, text, cost, joined)

    def _carried_said_of(self, who: str, text: str) -> _CarriedSaid:
        """What a carried line ``- [i] {who}: {text}`` is without its turn index: its
        score, slots and wrong values, the tokens of `` {text}`` and what a newline after
        it adds (None: counted from the line). Pure, so kept (:data:`CARRIED_SAID`): a
        sentence said again at a new turn is carried again under a new index."""
        role = "user" if who == "User" else "assistant"
        weight = _ROLE_WEIGHT["tool" if who.startswith(("Result of", "Assistant called"))
                              else role]  # fmt: skip
        readings = self._reader.read(text, role=role) if not who.startswith("Result") else []
        reading = _merge(readings)
        score = _score(reading, weight) if reading else _TOOL_CALL
        body_cost = change = None
        # A line as this summarizer writes them (a turn's speaker, a cut sentence): its
        # count is its parts' (:meth:`_indexed_tokens`).
        if self._additive and who in ("User", "Assistant") and text and not text[0].isspace():
            body_cost = self._body_tokens(text)
            change = self._newline_change(f"{who}: {text}")
        wrong = reading.wrong if reading else ()
        return (max(score, _TOOL_CALL), _slot_keys(reading), wrong, body_cost, change)

    def _from_turns(
        self, turns: Sequence[Turn], out: list[_Row]
    ) -> tuple[weakref.ref[Turn], ...] | None:
        """Append the candidate rows of ``turns`` to ``out``. A pass's recent span is the
        next pass's middle span and then rolls into the ancient tier, as the same
        :class:`~tiermem.models.turns.Turn` objects (the jobs keep a pass's turns for the
        next): the rows of the last few spans are kept whole, found by the turns'
        identity (:data:`SPANS`; turns are frozen). A kept span holds weak references to
        its turns, not the turns (up to 1 MB each, of any session, for as long as the
        summarizer lives): a turn that died is no longer found, so its identity, reused
        by another object, is never taken for it. Returns the kept span's references to its
        turns (None: not kept whole): one object per kept span, so it names these turns
        while it lives (the rows do not: two spans without a candidate share ``()``)."""
        if not turns:
            return None
        key = (turns[0].index, len(turns))
        held = self._spans.get(key)
        if held is not None and all(
            ref() is turn for ref, turn in zip(held[0], turns, strict=True)
        ):
            out += held[1]
            return held[0]
        start = len(out)
        self._read_turns(turns, out)
        if len(turns) <= SPAN_TURNS:
            rows = tuple(out[start:])
            if sum(len(row[_LINE_AT]) for row in rows) > SPAN_CHARS:
                return None  # its text blocks are kept, under the text cache's bound
            refs = tuple(map(weakref.ref, turns))
            with self._whole_lock:
                spans = self._spans
                spans.pop(key, None)  # a new span under an old key is the newest kept
                spans[key] = (refs, rows)
                if len(spans) > SPANS:
                    del spans[next(iter(spans))]  # the oldest kept
            return refs
        return None

    def _read_turns(self, turns: Sequence[Turn], out: list[_Row]) -> None:
        tool_names: dict[str, str] = {}
        cache = self._text_cache
        held = cache.held
        for turn in turns:
            if turn.redacted:
                continue
            index, role = turn.index, turn.role
            who = "User" if role == "user" else "Assistant"
            for block in turn.content:
                if isinstance(block, TextBlock):
                    # A text block's candidate lines are a pure function of the turn's
                    # index, role and text (and this summarizer's reader, cut and
                    # counter): kept, so a turn read again as another object (a pass in
                    # another worker) is not read again. A new turn's block is a miss:
                    # one lookup, its text's key made once (:meth:`_read_lines`).
                    text = block.text
                    text_id = text if len(text) <= INLINE_KEY else text_key(text)
                    key = (index, role, text_id)
                    fields = held(key)
                    if fields is None:
                        fields = self._read_lines(index, role, who, text, text_id)
                        cache.put(key, fields)
                    if len(fields) == _FIELDS:
                        out.append(fields)  # type: ignore[arg-type]  # one line: its row
                    elif fields:
                        out += [
                            fields[at : at + _FIELDS]  # type: ignore[misc]
                            for at in range(0, len(fields), _FIELDS)
                        ]
                elif isinstance(block, ToolUseBlock):
                    tool_names[block.tool_use_id] = block.name
                    args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
                    line = f"- [{index}] Assistant called {block.name}({self._cut(args)})"
                    out.append((index, line, _TOOL_CALL, (), (), None, None, None))
                elif isinstance(block, ToolResultBlock):
                    name = tool_names.get(block.tool_use_id, "a tool")
                    failed = " (failed)" if block.status == "error" else ""
                    label = f"Result of {name}{failed}"
                    salient = self._reader.read_salient(
                        text_of(block.content), role="assistant", limit=self._max_results
                    )
                    for reading in salient:
                        score = _score(reading, _ROLE_WEIGHT["tool"])
                        out.append(self._candidate(index, label, reading, score))

    def _read_lines(
        self, index: int, role: str, who: str, text: str, text_id: str | bytes | None = None
    ) -> _LineFields:
        """The candidate lines of one text block of turn ``index`` said by ``role``
        (``text_id``: the text's key, if made), from its index-free lines
        (:meth:`_said_lines`)."""
        if text_id is None:
            text_id = text if len(text) <= INLINE_KEY else text_key(text)
        key = (role, who, text_id)
        said = self._said.held(key)
        if said is None:
            said = self._said.get(key, partial(self._said_lines, role, who, text))
        if not said:
            return ()  # nothing worth a line ("ok, thanks"): no prefix to count
        out: list[int | str | float | tuple[str, ...] | None] = []
        digits = str(index)
        prefix = self._prefix_tokens(digits, who) if self._additive and digits.isdigit() else None
        fields = iter(said)
        for score, slots, wrong, body, body_cost, change in zip(
            fields, fields, fields, fields, fields, fields, strict=True
        ):
            line = f"- [{digits}] {who}: {body}"
            if prefix is None or body_cost is None or change is None:
                cost = self._indexed_tokens(line, digits, who, body)
                joined = self._newline_tokens(line)
            else:
                cost = prefix + body_cost
                joined = cost + change
            out += (index, line, score, slots, wrong, body, cost, joined)
        return tuple(out)

    def _said_lines(self, role: str, who: str, text: str) -> _SaidLines:
        """What a text block's candidate lines are without their turn index: for each,
        its score, slots, wrong values and body (the cut sentence), the tokens of `` {body}``
        and what a newline after the line adds (None: not known from parts). A pure
        function of the text, role and speaker, kept (:data:`SAID_CACHE`): the same
        sentences are said again at new turns ("ok, thanks", a tool's usual reply), and
        a new turn's lines then cost a line prefix's count, not a reading and a count."""
        out: list[float | _Slots | tuple[str, ...] | str | int | None] = []
        weight = _ROLE_WEIGHT[role]
        for reading in self._reader.read(text, role=role):
            score = _score(reading, weight)
            if score > 0:
                body = self._cut(reading.text)
                body_cost = change = None
                if self._additive and body:
                    body_cost = self._body_tokens(body)
                    # How the line ends, from a suffix that holds the space before the body.
                    change = self._newline_change(f"{who}: {body}")
                out += (score, _slot_keys(reading), reading.wrong, body, body_cost, change)
        return tuple(out)

    def _candidate(self, index: int, who: str, reading: SentenceReading, score: float) -> _Row:
        line = f"- [{index}] {who}: {self._cut(reading.text)}"
        return (index, line, score, _slot_keys(reading), reading.wrong, None, None, None)

    def _topics(self, turns: Sequence[Turn]) -> list[_Row]:
        out: list[_Row] = []
        for turn in turns:
            said = "\n".join(b.text for b in turn.content if isinstance(b, TextBlock))
            sentences = split_sentences(said) if turn.role == "user" and not turn.redacted else []
            if sentences:
                line = f"- [{turn.index}] User: {self._cut(sentences[0])}"
                out.append((turn.index, line, _TOPIC, (), (), None, None, None))
        return out

    def _cut(self, text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= self._max_chars else text[: self._max_chars - 1] + "…"

    # ------------------------------------------------------------------ budget

    def _fit(self, kept_items: list[str], rows: list[_Row], ranked: _Ranked, target: int) -> str:
        """The rows that stay (``ranked``: :func:`_ranked`, best first) that fit
        ``target`` after the items, taken best first, printed in turn order."""
        used = sum(self._line_tokens(line) for line in kept_items)
        chosen: list[tuple[int, int]] = []  # (index, order) of each line taken
        held = self._line_counts.held
        for _, _, order in ranked:
            row = rows[-order]
            cost = row[_COST]
            if cost is None:  # a tool call's or result's line, or a topic: look it up
                line = row[_LINE_AT]
                cost = held(line if len(line) <= INLINE_KEY else text_key(line))
                if cost is None:
                    cost = self._line_tokens(line)
            if used + cost <= target:
                chosen.append((row[_IDX], -order))
                used += cost
        chosen.sort()
        picked = [rows[at] for _, at in chosen]
        lines = [*kept_items, *(row[_LINE_AT] for row in picked)]
        text = "\n".join(lines)
        # Tokens of joined lines can differ from the sum of their parts by a token or two:
        # drop the weakest lines until the whole fits.
        # Every line starts with "-": the items' and the rows' (:data:`_Row`).
        while chosen and self._joined_tokens(lines, text, picked, dashed=True) > target:
            scores = {-order: -score for score, _, order in ranked}
            weakest = min(chosen, key=lambda pair: (scores[pair[1]], pair[0], pair[1]))
            chosen.remove(weakest)
            picked = [rows[at] for _, at in chosen]
            lines = [*kept_items, *(row[_LINE_AT] for row in picked)]
            text = "\n".join(lines)
        return text
