"""Brute-force cosine similarity, shared by the indexes that search vectors themselves.

numpy is used when it is installed (one matrix product per query); without it the same
arithmetic runs in pure Python, about 100 times slower (see ``docs/recall.md`` for costs).
numpy is optional: tiermem never depends on it.

Vectors are stored as little-endian float32 (4 bytes per dimension), the precision every
embedding model publishes; cosine is computed in float64.
"""

from __future__ import annotations

import heapq
import math
import sys
from array import array
from collections.abc import Sequence
from typing import Any

__all__ = [
    "HAVE_NUMPY",
    "cosine",
    "cosine_top",
    "cosines",
    "matrix_of",
    "matvec",
    "pack_vector",
    "unit_vector",
    "unpack_vector",
]

_np: Any
try:  # optional: a faster path, never a requirement
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None

HAVE_NUMPY = _np is not None
_vecdot: Any = getattr(_np, "vecdot", None)  # numpy >= 2
_SWAP = sys.byteorder != "little"


def matvec(matrix: Any, vector: Any) -> Any:
    """``matrix @ vector`` on the calling thread, with numpy's row-by-row dot loops
    (``vecdot``, numpy 2; ``einsum`` before) instead of BLAS's matrix-vector product, which
    starts worker threads for a matrix this size. On the shared 2-core machine those threads
    spin-wait after each product and contend with the rest of the process and with other
    processes: per 20,000 × 384 float32 product, BLAS took 7-9 ms of CPU (25+ ms of wall
    time under load), einsum 1.3 ms and vecdot 0.9 ms, both single-threaded."""
    if _vecdot is not None:
        return _vecdot(matrix, vector)
    return _np.einsum("ij,j->i", matrix, vector)


def unit_vector(vector: Sequence[float]) -> tuple[float, ...] | None:
    """``vector`` scaled to length 1, or None for a zero (or empty) vector."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0 or not math.isfinite(norm):
        return None
    return tuple(x / norm for x in vector)


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Cosine similarity of two vectors; None if either is zero or their lengths differ."""
    if len(a) != len(b):
        return None
    unit_a, unit_b = unit_vector(a), unit_vector(b)
    if unit_a is None or unit_b is None:
        return None
    return math.fsum(x * y for x, y in zip(unit_a, unit_b, strict=True))


def cosines(
    query: Sequence[float], vectors: Sequence[Sequence[float]], *, use_numpy: bool = HAVE_NUMPY
) -> list[float | None]:
    """:func:`cosine` of ``query`` with each of ``vectors``, in order (None where it is None).

    Why not a loop over :func:`cosine`: that normalises the query again for every vector,
    in pure Python (0.3 ms per 384-dimension pair). Here the query is normalised once, and
    with numpy the vectors of its length are scored in one product.
    """
    unit = unit_vector(query)
    out: list[float | None] = [None] * len(vectors)
    if unit is None:
        return out
    same = [i for i, v in enumerate(vectors) if len(v) == len(unit)]
    if not same:
        return out
    if use_numpy and _np is not None:
        matrix = _np.array([vectors[i] for i in same], dtype=_np.float64)
        norms = _np.sqrt(_np.einsum("ij,ij->i", matrix, matrix))
        dots = matvec(matrix, _np.asarray(unit, dtype=_np.float64))
        for i, norm, dot in zip(same, norms.tolist(), dots.tolist(), strict=True):
            if norm != 0.0 and math.isfinite(norm):
                out[i] = dot / norm
        return out
    for i in same:
        vector = vectors[i]
        norm = math.sqrt(math.fsum(x * x for x in vector))
        if norm != 0.0 and math.isfinite(norm):
            out[i] = math.fsum(x * y for x, y in zip(vector, unit, strict=True)) / norm
    return out


def pack_vector(vector: Sequence[float]) -> bytes:
    """Little-endian float32 bytes of ``vector``."""
    packed = array("f", vector)
    if _SWAP:  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return packed.tobytes()


def unpack_vector(blob: bytes | bytearray) -> array[float]:
    """Invert :func:`pack_vector`."""
    values = array("f")
    values.frombytes(blob)
    if _SWAP:  # pragma: no cover - big-endian hosts
        values.byteswap()
    return values


def matrix_of(vectors: Sequence[Sequence[float]]) -> Any:
    """Vectors in the form :func:`cosine_top` multiplies fastest: a numpy matrix when numpy is
    installed, else the list itself. Worth caching between queries."""
    if _np is None or not vectors:
        return list(vectors)
    return _np.asarray(vectors, dtype=_np.float64)


def cosine_top(
    query: Sequence[float],
    keys: Sequence[str],
    vectors: Sequence[Sequence[float]] | Sequence[bytes] | Any,
    limit: int,
    *,
    use_numpy: bool = HAVE_NUMPY,
) -> list[tuple[str, float]]:
    """The ``limit`` keys whose vectors are most similar to ``query``, best first.

    ``vectors`` are unit vectors (or packed float32 unit vectors) of the query's dimension,
    in the order of ``keys``. Ties are broken by key, so results are deterministic.
    ``vectors`` may also be what :func:`matrix_of` returned. ``use_numpy=False`` forces the
    pure-Python path (tests compare the two).
    """
    unit = unit_vector(query)
    if unit is None or not keys:
        return []
    scores: list[float]
    if use_numpy and _np is not None:
        if isinstance(vectors, _np.ndarray):
            matrix = vectors
        elif isinstance(vectors[0], bytes | bytearray):
            matrix = _np.frombuffer(b"".join(vectors), dtype="<f4")  # type: ignore[arg-type]
            matrix = matrix.reshape(len(keys), len(unit))
        else:
            matrix = _np.asarray(vectors, dtype=_np.float64)
        column = _np.asarray(unit, dtype=_np.float64)
        values = matvec(matrix.astype(_np.float64, copy=False), column)
        if limit < len(keys):
            # Only the best `limit` (and anything tied with the last of them) are sorted.
            threshold = _np.partition(values, len(keys) - limit)[len(keys) - limit]
            chosen = _np.nonzero(values >= threshold)[0].tolist()
            top = [(keys[i], float(values[i])) for i in chosen]
            return sorted(top, key=lambda pair: (-pair[1], pair[0]))[:limit]
        scores = values.tolist()
    else:
        rows = [unpack_vector(v) if isinstance(v, bytes | bytearray) else v for v in vectors]
        scores = [math.fsum(a * b for a, b in zip(row, unit, strict=True)) for row in rows]
    return heapq.nsmallest(
        limit, zip(keys, scores, strict=True), key=lambda pair: (-pair[1], pair[0])
    )
