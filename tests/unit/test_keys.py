"""Key segments: validation at the edge and injective escaping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.store.keys import (
    _RESERVED,
    MAX_ID_LENGTH,
    escape_segment,
    unescape_segment,
    validate_id,
)

ids = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=64)


@given(ids, ids)
def test_escaping_is_injective(a: str, b: str) -> None:
    if a != b:
        assert escape_segment(a) != escape_segment(b)


@given(ids)
def test_escaping_round_trips_and_hides_separators(value: str) -> None:
    escaped = escape_segment(value)
    assert unescape_segment(escaped) == value
    for ch in ":{}#*/ ":
        assert ch not in escaped


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("a\nb", "control character"),
        ("x" * (MAX_ID_LENGTH + 1), "the limit is 256"),
        (42, "must be a string"),
    ],
)
def test_bad_ids_get_a_clear_error(value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        validate_id(value, what="session_id")


def test_unicode_ids_are_allowed() -> None:
    assert validate_id("セッション-1", what="session_id") == "セッション-1"


@given(st.text(alphabet=st.sampled_from(sorted(_RESERVED) + list("aZ09_-.é%~")), max_size=40))
def test_escaping_is_the_per_character_rule(value: str) -> None:
    """Every reserved character becomes %XX (two upper-case hex digits), every other
    character stays: the rule stores and their keys have always used."""
    expected = "".join(f"%{ord(ch):02X}" if ch in _RESERVED else ch for ch in value)
    assert escape_segment(value) == expected


class _LyingStr(str):
    """A str subclass whose methods claim there is nothing to escape."""

    def isalnum(self) -> bool:
        return True

    def translate(self, table: object) -> str:
        return str.__str__(self)


def test_a_str_subclass_is_escaped_by_the_plain_str_rule() -> None:
    """The fast path trusts only an exact str: a subclass (an enum value, a tagged id) is
    escaped by str's own translate, and the key segment comes back as a plain str."""
    out = escape_segment(_LyingStr("a:b"))
    assert out == "a%3Ab"
    assert type(out) is str
