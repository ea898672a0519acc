"""BM25 over packed posting lists, shared by every index: the posting value encoding,
exact MaxScore top-k (:func:`bm25_top`) and the packed byte form the Redis index stores.

A posting maps a document to one int, ``length * POSTING_SHIFT + tf``
(:func:`posting_value`): the document's length travels with the term frequency, so scoring
reads nothing but the posting lists. The in-process index keeps them as dicts; the Redis
index keeps each (kind, term) list as two byte strings, the document numbers (u32, ascending)
and the values (u64; 0 marks a removed document), both little-endian, decoded in bulk by
:func:`unpack_postings` or scored whole by :func:`bm25_top_packed`.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tiermem.longterm.text import bm25_idf, bm25_term

_np: Any
try:
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None

__all__ = [
    "NUM_BYTES",
    "POSTING_SHIFT",
    "VALUE_BYTES",
    "bm25_scores",
    "bm25_top",
    "bm25_top_dense",
    "bm25_top_packed",
    "pack_numbers",
    "pack_values",
    "posting_value",
    "top_scores",
    "unpack_numbers",
    "unpack_postings",
]

POSTING_SHIFT = 1 << 20
"""A posting's value is ``length * POSTING_SHIFT + tf``: the document's length travels with
the term frequency, so scoring reads nothing but the posting lists."""


def posting_value(length: int, tf: int) -> int:
    """A posting's packed value (every index stores this one int)."""
    return length * POSTING_SHIFT + tf


NUM_BYTES = 4
"""Bytes of one document number in a packed posting list (u32, little-endian)."""
VALUE_BYTES = 8
"""Bytes of one packed value in a packed posting list (u64, little-endian)."""
_U32 = "I" if array("I").itemsize == NUM_BYTES else "L"
_U64 = "Q"
_SWAP = sys.byteorder == "big"


def unpack_numbers(raw: bytes) -> array[int]:
    """Document numbers packed as u32 little-endian, as an array (one copy, no loop)."""
    out = array(_U32)
    out.frombytes(raw)
    if _SWAP:
        out.byteswap()
    return out


def unpack_postings(numbers: bytes, values: bytes) -> dict[int, int]:
    """One packed posting list (parallel number and value strings) as doc number → value;
    entries whose value is 0 (a removed document's tombstone) are left out.

    Why two strings and not one of records: each decodes as one array in C, and the dict
    is built from two arrays by ``zip`` (about 0.1 µs a posting; a 5,000-posting list in
    half a millisecond), without a Python-level loop.
    """
    found = array(_U64)
    found.frombytes(values)
    if _SWAP:
        found.byteswap()
    if 0 in found:  # tombstones of removed documents
        return {n: v for n, v in zip(unpack_numbers(numbers), found, strict=True) if v}
    return dict(zip(unpack_numbers(numbers), found, strict=True))


def pack_numbers(numbers: Iterable[int]) -> bytes:
    """The packed form :func:`unpack_numbers` reads."""
    out = array(_U32, numbers)
    if _SWAP:
        out.byteswap()
    return out.tobytes()


def pack_values(values: Iterable[int]) -> bytes:
    """The packed value string of :func:`unpack_postings`."""
    out = array(_U64, values)
    if _SWAP:
        out.byteswap()
    return out.tobytes()


_K = TypeVar("_K", str, bytes, int)
_V = TypeVar("_V", int, bytes)


