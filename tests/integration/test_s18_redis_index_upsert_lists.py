"""The recall index's upsert with the posting lists gathered by the client (issue #8:
redis-server's instructions per turn), against the per-term upsert of 07fccef.

What changed: ``RedisIndex.upsert`` sends :data:`INDEX_UPSERT_LISTS` (script name
``index_upsert``) with each posting list once (its term, the ordinals of its documents in
the call, their packed values), where it sent :data:`INDEX_UPSERT` every term of every
document as an argument and the script gathered the lists itself. Same documents, same
numbers, same lists in the same order of numbers, same hashes and statistics.

How it is checked: random sequences of upserts (several documents per call sharing
terms, every kind, replaced and expired documents, collection) and removals on the real
test Redis, one user's index under two prefixes: one written by :data:`INDEX_UPSERT` with
the arguments the client built at 07fccef (that code is copied below), the other by
today's client arguments and script. Every reply and every key must be byte-equal.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import server_url
from tests.integration.test_s11_redis_index_upsert_equivalence import index_state
from tiermem.longterm import index_redis
from tiermem.longterm.index import IndexedDoc, terms_of
from tiermem.longterm.index_redis_scripts import INDEX_REMOVE, INDEX_UPSERT, INDEX_UPSERT_LISTS
from tiermem.longterm.postings import POSTING_SHIFT
from tiermem.store.backends.redis_scripts import Arg, optional_us, to_us

_UPSERT_SHA_07FCCEF = "a7d49611d66ba13245eacaf42531ca3204ea7330"
"""``INDEX_UPSERT.sha`` at 07fccef (the per-term script, unchanged since)."""

PRIVATE_DB = 11
"""The test server's logical database these tests keep their keys in (comparing states
SCANs the keyspace; 9 and 10 are the s11 and s17 tests')."""

# Terms a Lua table or pattern could mistake for something else, CJK, and plain ones.
VOCABULARY = ["w0", "w1", "w2", "w3", "12", "1", "n", "v", "__index", "ルは", "東京", "%d", "tw1"]
KINDS = ("memory", "turn", "chunk")
T0 = datetime(2027, 1, 1, tzinfo=UTC)


# -- The client's arguments at 07fccef (RedisIndex.upsert's loop), verbatim -------------


def _packed_values(length: int, tfs: Collection[int]) -> bytes:
    base = length * POSTING_SHIFT
    return struct.pack(f"<{len(tfs)}Q", *[base + tf for tf in tfs])


def former_args(now: datetime, chunk: Sequence[IndexedDoc], collect: int, token: str) -> list[Arg]:
    args: list[Arg] = [to_us(now), collect, token]
    for doc in chunk:
        live = doc.expires_at is None or doc.expires_at > now
        counts = terms_of(doc) if live else {}
        length = sum(counts.values())
        args += (
            doc.doc_id,
            doc.kind,
            length,
            optional_us(doc.expires_at),
            len(counts),
            " ".join(counts),
            _packed_values(length, counts.values()),
        )
        args.extend(counts)
    return args


def today_args(now: datetime, chunk: Sequence[IndexedDoc], collect: int, token: str) -> list[Arg]:
    args = index_redis._upsert_args(to_us(now), chunk, collect)
    assert isinstance(args[2], str)  # a fresh write id
    assert args[2]
    args[2] = token  # the same epoch token on both sides
    return args


# -- The harness -------------------------------------------------------------------------


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    url = urlsplit(server_url("redis"))._replace(path=f"/{PRIVATE_DB}").geturl()
    client = redis.Redis.from_url(url)
    assert client.connection_pool.connection_kwargs["db"] == PRIVATE_DB
    yield client
    client.close()


