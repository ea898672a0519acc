"""A token counter that remembers the counts of texts it has seen (:class:`MemoTokenCounter`).

Context assembly counts every item it places, on every call: the rolling summary (about a
thousand tokens in a long session), structured memory and each hot turn. Between two calls
those texts rarely change, and a cl100k count is a pure function of the text, so counting
them again is wasted work that grows with the summary (the one part of a window that
grows with the session). The memo keys on the text itself, so a changed summary, a
redacted turn or a new tier is a new key and is counted afresh: a count is never stale.

Bounded: at most ``max_entries`` texts and ``max_chars`` characters of them, least recently
used dropped first; :meth:`MemoTokenCounter.shrink` trims it further (or empties it) when
the process wants the memory back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tiermem.errors import ValidationError
from tiermem.text_caches import track
from tiermem.tokens import BaseTokenCounter, TokenCounter

__all__ = ["MemoTokenCounter"]

MEMO_ENTRIES = 4_096
"""Texts kept by default: the sections and hot windows of a few hundred busy sessions."""
MEMO_CHARS = 8_000_000
"""Characters kept by default (about 8 MB of keys): a burst of large tool outputs cannot
grow the process past it."""
MIN_MEMO_CHARS = 8
"""Shorter texts are counted every time (a lookup costs about 0.5 µs, a cl100k count of a
short sentence about 5 µs: a memo pays from a few characters on)."""


class MemoTokenCounter(BaseTokenCounter):
    """``counter``'s counts, remembered per text (exact: the key is the whole text).

    Thread-safe like the counter it wraps. Block counts (images, documents, tool results)
    follow :class:`~tiermem.tokens.BaseTokenCounter`'s rules on top of the remembered text
    counts; a wrapped counter that counts blocks its own way is asked directly for them.

    Raises:
        ValidationError: a bound is negative.
    """

    def __init__(
        self,
        counter: TokenCounter,
        *,
        max_entries: int = MEMO_ENTRIES,
        max_chars: int = MEMO_CHARS,
    ) -> None:
        if max_entries < 0 or max_chars < 0:
            raise ValidationError(
                f"memo bounds must be >= 0, got max_entries={max_entries}, max_chars={max_chars}"
            )
        self.counter = counter
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # Our block rules apply only if they are the wrapped counter's rules too.
        self._own_blocks = (
            isinstance(counter, BaseTokenCounter)
            and type(counter).count_blocks is BaseTokenCounter.count_blocks
        )
        track(self)  # emptied by forget_texts (keys are texts)

    @property
    def size(self) -> int:
        """Texts held. (Not ``__len__``: an empty memo must not be falsy where a counter
        is expected, as in ``counter or TiktokenCounter()``.)"""
        return len(self._counts)

    @property
    def chars(self) -> int:
        """Characters of the texts held."""
        return self._chars

    def count(self, text: str) -> int:
        if len(text) < MIN_MEMO_CHARS:
            return self.counter.count(text)
        counts = self._counts
        with self._lock:
            held = counts.get(text)
            if held is not None:
                counts.move_to_end(text)
                self.hits += 1
                return held
            self.misses += 1
        tokens = self.counter.count(text)  # outside the lock: pure, a race counts twice
        with self._lock:
            if text not in counts:
                counts[text] = tokens
                self._chars += len(text)
                self._trim(self.max_entries, self.max_chars)
        return tokens

    def count_blocks(self, blocks: Sequence[Any]) -> int:
        if self._own_blocks:
            return super().count_blocks(blocks)
        return self.counter.count_blocks(blocks)

    def shrink(self, max_entries: int = 0, max_chars: int | None = None) -> int:
        """Drop the least recently used texts down to ``max_entries`` (and ``max_chars``
        characters, when given); ``shrink()`` empties the memo. Returns how many were
        dropped. The bounds for later counts are unchanged."""
        with self._lock:
            before = len(self._counts)
            self._trim(max(0, max_entries), self._chars if max_chars is None else max_chars)
            return before - len(self._counts)

    def clear(self) -> None:
        """Empty the memo (``shrink()``)."""
        self.shrink()

    def _trim(self, entries: int, chars: int) -> None:
        counts = self._counts
        while counts and (len(counts) > entries or self._chars > chars):
            text, _ = counts.popitem(last=False)
            self._chars -= len(text)
