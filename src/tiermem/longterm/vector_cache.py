"""In-process vector search over one user's stored vectors: :class:`UserVectors` (one user's
vectors of one dimension, every kind, as one matrix) and :class:`VectorCache` (the recently
queried users', bounded in entries and bytes).

Why a matrix per user and not per query: reading 20,000 vectors of 384 dimensions from
SQLite takes ~130 ms, scoring them from memory ~2 ms.

How a query is answered (numpy installed):

1. The rows are grouped by kind (contiguous, each group sorted by doc id), so the kinds
   asked for are one or a few slices of the matrix: nothing is copied or masked for them.
2. The matrix is float32 with unit rows, exactly the stored little-endian float32 values,
   so cosine is one matrix-vector product with the unit query, computed on the calling
   thread (see :func:`~tiermem.longterm.vectors.matvec`). float32 halves the bytes read
   per query against float64 (30 MB for 20,000 × 384 instead of 61), which is what the
   product's time is made of.
3. Expired documents are masked by an expiry column, so an entry stays valid past its
   documents' expiries (no re-read of the whole user when one document expires).
4. ``numpy.partition`` finds the ``limit``-th best float32 score; every row within
   :func:`rescore_margin` of it (twice float32's worst error on such a cosine) is scored
   again in float64, and the best ``limit`` of those are sorted by (score descending, doc
   id). So the result, scores included, is what a float64 product over every row gives:
   float32 changes no ranking, and ties are broken by doc id as before.
5. The owner's writes are applied to the loaded matrix (:meth:`UserVectors.write`): a
   rewritten or removed document's row is masked, a new vector is scored apart, until
   the entry is reloaded.

Without numpy the same arithmetic runs in pure Python (:func:`~tiermem.longterm.vectors.
cosine_top` semantics), about 100 times slower.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from tiermem.clock import Clock
from tiermem.longterm.vectors import HAVE_NUMPY, matvec, unit_vector, unpack_vector

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "MAX_CHANGES",
    "UserVectors",
    "VectorCache",
    "VectorRow",
    "VectorWrite",
    "rescore_margin",
]

_np: Any
try:  # optional: the fast path, never a requirement
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None


def rescore_margin(dims: int) -> float:
    """How far below the ``limit``-th best float32 score a row is still scored again in
    float64: twice the worst float32 error of a cosine of unit vectors of ``dims``
    dimensions, since both that row's and the ``limit``-th score may be off by it. The
    error is at most (dims + 1)·2⁻²⁴ whatever the order of the sum (dims products summed,
    plus the query's own rounding to float32): 4.6e-5 for 384 dimensions."""
    return 2 * (dims + 2) * 2.0**-24


DEFAULT_CACHE_BYTES = 256 << 20
"""Bytes of matrices a :class:`VectorCache` holds at most by default (8 users of 20,000
384-dimension vectors)."""

_NEVER = (1 << 63) - 1  # expiry of a document that never expires, in µs
_GONE = -(1 << 63)  # expiry of a row hidden by a later write: before any query's now

VectorRow = tuple[str, str, bytes, int | None]
"""One stored vector: doc id, kind, packed float32 unit vector, expiry (epoch µs, or None)."""

VectorWrite = tuple[str, str, bytes | None, int, int | None]
"""One document written: doc id, kind, packed float32 unit vector (None: removed, or
stored without a vector), its dimension (0 without), expiry (epoch µs, or None)."""

MAX_CHANGES = 512
"""Writes an entry takes (see :meth:`VectorCache.apply`) before it is dropped and reloaded:
each written document is scored apart on every query, a little slower than a row."""


class UserVectors:
    """One user's vectors of one dimension, every kind, ready to be searched in process.

    Built from the stored rows (:data:`VectorRow`); later writes of the owner are applied
    with :meth:`write`. :meth:`top` answers a query for any subset of kinds, leaving out
    documents expired at the given time.
    """

    __slots__ = (
        "_expires",
        "_gone",
        "_kinds",
        "_matrix",
        "_next_expiry",
        "_row_of",
        "_spans",
        "_written",
        "_written_matrix",
        "dims",
        "keys",
    )

    def __init__(self, rows: Sequence[VectorRow], dims: int, *, use_numpy: bool = HAVE_NUMPY):
        ordered = sorted(rows, key=lambda row: (row[1], row[0]))
        self.dims = dims
        self.keys: list[str] = [row[0] for row in ordered]
        self._kinds: list[str] = [row[1] for row in ordered]
        self._spans: dict[str, tuple[int, int]] = {}
        for i, kind in enumerate(self._kinds):
            start, _ = self._spans.get(kind, (i, i))
            self._spans[kind] = (start, i + 1)
        expiries = [row[3] for row in ordered]
        self._next_expiry: int | None = min((e for e in expiries if e is not None), default=None)
        self._matrix: Any
        self._expires: Any
        if use_numpy and _np is not None:
            packed = b"".join(row[2] for row in ordered)
            matrix = _np.frombuffer(packed, dtype="<f4").reshape(len(ordered), dims)
            # Native byte order (a no-op on little-endian hosts), contiguous: the product
            # streams it as is, with no conversion per query.
            self._matrix = _np.ascontiguousarray(matrix, dtype=_np.float32)
            self._expires = _np.array(
                [_NEVER if e is None else e for e in expiries], dtype=_np.int64
            )
        else:
            self._matrix = [unpack_vector(row[2]) for row in ordered]
            self._expires = [_NEVER if e is None else e for e in expiries]
        # Writes applied since the load (see write): rows hidden, documents added.
        self._row_of: dict[str, int] | None = None
        self._gone = 0
        self._written: dict[str, tuple[str, bytes, int]] = {}
        self._written_matrix: Any = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Bytes of vectors held (4 per value), written ones included."""
        return (len(self.keys) + len(self._written)) * self.dims * 4

    @property
    def changes(self) -> int:
        """Writes applied since the load (rows hidden plus documents added): each costs a
        little on every query, so the owner reloads past a bound."""
        return self._gone + len(self._written)

    def write(self, doc_id: str, kind: str, blob: bytes | None, expires_us: int | None) -> None:
        """Apply a write of one document made to the file: its former vector is no longer
        searched; ``blob`` (its packed float32 unit vector of this dimension), when given,
        is searched from now on. None: the document was removed, or has no vector of this
        dimension now."""
        if self._row_of is None:
            self._row_of = {doc: i for i, doc in enumerate(self.keys)}
        row = self._row_of.pop(doc_id, None)
        if row is not None:
            self._expires[row] = _GONE
            self._next_expiry = _GONE
            self._gone += 1
        if self._written.pop(doc_id, None) is not None or blob is not None:
            self._written_matrix = None
        if blob is not None:
            self._written[doc_id] = (kind, blob, _NEVER if expires_us is None else expires_us)

    def top(
        self, query: Sequence[float], kinds: Collection[str], now_us: int, limit: int
    ) -> list[tuple[str, str, float]]:
        """The ``limit`` documents of ``kinds`` most similar to ``query`` and not expired at
        ``now_us``, best first, as (doc id, kind, cosine); ties broken by doc id. Empty for
        a zero query or one of another dimension."""
        unit = unit_vector(query)
        if unit is None or len(unit) != self.dims or limit < 1:
            return []
        wanted = set(kinds)
        found = [
            (self.keys[row], self._kinds[row], score)
            for row, score in self._top_rows(unit, wanted, now_us, limit)
        ]
        if self._written:
            found += self._top_written(unit, wanted, now_us)
            found.sort(key=lambda hit: (-hit[2], hit[0]))
        return found[:limit]

    def _top_written(
        self, unit: tuple[float, ...], kinds: set[str], now_us: int
    ) -> list[tuple[str, str, float]]:
        """Every written document of ``kinds`` not expired, scored (float64)."""
        written = list(self._written.items())
        if _np is not None and not isinstance(self._matrix, list):
            if self._written_matrix is None:
                packed = b"".join(blob for _, (_, blob, _) in written)
                rows = _np.frombuffer(packed, dtype="<f4").reshape(len(written), self.dims)
                self._written_matrix = rows.astype(_np.float64)
            scores = matvec(self._written_matrix, _np.asarray(unit, dtype=_np.float64)).tolist()
        else:
            scores = [
                math.fsum(a * b for a, b in zip(unpack_vector(blob), unit, strict=True))
                for _, (_, blob, _) in written
            ]
        return [
            (doc_id, kind, score)
            for (doc_id, (kind, _, expires)), score in zip(written, scores, strict=True)
            if kind in kinds and expires > now_us
        ]

    def _top_rows(
        self, unit: tuple[float, ...], kinds: set[str], now_us: int, limit: int
    ) -> list[tuple[int, float]]:
        """The best ``limit`` rows of the loaded matrix, as (row, cosine)."""
        spans: list[tuple[int, int]] = []
        for start, stop in sorted(self._spans[k] for k in kinds if k in self._spans):
            if spans and spans[-1][1] == start:  # adjacent kinds: one slice
                start = spans.pop()[0]
            spans.append((start, stop))
        if not spans:
            return []
        expiring = self._next_expiry is not None and self._next_expiry <= now_us
        if isinstance(self._matrix, list):
            return self._top_python(unit, spans, now_us if expiring else None, limit)
        return self._top_numpy(unit, spans, now_us if expiring else None, limit)

    def _top_numpy(
        self,
        unit: tuple[float, ...],
        spans: list[tuple[int, int]],
        now_us: int | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        np = _np
        matrix = self._matrix
        q32 = np.asarray(unit, dtype=np.float32)
        if len(spans) == 1:
            start, stop = spans[0]
            scores = matvec(matrix[start:stop], q32)
            rows = None
        else:
            scores = np.concatenate([matvec(matrix[a:b], q32) for a, b in spans])
            rows = np.concatenate([np.arange(a, b) for a, b in spans])
            start = 0
        if now_us is not None:
            expires = (
                self._expires[spans[0][0] : spans[0][1]] if rows is None else self._expires[rows]
            )
            scores[expires <= now_us] = -np.inf
        count = len(scores)
        if limit < count:
            kth = np.partition(scores, count - limit)[count - limit]
            chosen = np.flatnonzero(scores >= kth - rescore_margin(self.dims))
        else:
            chosen = np.arange(count)
        chosen = chosen[np.isfinite(scores[chosen])]
        if len(chosen) == 0:
            return []
        picked = chosen + start if rows is None else rows[chosen]
        exact = matvec(matrix[picked].astype(np.float64), np.asarray(unit, dtype=np.float64))
        keys = self.keys
        ranked = sorted(
            zip(picked.tolist(), exact.tolist(), strict=True),
            key=lambda pair: (-pair[1], keys[pair[0]]),
        )
        return ranked[:limit]

    def _top_python(
        self,
        unit: tuple[float, ...],
        spans: list[tuple[int, int]],
        now_us: int | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        scored = []
        for start, stop in spans:
            for i in range(start, stop):
                if now_us is not None and self._expires[i] <= now_us:
                    continue
                row = self._matrix[i]
                scored.append((i, math.fsum(a * b for a, b in zip(row, unit, strict=True))))
        keys = self.keys
        return heapq.nsmallest(limit, scored, key=lambda pair: (-pair[1], keys[pair[0]]))


class VectorCache:
    """The :class:`UserVectors` of the recently queried users, keyed by (user id, dimension).

    Bounded: at most ``max_entries`` entries and ``max_bytes`` of vectors (the least
    recently used go first; one entry larger than ``max_bytes`` alone is kept, as a query
    needs it); :meth:`resize` lowers (or raises) both at run time and evicts at once. An
    entry is served for ``ttl`` after it was loaded (so another process's writes to the
    same file are seen within it).

    The owner's own writes are applied to the entries (:meth:`apply`) rather than dropping
    them: a conversation indexes its turns as it goes, and dropping would make the next
    query read the user's every vector again (~130 ms for 20,000). Past
    :data:`MAX_CHANGES` writes (or a quarter of the entry's rows) an entry is dropped and
    the next query reloads it. A load that overlaps a write of the same user (between
    :meth:`begin_load` and :meth:`end_load`) may have read the file before the write, so
    it is used for its query but not kept.
    """

    def __init__(
        self,
        max_entries: int,
        ttl: timedelta,
        clock: Clock,
        max_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[tuple[str, int], tuple[UserVectors, datetime]] = OrderedDict()
        self._bytes = 0
        # Users with loads in flight: how many, and whether a write came in meanwhile.
        self._loading: dict[str, tuple[int, bool]] = {}

    def get(self, user_id: str, dims: int) -> UserVectors | None:
        """The user's vectors of ``dims`` dimensions, if loaded less than ``ttl`` ago."""
        key = (user_id, dims)
        found = self._entries.get(key)
        if found is None:
            return None
        vectors, loaded_at = found
        if self._clock.now() - loaded_at >= self._ttl:
            self._pop(key)
            return None
        self._entries.move_to_end(key)
        return vectors

    def begin_load(self, user_id: str) -> None:
        """A read of the user's vectors from the file starts; pair with :meth:`end_load`."""
        loads, dirty = self._loading.get(user_id, (0, False))
        self._loading[user_id] = (loads + 1, dirty)

    def end_load(self, user_id: str, vectors: UserVectors | None, loaded_at: datetime) -> None:
        """The read begun by :meth:`begin_load` ended (``vectors`` None: it failed): keep
        what it read unless one of this user's writes was applied meanwhile."""
        loads, dirty = self._loading.pop(user_id, (1, True))
        if loads > 1:
            self._loading[user_id] = (loads - 1, dirty)
        if vectors is not None and not dirty:
            self.put(user_id, vectors, loaded_at)

    def apply(self, user_id: str, writes: Sequence[VectorWrite]) -> None:
        """Apply writes of the user's documents, made to the file, to their entries."""
        if user_id in self._loading:
            self._loading[user_id] = (self._loading[user_id][0], True)
        for key in [k for k in self._entries if k[0] == user_id]:
            vectors = self._entries[key][0]
            self._bytes -= vectors.nbytes
            for doc_id, kind, blob, dims, expires_us in writes:
                vectors.write(doc_id, kind, blob if dims == key[1] else None, expires_us)
            self._bytes += vectors.nbytes
            if vectors.changes > max(MAX_CHANGES, len(vectors) // 4):
                self._pop(key)
        self._evict()

    def put(self, user_id: str, vectors: UserVectors, loaded_at: datetime) -> None:
        """Keep ``vectors`` (read from the file at ``loaded_at``), evicting as needed."""
        key = (user_id, vectors.dims)
        self._pop(key)
        self._entries[key] = (vectors, loaded_at)
        self._bytes += vectors.nbytes
        self._evict()

    @property
    def nbytes(self) -> int:
        """Bytes of vectors held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def resize(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        """New bounds, applied at once (a smaller one evicts the least recently used)."""
        if max_entries is not None:
            self.max_entries = max_entries
        if max_bytes is not None:
            self.max_bytes = max_bytes
        self._evict()

    def drop_users(self, user_ids: Collection[str]) -> None:
        """Forget these users' vectors (their documents changed)."""
        for user_id in user_ids:
            if user_id in self._loading:
                self._loading[user_id] = (self._loading[user_id][0], True)
        for key in [k for k in self._entries if k[0] in user_ids]:
            self._pop(key)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _pop(self, key: tuple[str, int]) -> None:
        found = self._entries.pop(key, None)
        if found is not None:
            self._bytes -= found[0].nbytes

    def _evict(self) -> None:
        while len(self._entries) > self.max_entries or (
            len(self._entries) > 1 and self._bytes > self.max_bytes
        ):
            _, (vectors, _) = self._entries.popitem(last=False)
            self._bytes -= vectors.nbytes
