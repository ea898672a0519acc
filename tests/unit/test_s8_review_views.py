"""Review of the lazy hot views (commit 6ed9ceb): a view whose metadata is derived on first
access behaves as the eagerly built view in every way a caller can observe it -- equality
(both ways), repr, pickling, copies, ``dataclasses.replace``/``asdict``, ``after_append``
and ``stored_metadata`` -- whether or not its metadata was read first."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.models import SessionMetadata, Turn
from tiermem.models.content import TextBlock
from tiermem.tiers.tiered import SessionView, _view, derive_metadata

START = datetime(2030, 1, 1, tzinfo=UTC)


def _parts() -> tuple[SessionMetadata, tuple[Turn, ...], int]:
    stored = SessionMetadata(
        session_id="s1", user_id="u1", created_at=START, last_activity=START, turn_count=1
    )
    turns = tuple(
        Turn(
            index=i,
            role="user",
            content=(TextBlock(text=f"turn {i}"),),
            timestamp=START + timedelta(minutes=(7 * i) % 5),  # out of order
        )
        for i in range(3, 6)
    )
    return stored, turns, 6


def _lazy() -> SessionView:
    stored, turns, next_index = _parts()
    return _view((stored, turns, next_index), turns, {}, {}, next_index, None, "hot", {})


def _eager() -> SessionView:
    stored, turns, next_index = _parts()
    metadata = derive_metadata(stored, turns, next_index)
    return SessionView(metadata, turns, {}, {}, next_index, None, "hot", {})


@pytest.mark.parametrize("read_first", [False, True])
def test_a_lazy_view_is_the_eager_view(read_first: bool) -> None:
    lazy, eager = _lazy(), _eager()
    assert eager.metadata.turn_count == 6  # derived: the stored count was 1
    if read_first:
        assert lazy.metadata == eager.metadata
    assert lazy == eager
    assert eager == _lazy()
    assert repr(_lazy()) == repr(eager)
    for twin in (
        pickle.loads(pickle.dumps(_lazy())),  # noqa: S301 (our own bytes)
        copy.copy(_lazy()),
        copy.deepcopy(_lazy()),
        dataclasses.replace(_lazy()),
    ):
        assert twin == eager
        assert twin.metadata == eager.metadata
    assert dataclasses.asdict(_lazy()) == dataclasses.asdict(eager)
    assert _lazy().stored_metadata.session_id == eager.metadata.session_id
    assert _lazy().after_append(9, {}) == eager.after_append(9, {})
    assert _lazy().after_append(9, {}).metadata == eager.metadata  # what it was
    with pytest.raises(AttributeError):
        _lazy().no_such_field  # noqa: B018
