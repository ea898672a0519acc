"""The Redis durable store's decoded-turn cache (issue #8): ``clear`` leaves no decoded
copy (the store calls it on every erasure), and the default count bound holds. No server
needed."""

from __future__ import annotations

from datetime import UTC, datetime

from tiermem.models import Turn
from tiermem.store.backends.redis_durable import DECODED_TURNS_SIZE, DecodedTurns
from tiermem.store.codec import encode_turn


def _payload(index: int, text: str) -> bytes:
    turn = Turn.model_validate(
        {
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
            "index": index,
        }
    )
    return encode_turn(turn).encode()


def test_clear_leaves_no_decoded_copy() -> None:
    cache = DecodedTurns()
    payload = _payload(0, "secret plan")
    [first] = cache.decode([payload], session_id="s")
    assert cache.held_bytes == len(payload)
    cache.clear()
    assert cache.held_bytes == 0
    [again] = cache.decode([payload], session_id="s")
    assert again == first
    assert again is not first  # decoded afresh: the old copy was dropped


def test_the_default_count_bound_holds() -> None:
    cache = DecodedTurns()
    payloads = [_payload(i, f"t{i}") for i in range(DECODED_TURNS_SIZE + 10)]
    cache.decode(payloads, session_id="s")
    assert cache.held_bytes == sum(len(p) for p in payloads[10:])
    [last] = cache.decode(payloads[-1:], session_id="s")
    assert last is cache.decode(payloads[-1:], session_id="s")[0]
