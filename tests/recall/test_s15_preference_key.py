"""A keyed preference is found by its key's words (``favorite_genre`` → "genre"), on every
deployment: "prefers seinen" says nothing of a genre, so before the key was indexed a query
for "genre" or "what genre do I like" recalled only the session summary that mentioned it.
The hit's text stays the memory's content: the key is a searched tag, not shown."""

from __future__ import annotations

import uuid

from tests.recall.conftest import T0, memory
from tests.recall.test_deployments import Deployment, deployment  # noqa: F401  (fixture)
from tiermem.longterm.recall import Recaller, memory_doc


async def test_a_keyed_preference_is_recalled_by_its_key(deployment: Deployment) -> None:  # noqa: F811
    user = f"u-{uuid.uuid4().hex[:8]}"
    records = [
        memory(
            "m1",
            "prefers seinen",
            user_id=user,
            metadata={"preference_key": "favorite_genre", "preference_value": "seinen"},
        ),
        memory(
            "m2",
            "prefers hardcover",
            user_id=user,
            metadata={"preference_key": "preferred_format", "preference_value": "hardcover"},
        ),
        memory("m3", "Lives in Osaka", user_id=user, memory_type="fact", created_at=T0),
    ]
    for record in records:
        await deployment.durable.put_memory(record)
    await deployment.index.upsert([memory_doc(r) for r in records])
    recaller = Recaller(deployment.durable, deployment.index, clock=deployment.clock)
    try:
        for query in ("genre", "what genre do I like", "favorite genre"):
            hits = await recaller.recall(user, query, k=5)
            assert [h.doc_id for h in hits] == ["m1"], query
            assert hits[0].text == "prefers seinen"
        assert [h.doc_id for h in await recaller.recall(user, "format", k=5)] == ["m2"]
        # The value is still found by its own word, and a fact without a key is unchanged.
        assert [h.doc_id for h in await recaller.recall(user, "seinen", k=5)] == ["m1"]
        assert [h.doc_id for h in await recaller.recall(user, "osaka", k=5)] == ["m3"]
    finally:
        await recaller.aclose()


def test_the_key_is_a_tag_once() -> None:
    record = memory(
        "m1",
        "prefers seinen",
        tags=("favorite_genre",),
        metadata={"preference_key": "favorite_genre"},
    )
    assert memory_doc(record).tags == ("favorite_genre",)
    plain = memory("m2", "Lives in Osaka", tags=("home",))
    assert memory_doc(plain).tags == ("home",)
