"""Review of the packed script-call heads (b293fe9): a head is found by the script object
and keys, so scripts that share a name or a source, and one script on different keys, each
send exactly what :func:`pack_commands` packs. No server: the client never connects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiermem.store.backends.redis_scripts import LuaScript, RedisIO, client_from_url, pack_commands


@pytest.fixture
async def io() -> AsyncIterator[RedisIO]:
    client = client_from_url("redis://127.0.0.1:1/0")  # never connected here
    yield RedisIO(client)
    await client.aclose()


def _plain(script: LuaScript, keys: list[str], args: list[str | int]) -> bytes:
    return pack_commands([("EVALSHA", script.sha, len(keys), *keys, *args)])


async def test_heads_follow_the_script_source_and_keys(io: RedisIO) -> None:
    one = LuaScript("same", "return 1")
    other = LuaScript("same", "return 2")  # same name, other source: other SHA
    again = LuaScript("again", "return 1")  # re-created with the same source
    keys = ["p:{s=a}:meta", "p:{s=a}:turns"]
    calls = [
        (one, keys),
        (other, keys),
        (again, keys),
        (one, keys[:1]),
        (one, [*keys, ""]),
        (one, ["p:{s=a}:meta" + "p:{s=a}:turns"]),
        (one, []),
    ]
    for _ in range(2):  # the second round finds every head kept
        for script, named in calls:
            for args in ([], [""], [7, "x"]):
                assert io._packed_call(script, named, args) == _plain(script, named, args)
    assert io._packed_call(one, keys, [1]) != io._packed_call(other, keys, [1])
    assert io._packed_call(one, keys, [1]) == io._packed_call(again, keys, [1])
