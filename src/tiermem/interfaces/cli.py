"""The ``tiermem`` command line: wiring only. Each command group's logic lives in its own
module: :mod:`~.cli_doctor` (doctor, create-table), :mod:`~.cli_demo`, :mod:`~.cli_data`
(inspect, recall, import, export, sweep), :mod:`~.cli_chat` (chat and its tools in
:mod:`~.cli_tools`), :mod:`~.cli_server` (serve, mcp, keys). Settings are read from the
``TIERMEM_*`` environment once per command, here. See ``docs/cli.md``.
"""

from __future__ import annotations

from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer

from tiermem.interfaces import cli_data, cli_demo, cli_doctor, cli_server
from tiermem.interfaces.cli_common import RAW_IDS_OPTION, TENANT_OPTION, Ids, fail, run
from tiermem.settings import TierMemSettings

__all__ = ["app", "main"]

app = typer.Typer(help="tiermem: tiered memory and state for LLM agents.", no_args_is_help=True)
keys_app = typer.Typer(help="Create, revoke and list API keys (REST API and MCP over HTTP).")
app.add_typer(keys_app, name="keys")


def _ids(tenant: str, raw: bool) -> Ids:
    try:
        return Ids.of(tenant, raw)
    except ValueError as exc:
        fail(str(exc))


@app.command()
def version() -> None:
    """Print the installed tiermem version."""
    typer.echo(package_version("tiermem"))


@app.command()
def doctor() -> None:
    """Check the configured backends and the tokenizer; exit 1 if any check fails."""
    cli_doctor.doctor(TierMemSettings())


@app.command("create-table")
def create_table() -> None:
    """Create the DynamoDB table named by TIERMEM_DYNAMODB_TABLE (idempotent), with TTL on.

    For production, prefer deploy/dynamodb.yaml (CloudFormation); this is for development
    and DynamoDB Local.
    """
    cli_doctor.create_table(TierMemSettings())


@app.command()
def demo(
    serve: bool = typer.Option(
        False, "--serve", help="then keep the API and the web inspector running (api extra)"
    ),
    port: int = typer.Option(8080, min=1, max=65535, help="--serve: port on 127.0.0.1"),
) -> None:
    """Run a three-day manga-store story through every tier (hot, archive, summaries,
    structured memory, handoff, recall) as tenant 'local', printing context stats and the
    token savings; with --serve, leave the API and inspector running on localhost."""
    cli_demo.demo(TierMemSettings(), serve=serve, port=port)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="address to bind; beyond loopback needs keys"),
    port: int = typer.Option(8080, min=1, max=65535),
) -> None:
    """Run the REST API with the web inspector (/inspector/). Refuses to bind beyond
    localhost unless the keys file holds an active key."""
    cli_server.serve_api(TierMemSettings(), host, port)


@app.command()
def mcp(
    http: bool = typer.Option(False, "--http", help="streamable HTTP instead of stdio"),
    host: str = typer.Option("127.0.0.1", help="--http: address to bind"),
    port: int = typer.Option(8765, min=1, max=65535, help="--http: port"),
    tenant: str = typer.Option("local", help="stdio: the tenant every call acts as"),
) -> None:
    """Serve the MCP tools (add_turn, get_context, remember, recall, forget, memory_stats):
    over stdio for one local client, or over streamable HTTP (/mcp) with tenant API keys."""
    cli_server.serve_mcp(TierMemSettings(), http=http, host=host, port=port, tenant=tenant)


@app.command()
def chat(
    user: str = typer.Option("me", "--user", help="the user you chat as"),
    session: str | None = typer.Option(None, "--session", help="resume this session"),
    budget: int = typer.Option(8000, min=256, max=200_000, help="context budget in tokens"),
    tenant: str = TENANT_OPTION,
    raw_ids: bool = RAW_IDS_OPTION,
) -> None:
    """Chat with the configured LLM (or, with none, an offline extractive responder) using
    tiermem as memory; offers a calculator, time, text analyzer, knowledge search and
    remember-preference tools (/help)."""
    from tiermem.interfaces import cli_chat

    settings = TierMemSettings()
    run(
        cli_chat.chat(
            settings, _ids(tenant, raw_ids), user_id=user, session_id=session, budget=budget
        )
    )


