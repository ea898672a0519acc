"""Redacting a turn after its session was handed off reaches long-term memory: the
interaction summary and preferences derived from the turn, and the roll-up digests built
from that summary, are rebuilt without it (or deleted), on the embedded and the production
pairing. Checked through every public read (memories with history, preferences with
history, recall in every scope, the roll-up history, the change log) and, for SQLite, a
raw scan of every table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import open_pairing
from tests.reliability.store_scan import scan_sqlite
from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.summaries import HANDOFF_RECORD
from tiermem.summaries.rollup import RollupPolicy

SECRET = "zorblaxian"
"""A distinctive word said once, in the turn that gets redacted."""

CONVERSATION = [
    ("user", "Hi! I'm looking for Berserk volume 42, my budget is ¥5,000."),
    ("assistant", "Berserk vol 42 is ¥990 and in stock."),
    ("user", f"My favorite genre is {SECRET}. Please remember the {SECRET} thing."),
    ("assistant", "Noted. Anything else?"),
    ("user", "Great, thanks, that was helpful!"),
]
SECRET_TURN = 2


async def leaks(memory: MemoryService, user: str) -> list[str]:
    """Every public place where SECRET still shows, by name."""
    found: list[str] = []
    records = await memory.longterm.list(user, include_superseded=True, limit=1000)
    found += [f"memory {r.memory_id}" for r in records if SECRET in r.model_dump_json()]
    prefs = await memory.longterm.preferences(user)
    for pref in prefs:
        key = str(pref.metadata.get("preference_key", ""))
        history = await memory.longterm.preference_history(user, key) if key else []
        found += [f"preference {p.memory_id}" for p in (pref, *history) if SECRET in p.content]
    hits = await memory.longterm.recall(user, SECRET, scope=("memory", "turn", "chunk"), k=50)
    found += [f"recall {h.model_dump_json()[:80]}" for h in hits if SECRET in h.model_dump_json()]
    history_text = (await memory.rollup.history(user)).text
    if SECRET in history_text:
        found.append("roll-up history")
    changes = await memory.longterm.changes(user, limit=1000)
    found += [f"change {c.entry_id}" for c in changes if SECRET in c.model_dump_json()]
    return found


@pytest.mark.parametrize("name", ["memory+sqlite", "redis+dynamodb"])
async def test_redacting_a_handed_off_turn_reaches_long_term_memory(
    name: str, tmp_path: Path
) -> None:
    async with open_pairing(name, tmp_path) as pairing:
        # A small individual budget: the session's summary rolls into its week at once, so
        # the digest exists without waiting past the turns' retention; a large weekly one,
        # so the digest states the session's facts.
        policy = RollupPolicy(individual_tokens=16, weekly_tokens=1000)
        memory = pairing.service(auto_detect=False, rollup_policy=policy)
        try:
            user, sid = f"u-red-{name[:5]}", f"s-red-{name[:5]}"
            session = await memory.session(sid, user_id=user)
            for role, text in CONVERSATION:
                await session.add_turn(role, text)
            await memory.drain()
            await session.summaries(wait_through=len(CONVERSATION) - 1)
            await session.close()  # the handoff, then the roll-up
            await memory.drain()
            # The derived memories did carry the secret before the redaction.
            before = await leaks(memory, user)
            assert any(b.startswith("memory") for b in before), before
            assert any(b.startswith("preference") for b in before), before
            weeks = [
                r
                for r in await memory.longterm.list(
                    user, types=["interaction_summary"], include_superseded=True
                )
                if r.metadata.get("rollup") == "week"
            ]
            assert any(SECRET in w.content for w in weeks), "a digest carried it"

            await session.redact_turn(SECRET_TURN)
            await memory.drain()
            assert await leaks(memory, user) == []
            if name == "memory+sqlite":
                residue = scan_sqlite(tmp_path / "durable" / "tiermem.db", [SECRET])
                assert residue == []  # the index's row and its tokens went together

            # Rebuilt, not just deleted: the session still has its summary and digest,
            # attributed to the session, from the turns that remain.
            every = await memory.longterm.list(
                user, types=["interaction_summary"], include_superseded=True
            )
            sessions = [r for r in every if "rollup" not in r.metadata]
            digests = [r for r in every if r.metadata.get("rollup") == "week"]
            assert len(sessions) == 1  # the old versions are gone, not kept as history
            assert sessions[0].provenance.session_id == sid
            assert "Berserk" in sessions[0].content or "budget" in sessions[0].content
            assert len(digests) == 1
            assert sessions[0].memory_id in digests[0].provenance.memory_ids
            record = await pairing.durable.get_record(sid, HANDOFF_RECORD)
            assert record is not None
            assert record.data["status"] == "done"
            assert record.data["memory_id"] == sessions[0].memory_id
            assert SECRET not in str(record.data)
            # Redacting another turn, and redacting again, stay consistent (idempotent).
            await session.redact_turn(SECRET_TURN)
            await session.redact_turn(0)
            assert await leaks(memory, user) == []
            every = await memory.longterm.list(
                user, types=["interaction_summary"], include_superseded=True
            )
            assert len([r for r in every if "rollup" not in r.metadata]) == 1
        finally:
            await memory.aclose()


async def test_a_preference_from_another_session_comes_back() -> None:
    clock = FakeClock()
    memory = MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, auto_detect=False
    )
    try:
        first = await memory.session("s-pref-1", user_id="u-pref")
        await first.add_turn("user", "My favorite genre is seinen.")
        await first.close()
        second = await memory.session("s-pref-2", user_id="u-pref")
        await second.add_turn("user", "Hello there.")
        said = await second.add_turn("user", f"My favorite genre is {SECRET}.")
        await second.close()
        current = await memory.longterm.get_preference("u-pref", "favorite_genre")
        assert current is not None
        assert SECRET in current.content  # the second session's handoff changed it

        await second.redact_turn(said.index)
        assert await leaks(memory, "u-pref") == []
        current = await memory.longterm.get_preference("u-pref", "favorite_genre")
        assert current is not None
        assert "seinen" in current.content
        assert current.provenance.session_id == "s-pref-1"
        # Redacting a turn the handoff took nothing from leaves the preference alone.
        await second.redact_turn(0)
        assert (await memory.longterm.get_preference("u-pref", "favorite_genre")) == current
    finally:
        await memory.aclose()


async def test_auto_detected_memories_of_the_turn_go_too() -> None:
    clock = FakeClock()
    policy = RollupPolicy(individual_tokens=16, weekly_tokens=1000)
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        rollup_policy=policy,
    )
    try:
        session = await memory.session("s-auto", user_id="u-auto")
        said = f"I always prefer {SECRET} manga. My favorite genre is {SECRET}."
        for role, text in [*CONVERSATION[:2], ("user", said), *CONVERSATION[3:]]:
            await session.add_turn(role, text)
        await session.close()
        await memory.drain()
        auto = [
            r
            for r in await memory.longterm.list("u-auto", include_superseded=True)
            if r.provenance.source == "auto" and SECRET in r.content
        ]
        assert auto, "auto-detection wrote memories from the turn"

        await session.redact_turn(SECRET_TURN)
        assert await leaks(memory, "u-auto") == []
        every = await memory.longterm.list("u-auto", include_superseded=True)
        assert [r.provenance.source for r in every if "rollup" not in r.metadata] == ["handoff"]
    finally:
        await memory.aclose()


@pytest.mark.parametrize("when", ["during the prepare", "during the apply"])
async def test_a_redaction_racing_the_handoff_is_undone_by_it(
    when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redaction runs inside the handoff (a hook on the handoff's own step: the real
    interleaving of two tasks, made deterministic): after the prepare read the turn, or
    while the apply writes the content prepared from it."""
    clock = FakeClock()
    memory = MemoryService(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, auto_detect=False
    )
    try:
        session = await memory.session("s-race", user_id="u-race")
        for role, text in CONVERSATION:
            await session.add_turn(role, text)
        await memory.drain()
        handoff = memory.handoff
        fired = False

        async def redact_once() -> None:
            nonlocal fired
            if not fired:
                fired = True
                await session.redact_turn(SECRET_TURN)

        if when == "during the prepare":
            prepare = handoff._prepare

            async def racing_prepare(view: Any) -> Any:
                content = await prepare(view)
                await redact_once()
                return content

            monkeypatch.setattr(handoff, "_prepare", racing_prepare)
        else:
            remember = memory.longterm.remember

            async def racing_remember(*args: Any, **kwargs: Any) -> Any:
                await redact_once()
                return await remember(*args, **kwargs)

            monkeypatch.setattr(memory.longterm, "remember", racing_remember)
        await session.close()
        await memory.drain()
        assert fired
        assert await leaks(memory, "u-race") == []
        every = await memory.longterm.list("u-race", types=["interaction_summary"])
        assert [r.provenance.session_id for r in every] == ["s-race"]
        record = await memory.tiers.durable.get_record("s-race", HANDOFF_RECORD)
        assert record is not None
        assert record.data["status"] == "done"
        assert record.data["memory_id"] == every[0].memory_id
        assert SECRET_TURN in record.data["redacted"]
    finally:
        await memory.aclose()
