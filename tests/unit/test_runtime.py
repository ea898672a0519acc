"""freeze_startup_heap: what is alive at start-up leaves the collector's view; later
allocations are still collected (a cycle made after the freeze is freed)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tiermem import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_startup_objects_are_frozen_and_later_cycles_still_collected(unfrozen: None) -> None:
    before = _Node()
    frozen = freeze_startup_heap()
    assert frozen > 1_000  # the imported library, at least
    assert gc.get_freeze_count() == frozen
    assert not any(o is before for o in gc.get_objects())  # out of the collector's view
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    gc.collect()
    assert ref() is None  # a cycle made after the freeze is still collected
