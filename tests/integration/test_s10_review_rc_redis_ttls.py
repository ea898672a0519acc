"""Review of the s10 Redis script changes (reviewer RC), on the real server: an append no
longer re-sends PEXPIRE to an entities hash or records hash that already existed, and the
recent write ids are kept by one pattern. Every key of a session with a finite lifetime
must still carry a native TTL in the paths where a key could have been left without one
(a lifetime that was 'inf' -- keys PERSISTed -- then purged and finite again; a records
hash created by record_put; a hot entities hash created by a restore), and a write id that
is a prefix of another is not taken for it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import server_url
from tiermem.store.backends.redis_append import APPEND_THROUGH, ARCHIVE_APPEND, HOT_APPEND
from tiermem.store.backends.redis_durable import RECORD_PUT, SESSION_PURGE
from tiermem.store.backends.redis_hot import HOT_RESTORE
from tiermem.store.backends.redis_scripts import LuaScript

_ENTITY = '{"kind":"topic","value":"a"}'
_TURN = '{"role":"user","text":"x"'


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server_url("redis"))
    yield client
    client.close()


class _Session:
    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        tag = f"rcttl{name}{time.time_ns():x}"
        self.durable = [f"{tag}:{{s=x}}:{k}" for k in ("archive", "records", "dmeta", "idem")]
        self.hot = [f"{tag}:{{s=x}}:{k}" for k in ("meta", "turns", "ent", "state")]

    def run(self, script: LuaScript, keys: list[str], *args: str) -> object:
        return self.client.eval(script.source, len(keys), *keys, *args)

    def untimed(self, keys: list[str]) -> list[str]:
        """Keys that exist and have no native TTL."""
        return [k for k in keys if self.client.exists(k) and self.client.pttl(k) == -1]

    def close(self) -> None:
        self.client.delete(*self.durable, *self.hot)


def _now() -> int:
    return time.time_ns() // 1_000


def test_a_purged_forever_session_written_again_keeps_ttls_on_every_key(
    client: redis.Redis,
) -> None:
    s = _Session(client, "inf")
    try:
        now = _now()
        s.run(RECORD_PUT, s.durable, str(now), "60000", "entities", "", "", str(now), "{}")
        assert s.untimed(s.durable) == s.durable[1:3]  # records, dmeta: PERSISTed, 'inf'
        s.run(ARCHIVE_APPEND, s.durable, str(now), "60000", "", "", "k", "", "0", "0", _TURN)
        assert client.hget(s.durable[2], "h") == b"inf"
        s.run(SESSION_PURGE, s.durable, str(now), "u")
        later = str(now + 3_600_000_000)
        for i in range(3):  # the 2nd and 3rd find the records hash and its entities record
            s.run(ARCHIVE_APPEND, s.durable, str(now + i), "60000", later, "", f"k{i}", "",
                  "0", "1", "topic", _ENTITY, _TURN)  # fmt: skip
            assert s.untimed(s.durable) == [], i
    finally:
        s.close()


def test_a_records_hash_made_by_record_put_keeps_its_ttl_through_entity_changes(
    client: redis.Redis,
) -> None:
    s = _Session(client, "rec")
    try:
        now = _now()
        later = str(now + 3_600_000_000)
        s.run(RECORD_PUT, s.durable, str(now), "60000", "entities", "", later, str(now), "{}")
        for i in range(3):
            s.run(ARCHIVE_APPEND, s.durable, str(now + i), "60000", later, "", "", f"ab{i}",
                  "0", "1", "topic", _ENTITY, _TURN)  # fmt: skip
            assert s.untimed(s.durable) == [], i
            assert client.pttl(s.durable[1]) > 3_600_000
    finally:
        s.close()


def test_a_hot_entities_hash_made_by_restore_keeps_its_ttl(client: redis.Redis) -> None:
    s = _Session(client, "hot")
    try:
        now = _now()
        expires, ttl = str(now + 1_800_000_000), "2100000"
        s.run(HOT_RESTORE, s.hot, str(now), expires, ttl, "", "0", "{}", "0", "1", "e1",
              "topic", _ENTITY)  # fmt: skip
        for i in range(3):  # each replaces the field the restore wrote: the hash was there
            s.run(HOT_APPEND, s.hot, str(now + i), expires, ttl, "5", "", "", "", f"c{i}",
                  "0", "1", "topic", _ENTITY, _TURN)  # fmt: skip
            both = [*s.durable, *s.hot]
            s.run(APPEND_THROUGH, both, str(now + i), "60000", expires, "", "", f"d{i}",
                  expires, ttl, "5", "e2", "0", "1", "topic", _ENTITY, _TURN)  # fmt: skip
            assert s.untimed(s.hot + s.durable) == [], i
    finally:
        s.close()


def test_a_write_id_that_prefixes_another_is_not_taken_for_it(client: redis.Redis) -> None:
    s = _Session(client, "wid")
    try:
        now = str(_now())
        later = str(_now() + 3_600_000_000)
        ids = [f"{i:x}" * 3 for i in range(1, 12)]  # 11 > the 8 kept
        for wid in ["abc1", *ids]:
            s.run(ARCHIVE_APPEND, s.durable, now, "60000", later, "", "", wid, "0", "0", _TURN)
        recent = client.hget(s.durable[2], "w")
        assert recent is not None
        assert len(recent.split()) == 8
        # 'abc' prefixes 'abc1' (now dropped) and is new: appended, not a repeat
        reply = s.run(
            ARCHIVE_APPEND, s.durable, now, "60000", later, "", "", "abc", "0", "0", _TURN
        )
        assert reply == [b"ok", 12]
        # the newest id resent: a repeat of its own append, not of 'abc'
        again = s.run(ARCHIVE_APPEND, s.durable, now, "60000", later, "", "", ids[-1], "0", "0",
                      _TURN)  # fmt: skip
        assert isinstance(again, list)
        assert again[0] == b"repeat"
        assert len(again) == 2
        assert b'"index":11}' in again[1]
    finally:
        s.close()
