"""Redaction and the close-of-session handoff see a favourite a detected dislike ended
("my favorite genre is horror", later "I don't like horror anymore": the slot is retired,
``metadata["retired_by"]``).

Redacting a turn replays the favourite's versions without the ones citing it: a value the
turn stated is gone from the history too (before, a retired slot was read as no slot and
its history kept the redacted value: a privacy defect), an ending stays an ending, and
redacting the dislike's turn brings the favourite back. Closing a session whose own turns
ended the favourite keeps it ended (before, the handoff wrote the summary's value back).
On memory+memory, the embedded pairing (memory+sqlite, with a raw scan of the file) and
the production one (redis+dynamodb). Every test fails on the code before (09e1359)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from uuid import uuid4

import pytest

from tests.integration.conftest import open_pairing
from tests.reliability.store_scan import scan_sqlite
from tiermem.clock import FakeClock
from tiermem.models import MemoryRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import DurableStore
from tiermem.summaries import HANDOFF_RECORD

PAIRINGS = ["memory+memory", "memory+sqlite", "redis+dynamodb"]
KEY = "favorite_genre"


@dataclass
class Deployment:
    """A service on one pairing, and the user and session of one test (the servers of
    redis+dynamodb outlive a test: ids of their own)."""

    memory: MemoryService
    durable: DurableStore
    user: str = field(default_factory=lambda: f"u-{uuid4().hex[:12]}")
    sid: str = field(default_factory=lambda: f"s-{uuid4().hex[:12]}")

    async def say(self, texts: list[str], *, close: bool = False) -> None:
        session = await self.memory.session(self.sid, user_id=self.user)
        for text in texts:
            await session.add_turn("user", text)
        await self.memory.drain()
        if close:
            await session.close()
            await self.memory.drain()

    async def redact(self, index: int) -> None:
        session = await self.memory.session(self.sid, user_id=self.user)
        await session.redact_turn(index)
        await self.memory.drain()

    async def favourite(self, *, include_retired: bool = False) -> MemoryRecord | None:
        return await self.memory.longterm.get_preference(
            self.user, KEY, include_retired=include_retired
        )

    async def everything(self) -> list[MemoryRecord]:
        """Every memory of the user, superseded ones and the favourite's history included."""
        records = await self.memory.longterm.list(self.user, include_superseded=True, limit=1000)
        return [*records, *await self.memory.longterm.preference_history(self.user, KEY)]

    async def values(self) -> list[str]:
        """The favourite's versions, newest first: the slot (retired too), then its history."""
        slot = await self.favourite(include_retired=True)
        history = await self.memory.longterm.preference_history(self.user, KEY)
        seen = [] if slot is None else [slot]
        seen += [h for h in history if slot is None or h.memory_id != slot.memory_id]
        return [
            f"{'ended' if 'retired_by' in r.metadata else 'set'} {r.metadata['preference_value']}"
            for r in seen
        ]

    def cites(self, record: MemoryRecord, index: int) -> bool:
        prov = record.provenance
        return prov.session_id == self.sid and index in prov.turn_indexes

    async def citing(self, index: int) -> list[str]:
        return [r.memory_id for r in await self.everything() if self.cites(r, index)]


@asynccontextmanager
async def deployment(name: str, tmp_path: Path) -> AsyncIterator[Deployment]:
    if name == "memory+memory":
        clock = FakeClock()
        durable = MemoryDurableStore(clock=clock)
        memory = MemoryService(MemoryHotStore(clock=clock), durable, clock=clock)
        try:
            yield Deployment(memory, durable)
        finally:
            await memory.aclose()
        return
    async with open_pairing(name, tmp_path) as pairing:
        memory = pairing.service()
        try:
            yield Deployment(memory, pairing.durable)
        finally:
            await memory.aclose()


