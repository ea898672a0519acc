"""The data commands: ``inspect``, ``recall``, ``import``, ``export`` and ``sweep``.

Each is a coroutine taking plain values (the wiring in :mod:`tiermem.interfaces.cli` reads
the options), printing with rich. Ids are the tenant's (see
:mod:`tiermem.interfaces.cli_common`). Progress bars go to stderr, so ``export`` to stdout
stays clean JSONL.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tiermem.errors import NotFoundError
from tiermem.interfaces import jsonl
from tiermem.interfaces.cli_common import Ids, console, err_console, fail, open_memory
from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.tiers.tiered import SessionView

__all__ = [
    "RECORD_KINDS",
    "export_jsonl",
    "import_jsonl",
    "inspect_session",
    "recall_memories",
    "sweep",
]

RECORD_KINDS = ("metadata", "entities", "state", "summary", "summaries", "structured_memory")
"""Durable session records ``inspect`` looks for (the store has no listing of kinds)."""
_TEXT = 70


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


def _short(text: str, limit: int = _TEXT) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _when(value: datetime | None) -> str:
    return "" if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


def _turn_text(turn: Turn) -> str:
    from tiermem.models.content import text_of

    return text_of(turn.content) or f"[{', '.join(b.type for b in turn.content)}]"


# ---------------------------------------------------------------- inspect


async def inspect_session(settings: TierMemSettings, ids: Ids, session_id: str) -> None:
    """Print a session: metadata, hot turns, entities, state, durable records, stats.

    Raises:
        NotFoundError: no tier knows the session.
    """
    stored = ids.session(session_id)
    async with open_memory(settings) as memory:
        view = await memory.tiers.view(stored, refresh_ttl=False)
        if view is None:
            raise NotFoundError(f"session {session_id!r} does not exist (or has expired)")
        session = await memory.session(stored, user_id=view.metadata.user_id)
        stats = await session.stats()
        records = [
            (kind, await memory.tiers.durable.get_record(stored, kind)) for kind in RECORD_KINDS
        ]
        console.print(_metadata_table(ids, view))
        console.print(_turns_table(view))
        console.print(_entities_table(view))
        console.print(_state_table(view))
        records_table = Table(title="durable records", title_justify="left")
        for column in ("kind", "version", "updated", "expires", "bytes"):
            records_table.add_column(column)
        for kind, record in records:
            if record is not None:
                size = len(json.dumps(record.data, ensure_ascii=False).encode())
                records_table.add_row(
                    kind,
                    str(record.version),
                    _when(record.updated_at),
                    _when(record.expires_at),
                    str(size),
                )
        console.print(records_table)
        stats_table = Table(title="stats", title_justify="left", show_header=False)
        for name, value in stats.model_dump().items():
            if name != "session_id":
                stats_table.add_row(name, str(value))
        console.print(stats_table)


def _metadata_table(ids: Ids, view: SessionView) -> Table:
    table = Table(title="session", title_justify="left", show_header=False)
    meta = view.metadata
    rows = {
        "session_id": ids.show(meta.session_id),
        "user_id": ids.show(meta.user_id),
        "user_tier": str(meta.user_tier),
        "locale": meta.locale,
        "created_at": _when(meta.created_at),
        "last_activity": _when(meta.last_activity),
        "closed_at": _when(meta.closed_at),
        "turns": str(view.next_index),
        "served from": view.source,
        "hot expires": _when(view.expires_at),
        "active intent": meta.active_intent,
        "attributes": json.dumps(meta.attributes, ensure_ascii=False) if meta.attributes else "",
    }
    for key, value in rows.items():
        table.add_row(key, value)
    return table


def _turns_table(view: SessionView) -> Table:
    first = view.turns[0].index if view.turns else view.next_index
    table = Table(
        title=f"hot turns ({len(view.turns)} of {view.next_index}; {first} archived only)",
        title_justify="left",
    )
    for column in ("#", "role", "time", "tok", "imp", "text"):
        table.add_column(column, justify="right" if column in ("#", "tok", "imp") else "left")
    for turn in view.turns:
        table.add_row(
            str(turn.index),
            turn.role,
            _when(turn.timestamp),
            str(turn.token_count),
            f"{turn.importance:.2f}",
            _short(_turn_text(turn)),
        )
    return table


def _entities_table(view: SessionView) -> Table:
    table = Table(title="active entities", title_justify="left")
    for column in ("kind", "value", "turn", "updated"):
        table.add_column(column)
    for kind, entity in sorted(view.entities.items()):
        turn = "" if entity.turn_index is None else str(entity.turn_index)
        table.add_row(kind, entity.value, turn, _when(entity.updated_at))
    return table


def _state_table(view: SessionView) -> Table:
    table = Table(title="state", title_justify="left")
    for column in ("name", "version", "updated", "data"):
        table.add_column(column)
    for name, blob in sorted(view.state.items()):
        data = json.dumps(blob.data, ensure_ascii=False, sort_keys=True)
        table.add_row(name, str(blob.version), _when(blob.updated_at), _short(data, 90))
    return table


# ---------------------------------------------------------------- recall


async def recall_memories(
    settings: TierMemSettings,
    ids: Ids,
    user_id: str,
    query: str,
    *,
    k: int,
    include_turns: bool,
    as_json: bool,
) -> None:
    """Print the user's memories (and turns) most relevant to ``query``, best first."""
    if not query.strip():
        fail("the query is empty; give the words to recall by")
    async with open_memory(settings) as memory:
        scope: tuple[Any, ...] = ("memory", "turn", "chunk") if include_turns else ("memory",)
        hits = await memory.longterm.recall(ids.user(user_id), query, k=k, scope=scope)
    if as_json:
        out = [
            {
                "kind": h.kind,
                "score": round(h.score, 4),
                "text": h.text,
                "memory_id": h.memory.memory_id if h.memory else None,
                "session_id": ids.show(h.session_id or h.provenance.session_id) or None,
                "turn_indexes": list(h.provenance.turn_indexes),
            }
            for h in hits
        ]
        console.print_json(json.dumps(out, ensure_ascii=False))
        return
    if not hits:
        console.print(f"nothing recalled for {query!r}")
        return
    table = Table(title=f"recall {query!r} for {user_id}", title_justify="left")
    for column in ("#", "kind", "score", "text", "memory", "from"):
        table.add_column(column)
    for rank, hit in enumerate(hits, start=1):
        where = ids.show(hit.session_id or hit.provenance.session_id)
        if hit.provenance.turn_indexes:
            where += f" turn {','.join(map(str, hit.provenance.turn_indexes))}"
        memory_id = f"{hit.memory.memory_type} {hit.memory.memory_id}" if hit.memory else ""
        table.add_row(str(rank), hit.kind, f"{hit.score:.3f}", _short(hit.text), memory_id, where)
    console.print(table)


