"""Script calls packed from a remembered head (:meth:`RedisIO._packed_call`) and the
per-session key tuples of :class:`RedisKeys` (issue #8): the bytes sent and the keys
named must be exactly what the plain path builds.

The packing checks need no server (a client connects only when used); the last test runs
script calls on the direct lane against the test Redis.
"""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator

import pytest

from tests.conftest import server_url
from tiermem.store.backends import redis_scripts
from tiermem.store.backends.redis_scripts import (
    Arg,
    LuaScript,
    RedisIO,
    RedisKeys,
    client_from_url,
    pack_commands,
)

SCRIPTS = [LuaScript(f"s{i}", f"return {{{i}, KEYS[1], ARGV[1]}}") for i in range(3)]


def _text(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits + ":{}|\r\n $*-é—😀\x00"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))


def _arg(rng: random.Random) -> Arg:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(-(10**18), 10**18)
    if kind == 1:
        return _text(rng).encode()
    if kind == 2:
        return ""
    return _text(rng)


@pytest.fixture
async def io() -> AsyncIterator[RedisIO]:
    client = client_from_url("redis://127.0.0.1:1/0")  # never connected here
    yield RedisIO(client)
    await client.aclose()


async def test_packed_calls_are_byte_for_byte_the_plain_packing(io: RedisIO) -> None:
    rng = random.Random(8)
    key_sets = [[_text(rng) for _ in range(rng.randrange(0, 9))] for _ in range(12)]
    for _ in range(3000):
        script = rng.choice(SCRIPTS)
        keys = rng.choice(key_sets)
        args = [_arg(rng) for _ in range(rng.choice((0, 1, 2, 5, 9, 10, 11, 30)))]
        expected = pack_commands([("EVALSHA", script.sha, len(keys), *keys, *args)])
        assert io._packed_call(script, keys, args) == expected
        assert io._packed_call(script, tuple(keys), tuple(args)) == expected


async def test_the_remembered_heads_are_bounded(
    io: RedisIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_scripts, "_HEADS_KEPT", 5)
    script = SCRIPTS[0]
    for i in range(12):
        keys = [f"k{i}", "other"]
        packed = io._packed_call(script, keys, [i])
        assert packed == pack_commands([("EVALSHA", script.sha, 2, *keys, i)])
        assert len(io._heads) <= 5


def test_turn_keys_are_the_session_keys_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_scripts, "_TAGS_KEPT", 4)
    keys = RedisKeys("pre")
    for i in range(10):
        sid = f"s:{{{i}}}é"
        hot = keys.hot_keys(sid)
        assert list(hot) == keys.hot_session(sid)
        assert list(keys.through_keys(sid)) == keys.durable_session(sid) + keys.hot_session(sid)
        assert keys.hot_keys(sid) is hot  # remembered: the same key objects next time
        assert len(keys._turn_keys) <= 4


async def test_script_calls_on_the_lane_reach_the_server_whole() -> None:
    """Keys, arguments (non-ASCII, empty, bytes, large ints) arrive as sent, also for
    the load-and-resend after NOSCRIPT, which reuses the packed call."""
    echo = LuaScript("s9_echo", "return {#KEYS, KEYS[#KEYS], ARGV[1], ARGV[2], ARGV[3], #ARGV}")
    client = client_from_url(server_url("redis"))
    io = RedisIO(client)
    assert io._direct is not None
    try:
        keys = ["s9p:{t}:a", "s9p:{t}:é"]
        for _ in range(2):
            await client.script_flush()
            reply = await io.call(echo, keys, ["—é", b"", 10**18, "x"])
            assert reply == [2, "s9p:{t}:é".encode(), "—é".encode(), b"", b"1000000000000000000", 4]
            reply = await io.call(echo, keys, ["", "b", 3])
            assert reply == [2, "s9p:{t}:é".encode(), b"", b"b", b"3", 3]
    finally:
        await client.aclose()
