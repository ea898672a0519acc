"""Session 17: a session view derives its metadata through a non-data descriptor, not a
``__getattr__`` on the class (which put every attribute read of every view on Python's
slower path): the same metadata, derived once, kept by ``dataclasses.replace``."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from tiermem.models import SessionMetadata
from tiermem.tiers.tiered import SessionView, _view, derive_metadata

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_views_metadata_is_derived_once_without_getattr() -> None:
    assert "__getattr__" not in vars(SessionView)
    stored = SessionMetadata(session_id="s1", user_id="u1", created_at=T0, last_activity=T0)
    view = _view((stored, (), 3), (), {}, {}, 3, None, "hot", {})
    assert "metadata" not in view.__dict__
    assert view.stored_metadata is stored
    derived = view.metadata
    assert derived == derive_metadata(stored, (), 3)
    assert derived.turn_count == 3
    assert view.metadata is derived  # kept
    assert dataclasses.replace(view, next_index=4).metadata is derived
    plain = _view(stored, (), {}, {}, 0, None, "hot", {})
    assert plain.metadata is stored
    assert SessionView(stored, (), {}, {}, 0, None, "hot").metadata is stored


def test_a_missing_attribute_raises_as_before() -> None:
    stored = SessionMetadata(session_id="s1", user_id="u1", created_at=T0, last_activity=T0)
    view = _view((stored, (), 0), (), {}, {}, 0, None, "hot", {})
    with pytest.raises(AttributeError, match="'SessionView' object has no attribute 'nope'"):
        getattr(view, "nope")  # noqa: B009 -- a name the type checker knows is not there