def bm25_scores(
    postings: Iterable[tuple[int, Mapping[_K, _V]]],
    docs: int,
    average: float,
) -> dict[_K, float]:
    """BM25 of every document in ``postings``: (df, doc → packed ``length * POSTING_SHIFT
    + tf``) per query term, in query order, over a user's ``docs`` documents of
    ``average`` length. Packed values may be ints or their decimal bytes (a Redis reply).

    Why this shape: a term's contribution depends only on (tf, length), and a posting list
    of thousands has a few dozen distinct pairs, so :func:`bm25_term` runs once per pair
    and each posting costs one dict lookup and one addition (~0.2 µs; a broad query over
    5,000 postings scores in about 1 ms in pure Python). Sums run in query order, so the
    floats equal every other index's.
    """
    scores: dict[_K, float] = {}
    for df, posting in postings:
        if not posting:
            continue
        idf = bm25_idf(docs, df)
        parts: dict[_V, float] = {}
        for value in set(posting.values()):
            tf, length = int(value) % POSTING_SHIFT, int(value) // POSTING_SHIFT
            parts[value] = bm25_term(idf, tf, length, average)
        if not scores:
            scores = {doc: parts[value] for doc, value in posting.items()}
            continue
        get = scores.get
        for doc, value in posting.items():
            scores[doc] = get(doc, 0.0) + parts[value]
    return scores


def top_scores(
    scores: Mapping[_K, float], count: int, keep: Callable[[_K], bool]
) -> list[tuple[_K, float]]:
    """The ``count`` best of ``scores`` that ``keep`` accepts, best first, ties by key.

    ``keep`` (kind and expiry filters) runs on the best ``2 * count`` (and every score
    tied with the last of them) first, and on everything only when that left too few:
    O(n log count), never a sort of every matched document.
    """
    wanted = 2 * count
    if len(scores) > wanted:
        floor = heapq.nlargest(wanted, scores.values())[-1]
        ranked = [(key, s) for key, s in scores.items() if s >= floor and keep(key)]
        if len(ranked) < count:
            ranked = [(key, s) for key, s in scores.items() if keep(key)]
    else:
        ranked = [(key, s) for key, s in scores.items() if keep(key)]
    ranked.sort(key=lambda pair: (-pair[1], pair[0]))
    return ranked[:count]


_MARGIN = 1e-9
"""Relative slack of the pruning decisions in :func:`bm25_top`: its partial sums run in
another order than the final ones, so they may differ in the last bits."""