# ---------------------------------------------------------------- import / export


def _count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


async def import_jsonl(settings: TierMemSettings, ids: Ids, path: Path) -> jsonl.ImportReport:
    """Import a JSONL file with a progress bar over its lines (see :mod:`~.jsonl`)."""
    total = _count_lines(path)
    async with open_memory(settings) as memory:
        with _progress() as progress, path.open("rb") as fh:
            task = progress.add_task(f"import {path.name}", total=total)
            report = await jsonl.import_lines(
                memory, fh, scope=ids.scope, on_line=lambda: progress.advance(task)
            )
        await memory.drain()  # detection of imported user turns runs in the background
    console.print(
        f"imported {path}: {report.sessions} sessions, {report.turns_added} turns added, "
        f"{report.turns_present} already present, {report.memories_added} memories added, "
        f"{report.memories_present} already present"
        + (f", {report.skipped_unknown} unknown lines skipped" if report.skipped_unknown else "")
    )
    return report


@contextmanager
def _output(path: Path | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        fh = path.open("w", encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}; give a file in a writable directory")
    with fh:
        yield fh


async def _turn_total(memory: MemoryService, stored_sessions: list[str]) -> int:
    total = 0
    for sid in stored_sessions:
        view = await memory.tiers.view(sid, refresh_ttl=False)
        total += view.next_index if view else 0
    return total


async def export_jsonl(
    settings: TierMemSettings,
    ids: Ids,
    *,
    sessions: list[str],
    users: list[str],
    output: Path | None,
    include_memories: bool,
) -> int:
    """Write sessions (by id) and users (every session, plus memories) as JSONL to
    ``output`` (stdout when None); returns the number of lines written."""
    written = 0
    async with open_memory(settings) as memory:
        stored = [ids.session(s) for s in sessions]
        for user in users:
            stored += [r.session_id for r in await memory.list_sessions(ids.user(user))]
        total = await _turn_total(memory, stored)
        with _progress() as progress, _output(output) as out:
            task = progress.add_task("export turns", total=total)

            def advance() -> None:
                progress.advance(task)

            for session_id in sessions:
                async for record in jsonl.export_session(
                    memory, session_id, scope=ids.scope, on_turn=advance
                ):
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    written += 1
            for user in users:
                async for record in jsonl.export_user(
                    memory,
                    user,
                    scope=ids.scope,
                    include_memories=include_memories,
                    on_turn=advance,
                ):
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    written += 1
    if output is not None:
        err_console.print(f"wrote {written} lines to {output}")
    return written


# ---------------------------------------------------------------- sweep


async def sweep(settings: TierMemSettings, *, rounds: int, interval: float, limit: int) -> int:
    """Run the expiry sweeper ``rounds`` times (``interval`` seconds apart); returns how
    many sessions were handed off. The handoff logs each expired session's turn count
    (the summary handoff into long-term memory belongs to the summaries stage)."""
    handed = failed = 0
    async with open_memory(settings) as memory:
        expired: list[tuple[str, int]] = []

        async def handoff(view: SessionView) -> None:
            expired.append((view.metadata.session_id, view.next_index))

        sweeper = memory.sweeper(handoff)
        with _progress() as progress:
            task = progress.add_task("sweep rounds", total=rounds)
            for n in range(rounds):
                if n:
                    await asyncio.sleep(interval)
                result = await sweeper.sweep_once(limit=limit)
                handed += len(result.handed_off)
                failed += len(result.failed)
                progress.update(
                    task,
                    advance=1,
                    description=f"sweep: {handed} handed off, {failed} failed",
                )
    for session_id, turns in expired:
        console.print(f"expired: {session_id} ({turns} turns)")
    console.print(f"swept {rounds} round(s): {handed} sessions handed off, {failed} failed")
    return handed
