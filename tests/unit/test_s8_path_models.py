"""``FrozenModel.trusted`` sets BaseModel's slots through their descriptors; the instance
must be the one pydantic's own construction gives: same ``__dict__``, fields set, extra and
private slots, equal, hashable alike, dumped alike, frozen, copyable."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError as PydanticValidationError

from tiermem.longterm.index import IndexedDoc
from tiermem.models import ActiveEntity, SessionMetadata, TextBlock, Turn
from tiermem.models.base import FrozenModel

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

CASES: list[tuple[type[FrozenModel], dict[str, object]]] = [
    (
        SessionMetadata,
        {"session_id": "s1", "user_id": "u1", "created_at": AT, "last_activity": AT},
    ),
    (ActiveEntity, {"kind": "series", "value": "Berserk", "turn_index": 3, "updated_at": AT}),
    (
        Turn,
        {"role": "user", "content": (TextBlock(text="hi"),), "timestamp": AT, "index": 7},
    ),
    (
        IndexedDoc,
        {
            "user_id": "u1",
            "doc_id": "s1#7",
            "kind": "turn",
            "text": "hi",
            "created_at": AT,
            "terms": {"hi": 1},
        },
    ),
]


@pytest.mark.parametrize(("cls", "given"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_trusted_builds_what_validation_builds(
    cls: type[FrozenModel], given: dict[str, object]
) -> None:
    validated = cls.model_validate(given)
    trusted = cls.trusted(dict(validated.__dict__))
    assert type(trusted) is cls
    assert trusted.__dict__ == validated.__dict__
    assert trusted.__pydantic_extra__ is None
    assert trusted.__pydantic_private__ is None
    assert trusted.__pydantic_fields_set__ == set(cls.model_fields)
    assert trusted == validated
    assert trusted.model_dump(mode="json") == validated.model_dump(mode="json")
    assert repr(trusted) == repr(validated)
    first = next(iter(cls.model_fields))
    with pytest.raises(PydanticValidationError):
        setattr(trusted, first, getattr(trusted, first))  # frozen
    copied = trusted.model_copy(update={first: getattr(validated, first)})
    assert copied == validated
    assert _hash(trusted) == _hash(validated)


def _hash(model: FrozenModel) -> int | str:
    """Its hash, or why it has none (a dict field makes a frozen model unhashable)."""
    try:
        return hash(model)
    except TypeError as exc:
        return str(exc)


def test_trusted_with_a_partial_fields_set_keeps_it() -> None:
    validated = SessionMetadata(session_id="s1", user_id="u1", created_at=AT, last_activity=AT)
    trusted = SessionMetadata.trusted(
        dict(validated.__dict__), set(validated.__pydantic_fields_set__)
    )
    assert trusted.__pydantic_fields_set__ == validated.__pydantic_fields_set__
    assert trusted.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
