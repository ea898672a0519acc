"""``encode_data`` encodes with one encoder built once (issue #8) and writes exactly what
``json.dumps`` with the same arguments wrote, errors included."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.store.codec import encode_data


def _dumps(data: Any) -> str:
    """The encoding before: a new encoder per call."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=6))
def test_encode_data_writes_what_dumps_wrote(data: dict[str, Any]) -> None:
    assert encode_data(data, what="record 'x'") == _dumps(data)


@pytest.mark.parametrize(
    "data",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": object()},
        {"x": {1j: 1}},
    ],
)
def test_encode_data_refuses_what_dumps_refused(data: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)) as before:
        _dumps(data)
    with pytest.raises(ValidationError) as now:
        encode_data(data, what="record 'x'")
    assert str(now.value) == f"record 'x' is not JSON-serializable: {before.value}"


def test_a_circular_record_is_refused() -> None:
    data: dict[str, Any] = {}
    data["self"] = data
    with pytest.raises(ValidationError, match="Circular reference"):
        encode_data(data, what="record 'x'")