class Pair:
    """One user's index under two prefixes, written by the former and today's upsert
    (removals run today's ``index_remove`` on both)."""

    def __init__(self, admin: redis.Redis, rng: random.Random) -> None:
        self.admin, self.rng = admin, rng
        tag = f"{rng.getrandbits(48):x}"
        self.prefix = {side: f"s18{side}{tag}:{{u=x}}:" for side in ("old", "new")}
        self.keys = {
            side: [f"{p}ix2:{k}" for k in ("docs", "terms", "stats", "exp")]
            for side, p in self.prefix.items()
        }
        for script in (INDEX_UPSERT, INDEX_UPSERT_LISTS, INDEX_REMOVE):
            admin.script_load(script.source)
        self.now = T0
        self.ids = [f"d{i}" for i in range(16)]

    def run(self, sha: dict[str, str], args: dict[str, list[Arg]]) -> None:
        replies = []
        for side in ("old", "new"):
            keys = self.keys[side]
            try:
                replies.append(self.admin.evalsha(sha[side], len(keys), *keys, *args[side]))
            except redis.ResponseError as error:  # the same error, the same state
                replies.append(("error", str(error).split(" script: ")[0]))
        assert replies[0] == replies[1], (args, replies)
        assert self.state("old") == self.state("new"), args

    def state(self, side: str) -> dict[str, object]:
        return index_state(self.admin, self.prefix[side])

    def docs(self, count: int) -> list[IndexedDoc]:
        rng = self.rng
        shared = rng.sample(VOCABULARY, rng.randint(1, len(VOCABULARY)))
        out = []
        for doc_id in rng.sample(self.ids, count):
            expires = rng.choice(
                (None, None, self.now + timedelta(seconds=rng.randint(-5, 40)), self.now)
            )
            terms = {t: rng.randint(1, 3) for t in rng.sample(shared, rng.randint(0, len(shared)))}
            out.append(
                IndexedDoc(
                    user_id="x",
                    doc_id=doc_id,
                    kind=rng.choice(KINDS),
                    text="",
                    created_at=self.now,
                    expires_at=expires,
                    terms=terms,
                )
            )
        return out

    def upsert(self, chunk: Sequence[IndexedDoc] | None = None) -> None:
        chunk = self.docs(self.rng.randint(1, 12)) if chunk is None else chunk
        collect = self.rng.choice((0, 1, 3, 50))
        token = f"tok{self.rng.getrandbits(32):x}"
        self.run(
            {"old": INDEX_UPSERT.sha, "new": INDEX_UPSERT_LISTS.sha},
            {
                "old": former_args(self.now, chunk, collect, token),
                "new": today_args(self.now, chunk, collect, token),
            },
        )

    def remove(self) -> None:
        ids: list[Arg] = list(self.rng.sample(self.ids, self.rng.randint(1, 4)))
        self.run({"old": INDEX_REMOVE.sha, "new": INDEX_REMOVE.sha}, {"old": ids, "new": ids})

    def close(self) -> None:
        for side in ("old", "new"):
            prefix = self.prefix[side].replace("{", "\\{").replace("}", "\\}")
            for key in self.admin.scan_iter(match=f"{prefix}*"):
                self.admin.delete(key)


def test_the_former_script_is_the_one_of_07fccef() -> None:
    assert INDEX_UPSERT.sha == _UPSERT_SHA_07FCCEF
    assert INDEX_UPSERT_LISTS.name == "index_upsert"  # the name hooks and probes look for


@pytest.mark.parametrize("seed", range(8))
def test_random_sequences_give_the_same_replies_and_keys(admin: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(admin, rng)
    try:
        for _ in range(150):
            pair.now += timedelta(seconds=rng.choice((0, 1, 3, 10)))
            pair.upsert() if rng.random() < 0.85 else pair.remove()
    finally:
        pair.close()


def test_a_full_chunk_of_documents_sharing_every_term(admin: redis.Redis) -> None:
    """The most documents one script carries (ordinals up to 200, a byte each), all live,
    every one in every list: the longest lists one call builds."""
    rng = random.Random(5)
    pair = Pair(admin, rng)
    pair.ids = [f"d{i}" for i in range(index_redis._DOCS_PER_SCRIPT)]
    try:
        chunk = [
            IndexedDoc(
                user_id="x",
                doc_id=doc_id,
                kind=KINDS[i % 3],
                text="",
                created_at=pair.now,
                terms={t: 1 + i % 3 for t in VOCABULARY},
            )
            for i, doc_id in enumerate(pair.ids)
        ]
        pair.upsert(chunk)
        pair.upsert(chunk[::-1])  # every one replaced, in the other order
    finally:
        pair.close()


def test_numbers_used_up_fail_alike_before_any_write(admin: redis.Redis) -> None:
    rng = random.Random(7)
    pair = Pair(admin, rng)
    try:
        pair.upsert()
        for side in ("old", "new"):
            admin.hset(pair.keys[side][2], "next", str(2**32 - 2))
        for _ in range(5):
            pair.now += timedelta(seconds=1)
            pair.upsert()  # one live document fits, more fail alike
    finally:
        pair.close()


def test_the_client_sends_each_list_once() -> None:
    """The arguments themselves: a term two documents share is one list of two ordinals,
    a document that expired names no list, and a turn's and a memory's same term are two
    lists."""
    now = T0
    docs = [
        IndexedDoc(
            user_id="x",
            doc_id=f"d{i}",
            kind=kind,
            text="",
            created_at=now,
            expires_at=expires,
            terms=terms,
        )
        for i, (kind, expires, terms) in enumerate(
            [
                ("turn", None, {"a": 2, "b": 1}),
                ("turn", now - timedelta(seconds=1), {"a": 1}),
                ("memory", now + timedelta(seconds=1), {"a": 1}),
                ("turn", None, {"a": 1}),
            ]
        )
    ]
    args = today_args(now, docs, 3, "tok")
    shift = POSTING_SHIFT
    expires = [to_us(now - timedelta(seconds=1)), to_us(now + timedelta(seconds=1))]
    assert args == [
        to_us(now), 3, "tok", 4,
        "d0", "turn", 3, "", "a b",
        "d1", "turn", 0, str(expires[0]), "",
        "d2", "memory", 1, str(expires[1]), "a",
        "d3", "turn", 1, "", "a",
        "t", 2,
        "a", bytes([1, 4]), struct.pack("<2Q", 3 * shift + 2, 1 * shift + 1),
        "b", bytes([1]), struct.pack("<Q", 3 * shift + 1),
        "m", 1,
        "a", bytes([3]), struct.pack("<Q", 1 * shift + 1),
    ]  # fmt: skip
