"""The Redis durable store's cache of decoded archive turns
(:class:`~tiermem.store.backends.redis_durable.DecodedTurns`): the same answers as decoding
afresh, including for rewritten and undecodable payloads; ``clear`` (called on every
erasure) leaves no decoded copy; the default count bound holds. No server needed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from tiermem.models import Turn
from tiermem.store.backends.redis_durable import DECODED_TURNS_SIZE, DecodedTurns
from tiermem.store.codec import decode_turns, encode_turn


def payload(index: int, text: str) -> bytes:
    turn = Turn.model_validate(
        {
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
            "index": index,
        }
    )
    return encode_turn(turn).encode()


def test_answers_equal_a_fresh_decode_and_repeat_reads_come_from_the_cache() -> None:
    cache = DecodedTurns()
    payloads = [payload(i, f"turn {i}") for i in range(5)]
    first = cache.decode(payloads, session_id="s")
    assert first == decode_turns(payloads, session_id="s")
    again = cache.decode(payloads[2:], session_id="s")
    assert again == first[2:]
    assert all(a is b for a, b in zip(again, first[2:], strict=True))


def test_a_rewritten_turn_is_decoded_afresh() -> None:
    cache = DecodedTurns()
    before = cache.decode([payload(0, "my card is 4111")], session_id="s")
    after = cache.decode([payload(0, "[redacted]")], session_id="s")
    assert before[0].text != after[0].text
    assert after[0].text == "[redacted]"


def test_an_undecodable_payload_is_skipped_and_logged_every_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = DecodedTurns()
    good = payload(1, "fine")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert [t.index for t in cache.decode([b"{not json", good], session_id="s")] == [1]
    assert sum("skipped an archived turn" in r.getMessage() for r in caplog.records) == 2


def test_the_cache_is_bounded() -> None:
    cache = DecodedTurns(size=3)
    payloads = [payload(i, f"turn {i}") for i in range(10)]
    cache.decode(payloads, session_id="s")
    assert len(cache._turns) == 3
    assert list(cache._turns) == payloads[-3:]


def test_clear_leaves_no_decoded_copy() -> None:
    cache = DecodedTurns()
    secret = payload(0, "secret plan")
    [first] = cache.decode([secret], session_id="s")
    assert cache.held_bytes == len(secret)
    cache.clear()
    assert cache.held_bytes == 0
    [again] = cache.decode([secret], session_id="s")
    assert again == first
    assert again is not first  # decoded afresh: the old copy was dropped


def test_the_default_count_bound_holds() -> None:
    cache = DecodedTurns()
    payloads = [payload(i, f"t{i}") for i in range(DECODED_TURNS_SIZE + 10)]
    cache.decode(payloads, session_id="s")
    assert cache.held_bytes == sum(len(p) for p in payloads[10:])
    [last] = cache.decode(payloads[-1:], session_id="s")
    assert last is cache.decode(payloads[-1:], session_id="s")[0]