@app.command()
def inspect(
    session: str = typer.Argument(..., help="session id"),
    tenant: str = TENANT_OPTION,
    raw_ids: bool = RAW_IDS_OPTION,
) -> None:
    """Show a session: metadata, hot turns, entities, state, durable records, stats."""
    run(cli_data.inspect_session(TierMemSettings(), _ids(tenant, raw_ids), session))


@app.command()
def recall(
    user: str = typer.Argument(..., help="user id"),
    query: str = typer.Argument(..., help="what to recall"),
    k: int = typer.Option(5, "-k", min=1, max=100, help="hits to show"),
    turns: bool = typer.Option(False, "--turns", help="include archived turns and documents"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    tenant: str = TENANT_OPTION,
    raw_ids: bool = RAW_IDS_OPTION,
) -> None:
    """Recall the user's memories most relevant to QUERY, best first, with provenance."""
    ids = _ids(tenant, raw_ids)
    run(
        cli_data.recall_memories(
            TierMemSettings(), ids, user, query, k=k, include_turns=turns, as_json=as_json
        )
    )


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    tenant: str = TENANT_OPTION,
    raw_ids: bool = RAW_IDS_OPTION,
) -> None:
    """Import sessions, turns and memories from a JSONL file (docs/jsonl.md), keeping
    timestamps and turn indexes. Importing a file again adds nothing."""
    run(cli_data.import_jsonl(TierMemSettings(), _ids(tenant, raw_ids), path))


@app.command()
def export(
    session: Annotated[
        list[str] | None, typer.Option("--session", help="a session to export (repeatable)")
    ] = None,
    user: Annotated[
        list[str] | None,
        typer.Option("--user", help="every session and memory of a user (repeatable)"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="file (default: stdout)")
    ] = None,
    memories: bool = typer.Option(True, help="with --user: include long-term memories"),
    tenant: str = TENANT_OPTION,
    raw_ids: bool = RAW_IDS_OPTION,
) -> None:
    """Export sessions (and users' memories) as JSONL, with original timestamps and turn
    indexes (docs/jsonl.md)."""
    if not session and not user:
        fail("name at least one --session or --user to export")
    run(
        cli_data.export_jsonl(
            TierMemSettings(),
            _ids(tenant, raw_ids),
            sessions=session or [],
            users=user or [],
            output=output,
            include_memories=memories,
        )
    )


@app.command()
def sweep(
    loop: bool = typer.Option(False, "--loop", help="keep sweeping every --interval seconds"),
    rounds: int = typer.Option(0, min=0, help="with --loop: stop after N rounds (0: forever)"),
    interval: float = typer.Option(30.0, min=0.0, help="seconds between rounds"),
    limit: int = typer.Option(100, min=1, max=10_000, help="sessions claimed per round"),
) -> None:
    """Run the expiry sweeper: hand off sessions whose hot tier expired and collect expired
    search documents; once, or in a loop."""
    count = (rounds or 1_000_000_000) if loop else 1
    run(cli_data.sweep(TierMemSettings(), rounds=count, interval=interval, limit=limit))


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Argument(..., help="tenant id: 1-32 of a-z, 0-9, '-'"),
    label: str | None = typer.Option(None, help="a note to recognise the key by"),
) -> None:
    """Create an API key for TENANT; the key is printed once."""
    cli_server.create_key(TierMemSettings(), tenant, label)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="the key id from `keys list`")) -> None:
    """Revoke a key; running servers refuse it from their next request."""
    cli_server.revoke_key(TierMemSettings(), key_id)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (never their secrets)."""
    cli_server.list_keys(TierMemSettings())


def main() -> None:
    app()