def bm25_top(
    postings: Sequence[tuple[int, Mapping[_K, _V]]],
    docs: int,
    average: float,
    count: int,
    keep: Callable[[_K], bool],
    groups: Sequence[Mapping[_V, Collection[_K]]] | None = None,
    *,
    ties: bool = False,
) -> list[tuple[_K, float]]:
    """``top_scores(bm25_scores(postings, docs, average), count, keep)``, reading less.

    With ``ties``, every document whose score equals the ``count``-th one follows too: a
    caller whose keys are not the documents' ids (the Redis index's document numbers)
    orders ties by id itself and cuts to ``count`` after.

    Why: a broad query's common terms have posting lists of thousands but weigh little.
    Terms are taken best bound first (a term's bound: its largest contribution to any
    document). Once ``count`` documents are kept, the ``count``-th best partial score is a
    floor the top must reach, so (MaxScore-style, exact):

    * a document first met in a term whose contribution plus the bounds of the terms left
      cannot reach the floor is not taken in;
    * a held document whose partial score plus those bounds cannot reach it is dropped;
    * then the held documents are updated by lookup, and with ``groups`` (per posting,
      packed value → documents: the in-process index keeps them) only the values that can
      reach the floor are read: a common term's list is not walked at all.

    A document left out can never reach the top, so the top is the plain one; its scores
    are summed again in query order, so they equal :func:`bm25_scores`' to the bit.
    """
    terms: list[tuple[float, dict[_V, float], Mapping[_K, _V], Mapping[_V, Collection[_K]]]] = []
    for n, (df, posting) in enumerate(postings):
        if not posting:
            continue
        idf = bm25_idf(docs, df)
        parts: dict[_V, float] = {}
        for value in set(posting.values()) if groups is None else groups[n]:
            tf, length = int(value) % POSTING_SHIFT, int(value) // POSTING_SHIFT
            parts[value] = bm25_term(idf, tf, length, average)
        terms.append((max(parts.values()), parts, posting, {} if groups is None else groups[n]))
    left = sum(term[0] for term in terms)
    scores: dict[_K, float] = {}
    floor = 0.0
    done = 0.0
    for bound, parts, posting, by_value in sorted(terms, key=lambda term: -term[0]):
        left -= bound
        cutoff = floor - left  # what a document first met here must add to reach the floor
        if not scores:
            scores = {doc: parts[value] for doc, value in posting.items() if parts[value] >= cutoff}
        elif cutoff > 0 and len(scores) < len(posting):
            for doc, score in scores.items():
                held = posting.get(doc)
                if held is not None:
                    scores[doc] = score + parts[held]
            admit = {value: part for value, part in parts.items() if part >= cutoff}
            if by_value:
                for value, part in admit.items():
                    for doc in by_value[value]:
                        if doc not in scores:
                            scores[doc] = part
            elif admit:  # no groups (a Redis reply): one walk, most values rejected
                for doc, value in posting.items():
                    if value in admit and doc not in scores:
                        scores[doc] = admit[value]
        else:
            get = scores.get
            for doc, value in posting.items():
                part = parts[value]
                sofar = get(doc)
                if sofar is not None:
                    scores[doc] = sofar + part
                elif part >= cutoff:
                    scores[doc] = part
        done += bound
        # The floor is at most the best partial score, at most ``done``: while that is no
        # more than ``left``, a floor could neither keep a document out nor drop one.
        if len(scores) >= count and done > left:
            best = top_scores(scores, count, keep)
            if len(best) == count and best[-1][1] * (1.0 - _MARGIN) > floor:
                floor = best[-1][1] * (1.0 - _MARGIN)
                scores = {doc: s for doc, s in scores.items() if s + left >= floor}
    # Partial sums ran best bound first (and a document taken in late lacks the terms it
    # was left out of, which kept it below the floor): sum the candidates in query order.
    exact: dict[_K, float] = {}
    for doc, score in scores.items():
        if score < floor or not keep(doc):
            continue
        total = 0.0
        for _, parts, posting, _ in terms:
            found = posting.get(doc)
            if found is not None:
                total += parts[found]
        exact[doc] = total
    top = top_scores(exact, count, lambda doc: True)
    if ties and len(top) == count:
        # A document tied with the last one was never pruned: it never fell below floor.
        last, chosen = top[-1][1], {doc for doc, _ in top}
        top += [(doc, s) for doc, s in exact.items() if s == last and doc not in chosen]
    return top


PackedList = tuple[int, bytes, bytes]
"""One packed posting list to score: (df of its term, numbers string, values string)."""


def bm25_top_packed(
    lists: Sequence[PackedList],
    docs: int,
    average: float,
    count: int,
    hidden: Collection[int] = (),
) -> list[tuple[int, float]]:
    """The best ``count`` document numbers of packed lists (in query order), and every one
    tied with the last; numbers in ``hidden`` (expired) are left out. Unordered among ties.

    With numpy, decoding and summing run in C over the whole lists (one ``bincount``; sums
    accumulate in query order, so they equal :func:`bm25_scores` to the bit); without it,
    :func:`unpack_postings` and :func:`bm25_top`.
    """
    if _np is None:
        postings = [(df, unpack_postings(n, v)) for df, n, v in lists if n]
        keep = (lambda number: number not in hidden) if hidden else (lambda number: True)
        return bm25_top(postings, docs, average, count, keep, ties=True)
    np = _np
    numbers, parts = [], []
    for df, raw_numbers, raw_values in lists:
        if not raw_numbers:
            continue
        values = np.frombuffer(raw_values, dtype="<u8")
        held = np.frombuffer(raw_numbers, dtype="<u4")
        if not values.all():  # tombstones of removed documents
            live = values != 0
            values, held = values[live], held[live]
            if not len(values):
                continue
        numbers.append(held)
        parts.append(_term_weights(values, docs, df, average))
    if not numbers:
        return []
    found, slot = np.unique(np.concatenate(numbers), return_inverse=True)
    # bincount adds each slot's weights in input order: query order, from 0.0.
    scores = np.bincount(slot, weights=np.concatenate(parts), minlength=len(found))
    if hidden:
        scores[np.isin(found, np.fromiter(hidden, dtype=np.int64))] = -np.inf
    live = int(np.count_nonzero(scores > -np.inf))
    if live == 0:
        return []
    if live > count:
        last = np.partition(scores, len(scores) - count)[len(scores) - count]
        chosen = np.nonzero(scores >= last)[0]
    else:
        chosen = np.nonzero(scores > -np.inf)[0]
    return list(zip(found[chosen].tolist(), scores[chosen].tolist(), strict=True))


