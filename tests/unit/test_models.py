"""Domain models: frozen, forward-compatible, bytes as base64, aware timestamps only."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pydantic
import pytest

from tiermem.models import (
    REDACTED_TEXT,
    ImageBlock,
    MemoryRecord,
    Message,
    NewTurn,
    TextBlock,
    ToolUseBlock,
    Turn,
    UnknownBlock,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _turn(**extra: object) -> Turn:
    return NewTurn.model_validate(
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": NOW, **extra}
    ).with_index(0)


def test_models_are_frozen() -> None:
    turn = _turn()
    with pytest.raises(pydantic.ValidationError):
        turn.importance = 0.9  # type: ignore[misc]


def test_unknown_fields_are_ignored_on_read() -> None:
    raw = json.loads(_turn().model_dump_json())
    raw["field_from_the_future"] = {"x": 1}
    assert Turn.model_validate(raw) == _turn()


def test_unknown_block_kind_is_kept_not_crashed() -> None:
    raw = {"role": "assistant", "content": [{"type": "video", "uri": "s3://v.mp4"}]}
    message = Message.model_validate(raw)
    block = message.content[0]
    assert isinstance(block, UnknownBlock)
    assert block.kind == "video"
    assert block.data == {"type": "video", "uri": "s3://v.mp4"}
    assert Message.model_validate_json(message.model_dump_json()) == message


def test_bytes_travel_as_base64_in_json() -> None:
    block = ImageBlock(format="png", data=b"\x89PNG\x00\xff")
    dumped = json.loads(block.model_dump_json())
    assert dumped["data"] == "iVBORwD/"
    assert ImageBlock.model_validate_json(block.model_dump_json()) == block


def test_naive_timestamps_are_rejected_with_advice() -> None:
    with pytest.raises(pydantic.ValidationError, match="timezone"):
        NewTurn(role="user", content=(TextBlock(text="x"),), timestamp=datetime(2030, 1, 1))


def test_importance_is_bounded() -> None:
    with pytest.raises(pydantic.ValidationError):
        _turn(importance=1.5)


def test_redaction_keeps_index_and_timestamp() -> None:
    turn = NewTurn(
        role="assistant",
        content=(ToolUseBlock(tool_use_id="t", name="pay", input={"card": "4111"}),),
        timestamp=NOW,
        metadata={"card": "4111"},
    ).with_index(7)
    redacted = turn.redact()
    assert (redacted.index, redacted.timestamp, redacted.redacted) == (7, NOW, True)
    assert redacted.text == REDACTED_TEXT
    assert "4111" not in redacted.model_dump_json()


def test_text_of_covers_tool_inputs() -> None:
    turn = NewTurn(
        role="assistant",
        content=(
            TextBlock(text="checking"),
            ToolUseBlock(tool_use_id="t", name="search", input={"q": "ベルセルク"}),
        ),
        timestamp=NOW,
    )
    assert "checking" in turn.text
    assert "ベルセルク" in turn.text


def test_memory_record_round_trip() -> None:
    record = MemoryRecord(
        memory_id="m1",
        user_id="u1",
        memory_type="preference",
        content="seinen",
        created_at=NOW,
        tags=("genre",),
    )
    assert MemoryRecord.model_validate_json(record.model_dump_json()) == record