@pytest.mark.parametrize("closed", [False, True], ids=["open", "handed off"])
@pytest.mark.parametrize("name", PAIRINGS)
async def test_redacting_the_turn_of_an_ended_favourite_leaves_nothing_of_it(
    name: str, closed: bool, tmp_path: Path
) -> None:
    stated = "My favorite genre is horror, as my cousin Zorblax knows."
    async with deployment(name, tmp_path) as d:
        await d.say(
            [stated, "Is Berserk vol 3 in stock?", "I don't like horror anymore."],
            close=closed,
        )
        assert await d.favourite() is None
        assert await d.values() == ["ended horror", "set horror"]

        await d.redact(0)

        records = await d.everything()
        assert await d.citing(0) == []
        dumped = [r.model_dump_json() for r in records]
        for needle in ("Zorblax", "favorite genre: horror", "favorite genre is horror"):
            assert [j for j in dumped if needle in j] == [], needle
        hits = await d.memory.longterm.recall(
            d.user, "Zorblax favorite genre horror", scope=("memory", "turn", "chunk"), k=50
        )
        assert [h for h in hits if "Zorblax" in h.model_dump_json()] == []
        assert "Zorblax" not in (await d.memory.rollup.history(d.user)).text
        changes = await d.memory.longterm.changes(d.user, limit=1000)
        assert [c for c in changes if "Zorblax" in c.model_dump_json()] == []
        record = await d.durable.get_record(d.sid, HANDOFF_RECORD)
        assert (record is not None) is closed
        assert "Zorblax" not in str(record.data if record else "")
        if name == "memory+sqlite":
            assert scan_sqlite(tmp_path / "durable" / "tiermem.db", ["Zorblax"]) == []
        # Still no favourite (the value was only ever stated in the redacted turn), and
        # the dislike, said in a turn that stays, stays.
        assert await d.favourite() is None
        dislikes = await d.memory.longterm.get_preference(d.user, "opinion:genre:horror")
        assert dislikes is not None
        assert dislikes.metadata["preference_value"] == "dislikes"


@pytest.mark.parametrize("name", PAIRINGS)
async def test_an_ending_after_the_redacted_turn_stays_an_ending(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(
            [
                "My favorite genre is comedy.",
                "My favorite genre is horror.",
                "I don't like horror anymore.",
            ],
        )
        assert await d.values() == ["ended horror", "set horror", "set comedy"]

        await d.redact(0)

        assert await d.favourite() is None
        assert await d.values() == ["ended horror", "set horror"]
        ended = await d.favourite(include_retired=True)
        assert ended is not None
        assert ended.provenance.turn_indexes == (2,)
        dislike = await d.memory.longterm.get(d.user, str(ended.metadata["retired_by"]))
        assert dislike is not None
        assert dislike.content == "dislikes horror"
        assert await d.citing(0) == []


@pytest.mark.parametrize("name", PAIRINGS)
async def test_the_ending_holds_for_the_value_in_other_words(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(
            [
                "好きな言語は日本語",
                "My favorite language is Japanese.",
                "I don't like Japanese anymore.",
            ]
        )
        language = "preferred_language"
        assert await d.memory.longterm.get_preference(d.user, language) is None

        await d.redact(1)

        # "日本語" is the value the dislike of Japanese ended: it is not current again.
        assert await d.memory.longterm.get_preference(d.user, language) is None
        ended = await d.memory.longterm.get_preference(d.user, language, include_retired=True)
        assert ended is not None
        assert ended.metadata["preference_value"] == "日本語"
        assert "retired_by" in ended.metadata
        assert await d.citing(1) == []


@pytest.mark.parametrize("name", PAIRINGS)
async def test_redacting_a_restatement_after_the_ending_ends_it_again(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(
            [
                "My favorite genre is horror.",
                "I don't like horror anymore.",
                "My favorite genre is horror.",
            ],
        )
        current = await d.favourite()
        assert current is not None
        assert current.provenance.turn_indexes == (2,)

        await d.redact(2)

        # The slot as it was before the restatement: ended, not a value reading "no longer".
        assert await d.favourite() is None
        assert await d.values() == ["ended horror", "set horror"]
        assert await d.citing(2) == []


@pytest.mark.parametrize("name", PAIRINGS)
async def test_redacting_the_dislike_brings_the_favourite_back(name: str, tmp_path: Path) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(["My favorite genre is horror.", "I don't like horror anymore."])
        assert await d.favourite() is None

        await d.redact(1)

        current = await d.favourite()
        assert current is not None
        assert current.metadata["preference_value"] == "horror"
        assert current.provenance.turn_indexes == (0,)
        assert "retired_by" not in current.metadata
        assert await d.values() == ["set horror"]
        assert await d.citing(1) == []


@pytest.mark.parametrize("name", PAIRINGS)
async def test_closing_the_session_that_ended_the_favourite_keeps_it_ended(
    name: str, tmp_path: Path
) -> None:
    async with deployment(name, tmp_path) as d:
        await d.say(["I prefer horror.", "I hate horror."], close=True)

        assert await d.favourite() is None
        prefs = [p.content for p in await d.memory.longterm.preferences(d.user)]
        assert prefs == ["hates horror"]
        assert await d.values() == ["ended horror", "set horror"]
        summaries = await d.memory.longterm.list(d.user, types=["interaction_summary"])
        assert len(summaries) == 1  # the handoff did run
