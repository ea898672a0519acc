"""A small bounded least-recently-used map, for the pure analyses a pass repeats.

Every tier of a pass is summarized from raw turns, so the same sentences, values and lines
are read again at every pass; their analyses are pure functions of their text, so a pass
can take them from here instead of running the rules again. Keys are the text itself or
its digest (:func:`text_key`), never a session and turn index, so a redacted or edited
turn is a new key and is read afresh. Entries are dropped oldest first past ``size``
entries or ``max_chars`` characters (as weighed by the caller), so a burst of 200 KB tool
outputs cannot grow the process.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from tiermem.text_caches import track

__all__ = [
    "INLINE_KEY",
    "Lru",
    "counted",
    "held_count",
    "keep_count",
    "text_key",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

INLINE_KEY = 256
"""Texts up to this many characters are their own key; longer ones are keyed by digest."""


def text_key(text: str) -> str | bytes:
    """``text`` itself if short, else its length and 128-bit BLAKE2b digest (a long text
    is not held twice, as a key and in its analysis)."""
    if len(text) <= INLINE_KEY:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return len(text).to_bytes(8, "little") + digest.digest()


_MISSING: Any = object()


class Lru(Generic[K, V]):
    """At most ``size`` entries and ``max_chars`` total weight; :meth:`get` computes and
    keeps a missing entry (its weight: ``weigh(value)``, 1 by default). Thread-safe: the
    engines are shared, and may be called from worker threads.

    The map holds each value itself (weights, when weighed, in a map of their own), not a
    ``(value, weight)`` pair: a value that is a tuple of strings and numbers (or of such
    tuples) is then no longer tracked by the garbage collector once a young and a middle
    collection have seen it (each collection stops tracking one level of nested tuples,
    outermost last), instead of staying tracked under its pair into the old generation,
    where every full collection walks it."""

    __slots__ = (
        "__weakref__",
        "_data",
        "_lock",
        "_max_chars",
        "_size",
        "_weigh",
        "_weight",
        "_weights",
        "hits",
        "misses",
    )

    def __init__(
        self,
        size: int,
        *,
        max_chars: int | None = None,
        weigh: Callable[[V], int] | None = None,
    ) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._size = size
        self._max_chars = max_chars
        self._weigh = weigh
        self._weights: dict[K, int] = {}
        """Weight of each entry, when ``weigh`` is given (else every entry weighs 1)."""
        self._weight = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        track(self)  # emptied by forget_texts (keys are texts)

    def get(self, key: K, compute: Callable[[], V]) -> V:
        data = self._data
        # A hit takes no lock: each OrderedDict call is atomic under the GIL (keys are
        # strings, bytes and tuples of them), and an entry another thread drops meanwhile
        # still held a right value (values are pure). ``hits`` may miss a count in a race.
        entry = data.get(key, _MISSING)
        if entry is not _MISSING:
            self.hits += 1
            try:
                data.move_to_end(key)
            except KeyError:  # dropped by another thread since: still a right value
                return entry  # type: ignore[no-any-return]
            return entry  # type: ignore[no-any-return]
        value = compute()  # outside the lock: pure, so a race computes it twice at worst
        self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key`` (a miss :meth:`get` would have computed it): for a
        caller that found ``key`` not :meth:`held` and computed the value itself, so that
        a miss costs one lookup, not two."""
        data = self._data
        weigh = self._weigh
        weights = self._weights
        with self._lock:  # one section per miss (a pass has a few dozen misses)
            self.misses += 1
            if data.pop(key, _MISSING) is not _MISSING:
                self._weight -= weights.pop(key) if weigh is not None else 1
            data[key] = value
            if weigh is None:
                self._weight += 1
            else:
                weight = weights[key] = weigh(value)
                self._weight += weight
            limit = self._max_chars
            while data and (len(data) > self._size or (limit is not None and self._weight > limit)):
                dropped, _ = data.popitem(last=False)
                self._weight -= weights.pop(dropped) if weigh is not None else 1

    def held(self, key: K) -> V | None:
        """The value kept for ``key`` (a hit, as in :meth:`get`), or None when it is not
        kept: nothing is computed (for a caller that may not need the value at all)."""
        data = self._data
        entry = data.get(key, _MISSING)
        if entry is _MISSING:
            return None
        self.hits += 1
        try:
            data.move_to_end(key)
        except KeyError:  # dropped by another thread since: still a right value
            return entry  # type: ignore[no-any-return]
        return entry  # type: ignore[no-any-return]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._weights.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._data)


class _Counter(Protocol):
    def count(self, text: str) -> int: ...


_COUNTS: weakref.WeakKeyDictionary[Any, Lru[str | bytes, int]] = weakref.WeakKeyDictionary()
COUNT_CACHE = 4_096
"""Texts whose token count is kept per counter (a pass counts each tier's text in the
engine, in the builder and after validation: the same text)."""


def _counts_of(counter: _Counter) -> Lru[str | bytes, int] | None:
    try:
        cache = _COUNTS.get(counter)
        if cache is None:
            cache = _COUNTS[counter] = Lru(COUNT_CACHE)
    except TypeError:  # not weakly referenceable: nothing is kept
        return None
    return cache


def counted(counter: _Counter, text: str) -> int:
    """``counter.count(text)``, kept per counter (LRU) when the counter can be weakly
    referenced (a counter is pure: the same text has the same count)."""
    cache = _counts_of(counter)
    if cache is None:
        return counter.count(text)
    return cache.get(text_key(text), partial(counter.count, text))


def held_count(counter: _Counter, text: str) -> int | None:
    """The count :func:`counted` keeps for ``text``, or None (nothing is counted)."""
    cache = _counts_of(counter)
    return None if cache is None else cache.held(text_key(text))


def keep_count(counter: _Counter, text: str, count: int) -> None:
    """Keep ``count`` as ``counter.count(text)`` (known without counting: see
    :meth:`~tiermem.summaries._line_tokens.LineTokens._joined_tokens`), for
    :func:`counted` to find."""
    cache = _counts_of(counter)
    if cache is not None:
        cache.get(text_key(text), lambda: count)
