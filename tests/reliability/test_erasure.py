"""Redaction and GDPR purge, checked by scanning every store raw.

A user's data goes everywhere a deployment writes: hot tier, archive, session records
(state, summaries, structured memory, handoff), long-term memories, knowledge documents,
the recall index, the user's session list. On the embedded SQLite deployment, on
Redis + Redis and on Redis + DynamoDB (real servers), the test writes all of that, then:

* redacts one turn: its content is gone from the hot window, the archive, recall, and --
  after the next summarization pass -- from the summaries; a raw scan of every store finds
  it nowhere;
* purges the user (``purge_user``): a raw scan of every SQLite table, every Redis key under
  the deployment's prefix and every DynamoDB item of the table finds neither the user's ids
  nor their content; another user's data is untouched.

The secrets are single lowercase tokens, so that a search index's tokenized postings
would show them too.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tests.reliability.store_scan import scan_dynamodb, scan_redis, scan_sqlite
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

REDACTED = "zqv7731redact"
PURGED = "zqv5520purge"
KEPT = "zqv8842keep"


@dataclass
class Deployment:
    name: str
    settings: TierMemSettings
    tmp_path: Path

    async def scan(self, needles: list[str]) -> list[str]:
        """Where any needle occurs in any store of the deployment."""
        found: list[str] = []
        if self.settings.durable_backend == "sqlite":
            assert self.settings.sqlite_path is not None
            found += scan_sqlite(self.settings.sqlite_path, needles)
        if "redis" in (self.settings.hot_backend, self.settings.durable_backend):
            from redis.asyncio import Redis

            client = Redis.from_url(self.settings.redis_url)
            try:
                found += await scan_redis(client, f"*{self.settings.redis_prefix}*", needles)
            finally:
                await client.aclose()
        if self.settings.durable_backend == "dynamodb":
            session = dynamodb_session()
            async with session.client(
                "dynamodb", endpoint_url=self.settings.dynamodb_endpoint_url
            ) as client:
                found += await scan_dynamodb(client, self.settings.dynamodb_table, needles)
        return found


@pytest.fixture(params=["sqlite", "redis+redis", "redis+dynamodb"])
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Deployment:
    if request.param == "sqlite":
        settings = TierMemSettings(sqlite_path=tmp_path / "t.db")
    elif request.param == "redis+redis":
        settings = TierMemSettings(
            hot_backend="redis",
            durable_backend="redis",
            redis_url=server_url("redis"),
            redis_prefix=f"e{uuid.uuid4().hex[:8]}",
            sqlite_path=tmp_path / "index.db",  # the search index (no RediSearch here)
        )
    else:
        endpoint = server_url("dynamodb")
        settings = TierMemSettings(
            hot_backend="redis",
            redis_url=server_url("redis"),
            redis_prefix=f"e{uuid.uuid4().hex[:8]}",
            durable_backend="dynamodb",
            dynamodb_endpoint_url=endpoint,
            dynamodb_table=await shared_table(endpoint),
            aws_region="us-east-1",
        )
    return Deployment(request.param, settings, tmp_path)


async def _fill(memory: MemoryService, user: str, session_id: str, secret: str) -> Any:
    """Everything a user can leave behind, each carrying ``secret``."""
    session = await memory.session(session_id, user_id=user)
    await session.add_turn("user", f"I prefer seinen manga, code {secret}. Berserk vol 42?")
    await session.add_turn("assistant", f"Noted {secret}; Berserk 42 is in stock.")
    await session.put_state("cart", {"items": ["berserk-42"], "note": secret})
    await memory.longterm.remember(user, f"Ships to Osaka, locker {secret}")
    await memory.knowledge.add_document(user, "notes.md", f"# Notes\n\nLocker {secret}".encode())
    return session


async def test_redaction_and_purge_leave_nothing_in_any_store(deployment: Deployment) -> None:
    run = uuid.uuid4().hex[:8]
    user, other = f"u-{run}", f"v-{run}"
    sid, other_sid = f"s-{run}", f"t-{run}"
    async with MemoryService.from_settings(deployment.settings) as memory:
        session = await _fill(memory, user, sid, PURGED)
        await _fill(memory, other, other_sid, KEPT)
        card = await session.add_turn("user", f"my card number is {REDACTED}, ship express")
        for n in range(8):
            await session.add_turn("user" if n % 2 else "assistant", f"about Vinland Saga {n}")
        await memory.drain()
        last = card.index + 8
        summaries = await session.summaries(wait_through=last)
        assert REDACTED in summaries.model_dump_json()  # the summaries did derive from it
        assert await memory.longterm.recall(user, REDACTED, scope=("turn",))

        # -- redaction -----------------------------------------------------------------
        await session.redact_turn(card.index)
        assert REDACTED not in (await session.get_turn(card.index)).model_dump_json()
        assert all(REDACTED not in t.model_dump_json() for t in await session.history())
        assert await memory.longterm.recall(user, REDACTED, scope=("turn",)) == []
        assert REDACTED not in (await session.summaries()).model_dump_json()
        more = await session.add_turn("user", "and Monster vol 3")
        rebuilt = await session.summaries(wait_through=more.index)  # the next pass
        assert rebuilt.watermarks.summarized_through >= more.index
        assert rebuilt.tiers, "the next pass rebuilt the summaries"
        assert REDACTED not in rebuilt.model_dump_json()
        await memory.drain()
        residue = await deployment.scan([REDACTED])
        # No residue anywhere: the SQLite index has had no FTS5 segments (which kept a
        # deleted document's terms until a merge) since its migration 3.
        assert residue == []

        # -- purge ---------------------------------------------------------------------
        await session.close()  # the handoff writes an interaction summary memory
        await memory.roll_up(user)
        await memory.drain()
        assert await deployment.scan([PURGED]), "the scan must see the data before the purge"
        deleted = await memory.purge_user(user)
        assert deleted >= 2
        await memory.drain()
        leftovers = await deployment.scan([PURGED, user, sid])
        assert leftovers == [], leftovers
        # The other user is untouched, in the stores and through the service.
        assert await deployment.scan([KEPT])
        kept = await memory.session(other_sid, user_id=other)
        assert (await kept.get_turn(0)).text.endswith("Berserk vol 42?")
        assert await memory.longterm.recall(other, KEPT)


def held_in_memory(needles: list[str]) -> list[str]:
    """The strings (and bytes) of this process that contain a needle, each with the type
    of the tracked object it was found under: through every object the garbage collector
    tracks and, below them, the containers it does not track (tuples and dicts of
    strings). The needles themselves, this scan's own objects and the frames now running
    (the test's locals) are left out."""
    import gc
    import sys

    raw = [n.encode() for n in needles]
    found: list[str] = []
    skip = {id(n) for n in needles} | {id(raw), id(found), id(needles)}
    frame = sys._getframe()
    while frame is not None:
        skip.add(id(frame))
        frame = frame.f_back
    seen: set[int] = set()
    objects = gc.get_objects()
    skip.add(id(objects))
    stack = [(o, o) for o in objects if id(o) not in skip]
    del objects
    skip.add(id(stack))
    while stack:
        obj, root = stack.pop()
        for ref in gc.get_referents(obj):
            if id(ref) in skip or id(ref) in seen:
                continue
            if isinstance(ref, str):
                hit = any(n in ref for n in needles)
            elif isinstance(ref, (bytes, bytearray)):
                hit = any(n in ref for n in raw)
            else:
                if not gc.is_tracked(ref):  # an untracked tuple or dict: look inside
                    seen.add(id(ref))
                    stack.append((ref, root))
                continue
            if hit:
                seen.add(id(ref))
                where = type(root).__qualname__
                if isinstance(root, dict):
                    where += f" {list(root)[:3]}"
                found.append(f"{where}: {ref[:100]!r}")
    return found


async def test_after_a_purge_the_process_keeps_none_of_the_users_text(
    deployment: Deployment,
) -> None:
    """A purge also empties what this process keeps of the user: the summary jobs' and the
    context cache's entries of their sessions, the caches keyed by text (every Lru, the
    entity tables) and the background worker's last batch. Found by walking every object
    of the process after the purge (``held_in_memory``); the scan sees the text before it."""
    run = uuid.uuid4().hex[:8]
    user, sid = f"u-{run}", f"s-{run}"
    # Made here, not a constant: no source line or earlier report of this process holds it.
    secret = f"zqv{uuid.uuid4().hex[:10]}"
    async with MemoryService.from_settings(deployment.settings) as memory:
        session = await _fill(memory, user, sid, secret)
        for n in range(12):
            await session.add_turn(
                "user" if n % 2 == 0 else "assistant",
                f"My cat {secret}ette likes the series {secret} Chronicles vol {n}.",
            )
            await session.history()
        last = (await session.metadata()).turn_count - 1
        await session.summaries(wait_through=last)
        await session.context(query=f"what about {secret}?")
        await memory.longterm.recall(user, f"{secret} chronicles")
        await memory.drain()
        del session
        before = held_in_memory([secret])
        assert before, "the scan must see the text before the purge"
        del before

        await memory.purge_user(user)
        await memory.drain()
        left = held_in_memory([secret])
        assert left == [], "\n".join(left)
