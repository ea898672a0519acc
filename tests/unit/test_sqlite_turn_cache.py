"""The SQLite durable store's decoded-turn cache (issue #8): what it answers is exactly a
fresh decode, and its bounds (a window of recent indexes per session, entries and
characters in all) hold, so it keeps few objects for the garbage collector to walk."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiermem.models import SessionRef
from tiermem.store.backends.sqlite._durable import (
    TURN_CACHE_WINDOW,
    SQLiteDurableStore,
    _TurnCache,
)
from tiermem.store.codec import decode_turn, encode_turn
from tiermem.testing.backend import text_turn


def _payload(text: str, index: int) -> str:
    return encode_turn(text_turn(text).with_index(index))


def _rows(texts: list[str], start: int = 0) -> list[tuple[int, str]]:
    return [(start + i, _payload(t, start + i)) for i, t in enumerate(texts)]


def test_a_cached_turn_is_what_a_fresh_decode_gives() -> None:
    cache = _TurnCache()
    rows = _rows(["a", "b", "c"])
    first = cache.decode("s", rows)
    again = cache.decode("s", rows)
    assert [a is b for a, b in zip(first, again, strict=True)] == [True] * 3
    assert again == [decode_turn(p) for _, p in rows]
    assert cache.decode_one("s", 1, rows[1][1]) is first[1]


def test_a_new_payload_at_a_cached_index_is_decoded_afresh() -> None:
    cache = _TurnCache()
    [old] = cache.decode("s", _rows(["old"]))
    [new] = cache.decode("s", _rows(["new"]))
    assert new.text == "new"
    assert cache.decode_one("s", 0, _payload("old", 0)) == old
    assert len(cache) == 1


def test_a_session_keeps_only_its_last_window_of_indexes() -> None:
    cache = _TurnCache(window=4)
    texts = [f"t{i}" for i in range(10)]
    cache.decode("s", _rows(texts))
    cache.decode("other", _rows(["x"]))
    assert len(cache) == 4 + 1
    kept = cache.decode("s", _rows(texts[6:], start=6))
    assert [t.text for t in kept] == texts[6:]
    assert len(cache) == 4 + 1  # all four were hits: nothing new went in
    cache.decode("s", _rows(texts[:1]))  # an old index read again goes back in
    assert len(cache) == 6


def test_entries_and_characters_are_bounded_first_in_first_out() -> None:
    by_entries = _TurnCache(max_entries=3)
    for session in ("a", "b", "c", "d"):
        by_entries.decode(session, _rows(["x"]))
    assert len(by_entries) == 3
    [a_again] = by_entries.decode("a", _rows(["x"]))  # the first one left
    assert len(by_entries) == 3
    size = len(_payload("x", 0))
    by_chars = _TurnCache(max_chars=2 * size)
    for session in ("a", "b", "c"):
        by_chars.decode(session, _rows(["x"]))
    assert len(by_chars) == 2
    too_big = _TurnCache(max_chars=size - 1)
    too_big.decode("a", _rows(["x"]))
    assert len(too_big) == 0
    assert a_again.text == "x"


async def test_a_redacted_turn_leaves_no_decoded_copy(tmp_path: Path) -> None:
    store = SQLiteDurableStore(tmp_path / "d.db")
    try:
        await store.append_turns("s-1", [text_turn("secret plan"), text_turn("b")])
        await store.get_turns("s-1")
        assert len(store._turns) == 2
        assert "secret" not in (await store.redact_turn("s-1", 0)).text
        assert len(store._turns) == 1
        assert "secret" not in (await store.get_turn("s-1", 0)).text
    finally:
        await store.aclose()


@pytest.mark.parametrize("erase", ["session", "user"])
async def test_erasure_leaves_no_cached_turn(tmp_path: Path, erase: str) -> None:
    store = SQLiteDurableStore(tmp_path / "d.db")
    try:
        await store.register_session(
            SessionRef(session_id="s-1", user_id="u-1", created_at=datetime.now(UTC))
        )
        await store.append_turns("s-1", [text_turn("secret")])
        assert [t.text for t in await store.get_turns("s-1")] == ["secret"]
        assert len(store._turns) == 1
        if erase == "session":
            await store.delete_session("s-1")
        else:
            await store.purge_user("u-1")
        assert len(store._turns) == 0
        assert await store.get_turns("s-1") == []
    finally:
        await store.aclose()


async def test_the_window_keeps_what_a_summary_pass_reads_again(tmp_path: Path) -> None:
    """Reads that slide up a session (as the summary job's) hit for every turn read before."""
    store = SQLiteDurableStore(tmp_path / "d.db")
    try:
        total = 3 * TURN_CACHE_WINDOW
        for batch in range(3):
            texts = [f"t{batch}-{i}" for i in range(TURN_CACHE_WINDOW)]
            await store.append_turns("s-1", [text_turn(t) for t in texts])
        step = TURN_CACHE_WINDOW // 2
        previous: dict[int, object] = {}
        hits = 0
        for start in range(0, total - TURN_CACHE_WINDOW, step):
            turns = await store.get_turns("s-1", start, start + TURN_CACHE_WINDOW)
            for turn in turns:
                if turn.index in previous:
                    assert previous[turn.index] is turn
                    hits += 1
                previous[turn.index] = turn
        assert hits == (total - TURN_CACHE_WINDOW) // step * step - step
        assert len(store._turns) <= TURN_CACHE_WINDOW
    finally:
        await store.aclose()
