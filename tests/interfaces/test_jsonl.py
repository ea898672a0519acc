"""JSONL import/export through the library (tiermem.interfaces.jsonl) on SQLite: round trips
keep indexes, timestamps and the analysed fields; re-imports add nothing; bad files fail
with the line named; tenant scopes map the file's ids."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiermem.errors import TierMemError, ValidationError
from tiermem.interfaces.jsonl import export_session, export_user, import_lines
from tiermem.interfaces.tenancy import TenantScope
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock

T0 = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[MemoryService]:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    service = MemoryService.from_settings(
        TierMemSettings(sqlite_path=tmp_path / "t.db", hot_window=4), clock=clock
    )
    try:
        yield service
    finally:
        await service.aclose()


async def _lines(memory: MemoryService, user: str, scope: TenantScope | None = None) -> list[str]:
    return [json.dumps(r) async for r in export_user(memory, user, scope=scope)]


async def _seed(memory: MemoryService, session_id: str = "s-1", user: str = "u-1") -> None:
    session = await memory.session(session_id, user_id=user)
    for i in range(7):
        role = "user" if i % 2 == 0 else "assistant"
        text = "I prefer seinen. Berserk vol 42?" if i == 0 else f"turn {i} about Vinland Saga"
        await session.add_turn(role, text, timestamp=T0 + timedelta(minutes=i))
    await session.put_state("cart", {"items": ["berserk-42"]})
    await memory.longterm.remember(user, "Ships to Osaka", memory_type="fact")
    await memory.drain()


async def test_round_trip_keeps_indexes_timestamps_and_analysis(
    memory: MemoryService, tmp_path: Path
) -> None:
    await _seed(memory)
    lines = await _lines(memory, "u-1")
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds[0] == "session"
    assert kinds.count("turn") == 7
    assert "memory" in kinds

    other = MemoryService.from_settings(TierMemSettings(sqlite_path=tmp_path / "other.db"))
    try:
        report = await import_lines(other, lines)
        assert (report.sessions, report.turns_added, report.turns_present) == (1, 7, 0)
        original = await memory.tiers.get_turns("s-1")
        copied = await other.tiers.get_turns("s-1")
        assert [t.index for t in copied] == list(range(7))
        assert [t.timestamp for t in copied] == [T0 + timedelta(minutes=i) for i in range(7)]
        for a, b in zip(original, copied, strict=True):
            assert a.model_dump(exclude={"metadata"}) == b.model_dump(exclude={"metadata"})
        view = await other.tiers.view("s-1")
        assert view is not None
        assert view.metadata.created_at == (await memory.tiers.view("s-1")).metadata.created_at  # type: ignore[union-attr]
        assert view.state["cart"].data == {"items": ["berserk-42"]}
        facts = await other.longterm.list("u-1", types=["fact"])
        assert [m.content for m in facts] == ["Ships to Osaka"]
        assert facts[0].provenance.source == "import"
        # And the export of the copy is the same file, turn for turn.
        again = await _lines(other, "u-1")
        turns = [json.loads(x) for x in lines if json.loads(x)["type"] == "turn"]
        turns2 = [json.loads(x) for x in again if json.loads(x)["type"] == "turn"]
        strip = [{k: v for k, v in t.items() if k != "metadata"} for t in turns]
        strip2 = [{k: v for k, v in t.items() if k != "metadata"} for t in turns2]
        assert strip == strip2
    finally:
        await other.aclose()


async def test_reimport_adds_nothing(memory: MemoryService) -> None:
    await _seed(memory)
    lines = await _lines(memory, "u-1")
    before = await memory.longterm.changes("u-1", limit=1000)
    report = await import_lines(memory, lines)
    assert report.turns_added == 0
    assert report.turns_present == 7
    assert report.memories_added == 0
    assert (await memory.tiers.view("s-1")).next_index == 7  # type: ignore[union-attr]
    assert len(await memory.longterm.changes("u-1", limit=1000)) == len(before)


async def test_an_interrupted_import_continues_where_it_stopped(memory: MemoryService) -> None:
    await _seed(memory)
    lines = await _lines(memory, "u-1")
    target = MemoryService.from_settings(TierMemSettings(durable_backend="memory"))
    try:
        first = await import_lines(target, lines[:4])  # session + 3 turns
        assert first.turns_added == 3
        second = await import_lines(target, lines)
        assert (second.turns_present, second.turns_added) == (3, 4)
        assert [t.index for t in await target.tiers.get_turns("s-1")] == list(range(7))
    finally:
        await target.aclose()


async def test_tenant_scopes_map_the_files_ids(memory: MemoryService) -> None:
    await _seed(memory, "acme:s-1", "acme:u-1")
    lines = await _lines(memory, "u-1", TenantScope("acme"))
    first = json.loads(lines[0])
    assert (first["session_id"], first["user_id"]) == ("s-1", "u-1")
    report = await import_lines(memory, lines, scope=TenantScope("beta"))
    assert report.turns_added == 7
    view = await memory.tiers.view("beta:s-1")
    assert view is not None
    assert view.metadata.user_id == "beta:u-1"
    assert (await memory.tiers.view("acme:s-1")).next_index == 7  # type: ignore[union-attr]


def _session(session_id: str = "s-9", user: str = "u-9") -> str:
    return json.dumps(
        {"type": "session", "session_id": session_id, "user_id": user, "created_at": T0.isoformat()}
    )


def _turn(index: int, text: str, session_id: str = "s-9") -> str:
    return json.dumps(
        {
            "type": "turn",
            "session_id": session_id,
            "index": index,
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "timestamp": (T0 + timedelta(seconds=index)).isoformat(),
        }
    )


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], "line 1: not JSON"),
        (["[1, 2]"], "line 1: expected a JSON object"),
        ([_turn(0, "hi")], "line 1: turn of session 's-9' comes before"),
        ([_session(), _turn(1, "hi")], "line 2: turn 1 of session 's-9' leaves a gap"),
        ([_session(), _turn(0, "a"), _turn(0, "b")], "already has a different turn 0"),
        ([_session(), json.dumps({"type": "turn", "session_id": "s-9"})], "line 2: bad turn"),
        ([json.dumps({"type": "session", "session_id": "", "user_id": "u"})], "line 1: bad"),
        ([_session(user="u\n1")], "line 1: bad session record"),
    ],
)
async def test_bad_files_fail_naming_the_line(
    memory: MemoryService, lines: list[str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("[", r"\[")):
        await import_lines(memory, lines)


async def test_lines_before_a_bad_one_are_imported(memory: MemoryService) -> None:
    lines = [_session(), _turn(0, "a"), _turn(1, "b"), _turn(3, "gap")]
    with pytest.raises(ValidationError, match="line 4"):
        await import_lines(memory, lines)
    assert [t.index for t in await memory.tiers.get_turns("s-9")] == [0, 1]


async def test_unknown_record_types_are_skipped_and_counted(memory: MemoryService) -> None:
    lines = [_session(), json.dumps({"type": "hologram", "x": 1}), _turn(0, "hello")]
    report = await import_lines(memory, lines)
    assert (report.skipped_unknown, report.turns_added) == (1, 1)


async def test_a_session_of_another_user_is_refused(memory: MemoryService) -> None:
    await import_lines(memory, [_session("s-9", "u-9")])
    with pytest.raises(ValidationError, match="belongs to another user"):
        await import_lines(memory, [_session("s-9", "intruder")])


async def test_export_of_a_missing_session_is_not_found(memory: MemoryService) -> None:
    with pytest.raises(TierMemError, match="does not exist"):
        [r async for r in export_session(memory, "nope")]


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda s: s.strip()
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_TEXT, min_size=1, max_size=6), junk=st.text(max_size=30))
async def test_fuzzed_lines_either_import_or_fail_cleanly(texts: list[str], junk: str) -> None:
    """Whatever the text of the turns or a junk line, import either stores exactly the
    turns given or raises a ValidationError -- never another exception."""
    service = MemoryService.from_settings(TierMemSettings(durable_backend="memory"))
    try:
        lines = [_session()] + [_turn(i, t) for i, t in enumerate(texts)]
        report = await import_lines(service, lines)
        stored = await service.tiers.get_turns("s-9")
        assert [t.content[0].text for t in stored] == texts  # type: ignore[union-attr]
        assert report.turns_added == len(texts)
        with contextlib.suppress(ValidationError):
            await import_lines(service, [junk])
        assert len(await service.tiers.get_turns("s-9")) == len(texts)
    finally:
        await service.aclose()