def _term_weights(values: Any, docs: int, df: int, average: float) -> Any:
    """One term's BM25 weight per posting (numpy, float64), from its packed values: the
    weight is computed once per distinct (frequency, length) pair and gathered back."""
    np = _np
    distinct, which = np.unique(values, return_inverse=True)
    idf = bm25_idf(docs, df)
    part = np.fromiter(
        (bm25_term(idf, v % POSTING_SHIFT, v // POSTING_SHIFT, average) for v in distinct.tolist()),
        dtype=np.float64,
        count=len(distinct),
    )
    return part[which]


DenseList = tuple[int, Any, Any]
"""One posting list as numpy arrays: (df of its term, slot numbers (u32), packed values
(u64)); a slot is a document's small number, an index into the caller's ``keys``."""


def bm25_top_dense(
    lists: Sequence[DenseList],
    docs: int,
    average: float,
    count: int,
    keep: Callable[[str], bool],
    keys: Sequence[str | None],
) -> list[tuple[str, float]]:
    """``top_scores(bm25_scores(...), count, keep)`` with numpy, for the in-process index:
    ``lists`` in query order, each document by its slot (``keys[slot]`` is its id).

    Why: when a query's terms are all about equally common (Japanese split into two-
    character terms, each in an eighth of the documents), :func:`bm25_top` cannot prune
    and walks every list in Python; here each list is one gather and all of them one
    ``bincount`` over the slots (sums in query order from 0.0, so they equal
    :func:`bm25_scores` to the bit), and ``keep`` and the tie order by id run on the
    candidates only, as in :func:`top_scores`. Slower than :func:`bm25_top` for one or two
    terms (fixed numpy costs); needs numpy (callers check :data:`HAS_NUMPY`).
    """
    np = _np
    slots, weights = [], []
    for df, numbers, values in lists:
        if not len(numbers):
            continue
        slots.append(numbers)
        weights.append(_term_weights(values, docs, df, average))
    if not slots:
        return []
    every = np.concatenate(slots)
    # bincount adds each slot's weights in input order: query order, from 0.0.
    scores = np.bincount(every, weights=np.concatenate(weights), minlength=len(keys))
    matched = np.unique(every)
    found = scores[matched]
    wanted = 2 * count
    if len(matched) > wanted:
        # top_scores' rule: ``keep`` on the best 2 * count and their ties first.
        floor = np.partition(found, len(found) - wanted)[len(found) - wanted]
        chosen = np.nonzero(found >= floor)[0]
        ranked = [
            (key, score)
            for slot, score in zip(matched[chosen].tolist(), found[chosen].tolist(), strict=True)
            if keep(key := keys[slot])
        ]
        if len(ranked) >= count:
            ranked.sort(key=lambda pair: (-pair[1], pair[0]))
            return ranked[:count]
    ranked = [
        (key, score)
        for slot, score in zip(matched.tolist(), found.tolist(), strict=True)
        if keep(key := keys[slot])
    ]
    ranked.sort(key=lambda pair: (-pair[1], pair[0]))
    return ranked[:count]


HAS_NUMPY = _np is not None
"""Whether :func:`bm25_top_dense` can run (numpy is installed)."""
