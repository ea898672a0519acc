"""The SQLite index checks a batch of documents once (issue #8, session 18): its in-process
copy (a :class:`WarmingIndex` over an :class:`InProcessIndex`) takes the batch it checked
through ``upsert_checked``, where it was checked again by the warming index and once more
by the in-process one.

What the copies hold must not change: generated batches (warm, cold and loading users,
rewrites, expired documents, bad ids) go through the new path and through a copy of the
old one (kept here), and leave the same documents, postings and expiries, with the same
errors for bad ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.clock import FakeClock
from tiermem.errors import ValidationError
from tiermem.longterm import index_memory, index_sqlite
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import WarmingIndex, check_docs
from tiermem.longterm.index_sqlite import SQLiteIndex

START = datetime(2030, 1, 1, tzinfo=UTC)


async def _reference_upsert(index: WarmingIndex, docs: Sequence[IndexedDoc]) -> None:
    """``WarmingIndex.upsert`` as it was at 07fccef: it checks the batch, and the
    in-process index's ``upsert`` checks each warm user's part again."""
    check_docs(docs)
    by_user: dict[str, list[IndexedDoc]] = {}
    for doc in docs:
        by_user.setdefault(doc.user_id, []).append(doc)
    for user_id, user_docs in by_user.items():
        if user_id in index._warm:
            await index._inner.upsert(user_docs)
        elif user_id in index._loading:
            index._loading[user_id][1].append(("upsert", user_docs))


async def _new_upsert(index: WarmingIndex, docs: Sequence[IndexedDoc]) -> None:
    """What :class:`SQLiteIndex` does now: check, then hand the checked batch over."""
    check_docs(docs)
    index.upsert_checked(docs)


# One document: user, doc id, text, expiry in minutes from now (None: never; <= 0: expired).
_DOCS = st.lists(
    st.tuples(
        st.sampled_from(["u-warm", "u-cold", "u-load", "bad user!"]),
        st.sampled_from(["m-1", "m-2", "s#1", "s#2", "s#3", "", "x" * 300, "tab\there"]),
        st.sampled_from(["tea with milk", "green tea", "coffee", "漫画 manga", ""]),
        st.none() | st.integers(min_value=-2, max_value=30),
    ),
    max_size=6,
)
_BATCHES = st.lists(st.tuples(_DOCS, st.integers(min_value=0, max_value=20)), max_size=8)


def _doc(spec: tuple[str, str, str, int | None], now: datetime) -> IndexedDoc:
    user_id, doc_id, text, minutes = spec
    return IndexedDoc(
        user_id=user_id,
        doc_id=doc_id,
        kind="memory" if doc_id.startswith("m") else "turn",
        text=text,
        created_at=now,
        expires_at=None if minutes is None else now + timedelta(minutes=minutes),
    )


async def _apply(upsert: Any, batches: list[Any]) -> tuple[list[Any], Any]:
    clock = FakeClock(START)
    release = asyncio.Event()
    existing = IndexedDoc(
        user_id="u-load", doc_id="m-1", kind="memory", text="loaded tea", created_at=START
    )

    async def loader(user_id: str) -> list[IndexedDoc]:
        if user_id == "u-load":
            await release.wait()
            return [existing]
        return []

    index = WarmingIndex([loader], clock=clock)
    await index.warm("u-warm")
    loading = asyncio.create_task(index.warm("u-load"))
    await asyncio.sleep(0)  # the load starts and waits
    outcomes: list[Any] = []
    for specs, minutes in batches:
        now = clock.now()
        try:
            await upsert(index, [_doc(spec, now) for spec in specs])
        except ValidationError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append(None)
        clock.advance(timedelta(minutes=minutes))
    release.set()
    await loading
    inner = index._inner
    hits = [
        await index.search(user, query, kinds={"memory", "turn"}, limit=10)
        for user in ("u-warm", "u-load")
        for query in ("tea", "manga", "coffee")
    ]
    state = (inner._users, sorted(inner._expiries), inner._expiring, hits)
    return outcomes, state


@settings(max_examples=150, deadline=None)
@given(_BATCHES)
def test_the_in_process_copy_holds_what_it_held(batches: Any) -> None:
    new = asyncio.run(_apply(_new_upsert, batches))
    reference = asyncio.run(_apply(_reference_upsert, batches))
    assert new == reference


async def test_the_public_upsert_still_checks() -> None:
    index = WarmingIndex([], clock=FakeClock(START))
    await index.warm("u-1")
    bad = IndexedDoc(user_id="u-1", doc_id="", kind="turn", text="x", created_at=START)
    good = IndexedDoc(user_id="u-1", doc_id="s#1", kind="turn", text="tea", created_at=START)
    with pytest.raises(ValidationError, match="doc_id"):
        await index.upsert([good, bad])
    assert await index.search("u-1", "tea", kinds={"turn"}, limit=5) == []  # nothing written
    with pytest.raises(ValidationError, match="doc_id"):
        await index._inner.upsert([good, bad])


async def test_a_sqlite_index_batch_is_checked_once(tmp_path: Path, monkeypatch: Any) -> None:
    calls: list[int] = []

    def counting(docs: Sequence[IndexedDoc]) -> None:
        calls.append(len(docs))
        check_docs(docs)

    monkeypatch.setattr(index_sqlite, "check_docs", counting)
    monkeypatch.setattr(index_memory, "check_docs", counting)
    index = SQLiteIndex(tmp_path / "t.db", clock=FakeClock(START))
    try:
        docs = [
            IndexedDoc(user_id="u-1", doc_id=f"s#{i}", kind="turn", text="tea", created_at=START)
            for i in range(3)
        ]
        await index.search("u-1", "tea", kinds={"turn"}, limit=5)  # warms the user's copy
        calls.clear()
        await index.upsert(docs)
        assert calls == [3]
        hits = await index.search("u-1", "tea", kinds={"turn"}, limit=5)
        assert sorted(hit.doc_id for hit in hits) == ["s#0", "s#1", "s#2"]
    finally:
        await index.aclose()
