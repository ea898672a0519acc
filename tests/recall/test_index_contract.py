"""One suite for every SearchIndex: in-process (the reference), SQLite, Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.recall.conftest import T0, days, doc, held_doc_ids
from tiermem.clock import FakeClock
from tiermem.errors import UnsupportedCapabilityError, ValidationError
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.index_memory import COLLECT_PER_WRITE, MIN_COLLECT_PER_WRITE, InProcessIndex
from tiermem.longterm.recall import turn_docs
from tiermem.longterm.text import bm25_idf, bm25_term
from tiermem.testing.backend import text_turn

ALL = ("memory", "turn", "chunk")


def ids(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [h.doc_id for h in hits]


async def test_rare_terms_outrank_common_ones(index: SearchIndex) -> None:
    await index.upsert(
        [
            doc("common1", "manga order status"),
            doc("common2", "manga shipping question"),
            doc("common3", "manga recommendation request"),
            doc("rare", "berserk deluxe edition"),
        ]
    )
    hits = await index.search("u1", "manga berserk", kinds=ALL, limit=10)
    assert ids(hits)[0] == "rare"
    assert set(ids(hits)) == {"rare", "common1", "common2", "common3"}
    assert hits[0].score > hits[1].score > 0


async def test_scores_equal_the_reference_formula(index: SearchIndex) -> None:
    await index.upsert([doc("a", "seinen seinen horror"), doc("b", "horror"), doc("c", "cats")])
    hits = {h.doc_id: h.score for h in await index.search("u1", "seinen", kinds=ALL, limit=5)}
    # N=3, df=1, lengths 3, 1, 1 (plural folded: "cats" -> "cat"), average 5/3.
    expected = bm25_term(bm25_idf(3, 1), 2, 3, 5 / 3)
    assert hits == {"a": pytest.approx(expected, rel=1e-12)}


async def test_same_hits_and_scores_as_the_in_process_index(index: SearchIndex) -> None:
    docs = [
        doc("m1", "User prefers seinen manga, especially Berserk and Vagabond"),
        doc("m2", "Asked about shipping to Osaka; delivery took three days"),
        doc("m3", "ユーザーはホラー漫画が苦手です", tags=("dislike",)),
        doc("t1", "Do you have Berserk volume 42 in stock?", kind="turn"),
        doc("m4", "Complained that Berserk volume 41 arrived damaged"),
        doc("c1", "Return policy: damaged items are replaced within 30 days", kind="chunk"),
    ]
    reference = InProcessIndex()
    await reference.upsert(docs)
    await index.upsert(docs)
    for query in ["berserk volume", "漫画 ホラー", "damaged delivery", "seinen", "dislike"]:
        for kinds in (ALL, ("memory",), ("turn", "chunk")):
            want = await reference.search("u1", query, kinds=kinds, limit=4)
            got = await index.search("u1", query, kinds=kinds, limit=4)
            assert ids(got) == ids(want), (query, kinds)
            assert [h.kind for h in got] == [h.kind for h in want]
            assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9)


async def test_japanese_queries_match_japanese_documents(index: SearchIndex) -> None:
    await index.upsert(
        [
            doc("ja1", "ワンピースの最新刊を予約したい"),
            doc("ja2", "ホラー漫画は苦手です"),
            doc("en1", "Wants the newest One Piece volume"),
        ]
    )
    assert ids(await index.search("u1", "ワンピース最新刊", kinds=ALL, limit=5)) == ["ja1"]
    assert ids(await index.search("u1", "ホラー", kinds=ALL, limit=5)) == ["ja2"]


async def test_two_character_cjk_words_are_searchable(index: SearchIndex) -> None:
    await index.upsert([doc("a", "好きな漫画はベルセルク"), doc("b", "小説も読みます")])
    assert ids(await index.search("u1", "漫画", kinds=ALL, limit=5)) == ["a"]
    assert ids(await index.search("u1", "小説", kinds=ALL, limit=5)) == ["b"]


async def test_full_width_and_case_are_normalised(index: SearchIndex) -> None:
    await index.upsert([doc("a", "BERSERK vol 42")])
    assert ids(await index.search("u1", "ｂｅｒｓｅｒｋ ４２", kinds=ALL, limit=5)) == ["a"]


async def test_kinds_filter_and_limit(index: SearchIndex) -> None:
    await index.upsert(
        [
            doc("m", "berserk", kind="memory"),
            doc("s#0", "berserk berserk", kind="turn"),
            doc("d#1", "berserk guide", kind="chunk"),
        ]
    )
    assert ids(await index.search("u1", "berserk", kinds=("turn",), limit=5)) == ["s#0"]
    assert {h.kind for h in await index.search("u1", "berserk", kinds=ALL, limit=5)} == set(ALL)
    assert len(await index.search("u1", "berserk", kinds=ALL, limit=2)) == 2


async def test_users_never_see_each_other(index: SearchIndex) -> None:
    await index.upsert([doc("a", "berserk", user_id="u1"), doc("a", "vagabond", user_id="u2")])
    assert ids(await index.search("u1", "vagabond", kinds=ALL, limit=5)) == []
    assert ids(await index.search("u2", "vagabond", kinds=ALL, limit=5)) == ["a"]
    await index.purge_user("u1")
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == []
    assert ids(await index.search("u2", "vagabond", kinds=ALL, limit=5)) == ["a"]


async def test_user_ids_with_key_characters_stay_apart(index: SearchIndex) -> None:
    await index.upsert([doc("a", "berserk", user_id="a}:{b"), doc("a", "berserk", user_id="a")])
    await index.remove("a", ["a"])
    assert ids(await index.search("a}:{b", "berserk", kinds=ALL, limit=5)) == ["a"]
    assert ids(await index.search("a", "berserk", kinds=ALL, limit=5)) == []


async def test_replacing_a_document_drops_its_old_terms(index: SearchIndex) -> None:
    await index.upsert([doc("a", "berserk horror"), doc("b", "other words")])
    await index.upsert([doc("a", "vagabond")])
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == []
    assert ids(await index.search("u1", "vagabond", kinds=ALL, limit=5)) == ["a"]
    # Statistics follow: same score as an index that only ever saw the new version.
    fresh = InProcessIndex()
    await fresh.upsert([doc("a", "vagabond"), doc("b", "other words")])
    want = await fresh.search("u1", "vagabond", kinds=ALL, limit=5)
    got = await index.search("u1", "vagabond", kinds=ALL, limit=5)
    assert got[0].score == pytest.approx(want[0].score, rel=1e-12)


async def test_remove_ignores_unknown_ids(index: SearchIndex) -> None:
    await index.upsert([doc("a", "berserk"), doc("b", "berserk")])
    await index.remove("u1", ["a", "nope"])
    await index.remove("nobody", ["a"])
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == ["b"]
    await index.remove("u1", ["b"])
    assert await index.search("u1", "berserk", kinds=ALL, limit=5) == []


async def test_empty_and_stopword_queries_find_nothing(index: SearchIndex) -> None:
    await index.upsert([doc("a", "the berserk")])
    assert await index.search("u1", "", kinds=ALL, limit=5) == []
    assert await index.search("u1", "the and of", kinds=ALL, limit=5) == []
    assert await index.search("nobody", "berserk", kinds=ALL, limit=5) == []


async def test_query_words_that_look_like_operators_are_plain_words(index: SearchIndex) -> None:
    await index.upsert([doc("a", "near match not found"), doc("b", 'quote " and ( paren')])
    assert ids(await index.search("u1", 'NEAR "not" OR AND (', kinds=ALL, limit=5)) == ["a"]
    assert ids(await index.search("u1", 'quote"(paren', kinds=ALL, limit=5)) == ["b"]


async def test_tags_are_searchable(index: SearchIndex) -> None:
    await index.upsert([doc("a", "likes long series", tags=("seinen",))])
    assert ids(await index.search("u1", "seinen", kinds=ALL, limit=5)) == ["a"]


async def test_bad_arguments_are_rejected(index: SearchIndex) -> None:
    with pytest.raises(ValidationError):
        await index.search("", "x", kinds=ALL, limit=5)
    with pytest.raises(ValidationError):
        await index.search("u1", "x", kinds=("memory",), limit=0)
    with pytest.raises(ValidationError):
        await index.search("u1", "x", kinds=("bogus",), limit=5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await index.upsert([doc("a\n", "x")])


async def test_vector_search_when_supported(index: SearchIndex) -> None:
    await index.upsert(
        [
            doc("x", "a", embedding=(1.0, 0.0, 0.0)),
            doc("y", "b", embedding=(0.6, 0.8, 0.0)),
            doc("z", "c", embedding=(0.0, 0.0, 2.0), kind="turn"),
            doc("w", "d"),  # no embedding
            doc("v", "e", embedding=(1.0, 0.0)),  # another model's dimension
        ]
    )
    if not index.supports_vectors:
        with pytest.raises(UnsupportedCapabilityError):
            await index.vector_search("u1", (1.0, 0.0, 0.0), kinds=ALL, limit=5)
        return
    hits = await index.vector_search("u1", (2.0, 0.0, 0.0), kinds=ALL, limit=5)
    assert ids(hits) == ["x", "y", "z"]
    assert [h.score for h in hits] == pytest.approx([1.0, 0.6, 0.0], abs=1e-6)
    only_turns = await index.vector_search("u1", (0.0, 0.0, 1.0), kinds=("turn",), limit=5)
    assert ids(only_turns) == ["z"]
    assert ids(await index.vector_search("u1", (0.0, 1.0, 0.0), kinds=ALL, limit=1)) == ["y"]
    await index.upsert([doc("y", "b")])  # re-indexed without a vector
    # x and z are both orthogonal to the query: ties go by doc id.
    assert ids(await index.vector_search("u1", (0.0, 1.0, 0.0), kinds=ALL, limit=5)) == ["x", "z"]
    await index.remove("u1", ["x"])
    assert ids(await index.vector_search("u1", (1.0, 0.0, 0.0), kinds=ALL, limit=5)) == ["z"]


# -- expiry: archived turns live as long as the turns -----------------------------------------


async def test_expired_documents_are_hidden_then_collected(
    index: SearchIndex, clock: FakeClock
) -> None:
    turns = [
        text_turn("Is Berserk volume 42 out?", at=T0).with_index(0),
        text_turn("Berserk box set price", at=T0).with_index(1),
    ]
    await index.upsert(turn_docs("u1", "s1", turns[:1], expires_at=T0 + days(1)))
    await index.upsert(turn_docs("u1", "s1", turns[1:], expires_at=T0 + days(2)))
    await index.upsert([doc("m", "berserk fan", embedding=(1.0, 0.0))])
    assert set(ids(await index.search("u1", "berserk", kinds=ALL, limit=5))) == {
        "s1#0",
        "s1#1",
        "m",
    }

    clock.advance(days(1))  # exactly the first turn's expiry: it is gone
    assert set(ids(await index.search("u1", "berserk", kinds=ALL, limit=5))) == {"s1#1", "m"}
    assert ids(await index.search("u1", "volume", kinds=ALL, limit=5)) == []
    if index.supports_vectors:
        hits = await index.vector_search("u1", (1.0, 0.0), kinds=ALL, limit=5)
        assert ids(hits) == ["m"]
    assert await held_doc_ids(index, "u1") == {"s1#0", "s1#1", "m"}  # hidden, still held

    assert await index.collect_expired() == 1
    assert await held_doc_ids(index, "u1") == {"s1#1", "m"}
    assert await index.collect_expired() == 0
    # The statistics lost it too: scores equal an index that never saw the expired turn.
    fresh = InProcessIndex(clock=clock)
    await fresh.upsert([*turn_docs("u1", "s1", turns[1:]), doc("m", "berserk fan")])
    want = await fresh.search("u1", "berserk", kinds=ALL, limit=5)
    got = await index.search("u1", "berserk", kinds=ALL, limit=5)
    assert ids(got) == ids(want)
    assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9)

    clock.advance(days(1))
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == ["m"]
    assert await index.collect_expired() == 1
    assert await held_doc_ids(index, "u1") == {"m"}


async def test_expired_documents_of_idle_users_go_with_other_users_writes(
    index: SearchIndex, clock: FakeClock
) -> None:
    # An idle user never writes or recalls again: its expired turns still go, collected
    # by the writes of other users (bounded work per write, amortised).
    turns = [text_turn(f"turn about berserk {i}").with_index(i) for i in range(60)]
    await index.upsert(turn_docs("idle", "s-idle", turns, expires_at=T0 + days(1)))
    clock.advance(days(1) + timedelta(seconds=1))
    for i in range(32):
        await index.upsert([doc(f"m{i}", f"note {i}", user_id="busy")])
    assert await held_doc_ids(index, "idle") == set()
    assert await held_doc_ids(index, "busy") == {f"m{i}" for i in range(32)}


async def test_a_write_collects_a_bounded_number_of_expired_documents(
    index: SearchIndex, clock: FakeClock
) -> None:
    many = 3 * MIN_COLLECT_PER_WRITE
    turns = [text_turn(f"berserk {i}").with_index(i) for i in range(many)]
    await index.upsert(turn_docs("u1", "s1", turns, expires_at=T0 + days(1)))
    clock.advance(days(2))
    await index.upsert([doc("m", "vagabond")])
    held = await held_doc_ids(index, "u1")
    budget = max(MIN_COLLECT_PER_WRITE, COLLECT_PER_WRITE * 1)
    assert len(held) == many + 1 - budget
    assert await index.search("u1", "berserk", kinds=ALL, limit=5) == []


async def test_collect_expired_is_bounded_and_says_when_nothing_is_left(
    index: SearchIndex, clock: FakeClock
) -> None:
    for user in ("a", "b", "c"):
        turns = [text_turn(f"berserk {i}").with_index(i) for i in range(5)]
        await index.upsert(turn_docs(user, "s-" + user, turns, expires_at=T0 + days(1)))
    await index.upsert([doc("keep", "berserk", user_id="a", expires_at=T0 + days(9))])
    clock.advance(days(1))
    removed = [await index.collect_expired(4) for _ in range(5)]
    assert removed == [4, 4, 4, 3, 0]
    assert await held_doc_ids(index, "a") == {"keep"}
    assert await held_doc_ids(index, "b") == await held_doc_ids(index, "c") == set()
    with pytest.raises(ValidationError):
        await index.collect_expired(0)


async def test_upserting_an_expired_document_removes_it(
    index: SearchIndex, clock: FakeClock
) -> None:
    await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 + days(1))])
    await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 - days(1))])
    assert await index.search("u1", "berserk", kinds=ALL, limit=5) == []
    assert await held_doc_ids(index, "u1") == set()


async def test_rewriting_a_document_moves_its_expiry(index: SearchIndex, clock: FakeClock) -> None:
    await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 + days(1))])
    await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 + days(3))])
    clock.advance(days(2))
    assert await index.collect_expired() == 0
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == ["t"]
    await index.upsert([doc("t", "berserk", kind="turn")])  # no expiry any more
    clock.advance(days(30))
    assert await index.collect_expired() == 0
    assert ids(await index.search("u1", "berserk", kinds=ALL, limit=5)) == ["t"]
