"""R1 (review of 6e59bc5): encode_memory / encode_turn must write what
``record.model_dump_json()`` wrote at 437cd81 for any MemoryRecord / Turn instance,
subclasses included (a user's own record class given to ``put_memory``): the class's own
serializer, not the base class's (which drops a subclass's fields, computed fields and
field serializers)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import computed_field, field_serializer

from tiermem.models.memory import MemoryRecord
from tiermem.models.turns import Turn
from tiermem.store.codec import encode_memory, encode_turn

_NOW = datetime(2026, 1, 1, tzinfo=UTC)
_MEMORY = {
    "user_id": "u1",
    "memory_id": "m1",
    "memory_type": "fact",
    "content": "I like tea",
    "created_at": _NOW,
}


class _Extra(MemoryRecord):
    source_note: str = "from import"


class _Upper(MemoryRecord):
    @field_serializer("content")
    def _content(self, value: str) -> str:
        return value.upper()


class _Computed(MemoryRecord):
    @computed_field  # type: ignore[prop-decorator]
    @property
    def length(self) -> int:
        return len(self.content)


class _TurnNote(Turn):
    note: str = "imported"


def test_a_memory_subclass_is_written_as_model_dump_json_wrote_it() -> None:
    for cls in (MemoryRecord, _Extra, _Upper, _Computed):
        record = cls(**_MEMORY)
        assert encode_memory(record) == record.model_dump_json(), cls.__name__


def test_a_turn_subclass_is_written_as_model_dump_json_wrote_it() -> None:
    turn = _TurnNote(
        index=0,
        role="user",
        content=[{"type": "text", "text": "hi"}],
        timestamp=_NOW,
        token_count=1,
    )
    assert encode_turn(turn) == turn.model_dump_json()
