"""``Session.context()`` latency, CPU and round trips, by conversation length (issue #10).

Deployments: ``embedded`` (in-process hot tier + SQLite file, BM25 recall without
embeddings) and ``redis`` (Redis hot + Redis durable on one server, the server of
``TIERMEM_TEST_REDIS_URL``: run it under ``scripts/test.sh``). For each deployment and
each size (10 / 1,000 / 10,000 turns, added through the public API in batches of 50,
background work drained before timing) it times ``context()`` with a warm hot tier:
without a query (one hot read, the summary records, assembly) and, unless
``--no-query-only``, with a query (plus the user context and per-turn recall). Budget
8,000 tokens, system prompt "You sell manga.".

Like with like: from about 150 turns on a session has a rolling summary (about a thousand
tokens) and structured memory, and its window keeps only the newest few hot turns beside
them; a 10-turn session has neither and sends all ten turns. So besides ``10`` the bench
measures ``10+summary``: a 10-turn session given the largest session's three summary
records (summary, structured memory, watermarks), copied verbatim through the durable
store: the same summary, the same structured memory, the same number of kept hot turns.
Flatness is reported both ways: largest over ``10+summary`` (like with like) and largest
over ``10`` (which also measures the extra content).

Per case: p50/p99 wall time, mean process CPU per call (client: Python, threads
included), Redis server CPU per call (INFO, ``redis`` only), and the round trips of one
call (:class:`tiermem.testing.round_trips.RoundTrips`). The cases take turns in blocks of
10 calls, so that all of them see the same load on a shared machine; CPU per call is the
steadier figure there; quote ranges over runs. Writes ``bench/results/context.json``
(``--out`` to write elsewhere, e.g. for a before/after pair)::

    python bench/context.py [--deployments embedded redis] [--sizes 10 1000 10000]
        [--runs 300] [--no-query-only] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.session import Session, TurnInput
from tiermem.settings import TierMemSettings
from tiermem.summaries.jobs import STRUCTURED_RECORD, SUMMARY_RECORD, WATERMARKS_RECORD
from tiermem.testing.round_trips import RoundTrips
from workload import MESSAGES, RESULTS, write_results

MESSAGES = [*MESSAGES[:-1], "My budget for the Vagabond box set is 120 EUR.", MESSAGES[-1]]
QUERIES = ["What was my budget for the box set?", "Is Berserk in stock?", "order status"]
SYSTEM = "You sell manga."
RECORDS = (SUMMARY_RECORD, STRUCTURED_RECORD, WATERMARKS_RECORD)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def redis_cpu_s(url: str) -> float:
    """The Redis server's CPU time so far (user + sys)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        info = await client.info("cpu")
    finally:
        await client.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class _Case:
    """One session measured: its wall times, CPU and Redis server CPU, gathered in blocks."""

    def __init__(self, label: str, turns: int, session: Session) -> None:
        self.label, self.turns, self.session = label, turns, session
        self.walls: list[float] = []
        self.cpu_s = 0.0
        self.server_s = 0.0

    def summary(self, redis_url: str | None) -> dict[str, float]:
        calls = len(self.walls)
        out = {
            "p50_ms": round(statistics.median(self.walls), 3),
            "p99_ms": round(_pct(self.walls, 0.99), 3),
            "cpu_ms_mean": round(self.cpu_s / calls * 1000, 3),
        }
        if redis_url:
            out["redis_server_cpu_ms_mean"] = round(self.server_s / calls * 1000, 3)
        return out


async def _interleaved(
    cases: list[_Case],
    runs: int,
    call: Callable[[Session, int], Awaitable[Any]],
    redis_url: str | None,
    block: int = 10,
) -> None:
    """``runs`` calls per case, the cases taking turns in blocks of ``block`` calls: on a
    shared machine the load moves by the second, and every case sees the same load."""
    for case in cases:
        case.walls, case.cpu_s, case.server_s = [], 0.0, 0.0
        for i in range(20):  # warm-up
            await call(case.session, i)
    for start in range(0, runs, block):
        for case in cases:
            server0 = await redis_cpu_s(redis_url) if redis_url else 0.0
            cpu0 = time.process_time()
            for i in range(start, min(runs, start + block)):
                t0 = time.perf_counter()
                await call(case.session, i)
                case.walls.append((time.perf_counter() - t0) * 1000)
            case.cpu_s += time.process_time() - cpu0
            if redis_url:
                case.server_s += await redis_cpu_s(redis_url) - server0


async def _round_trips(session: Session) -> dict[str, int]:
    trips = RoundTrips()
    with trips.counting():
        await session.context(system=SYSTEM)
    return dict(trips.counts)


async def _fill(session: Session, turns: int) -> None:
    batch: list[TurnInput] = []
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        batch.append(TurnInput(role=role, content=f"{MESSAGES[i % len(MESSAGES)]} #{i}"))
        if len(batch) == 50:
            await session.add_turns(batch)
            batch = []
    if batch:
        await session.add_turns(batch)


async def _copy_summaries(memory: MemoryService, source: str, target: str) -> None:
    """``source``'s summary records, verbatim, as ``target``'s (the ``10+summary`` case)."""
    durable = memory.tiers.durable
    for kind in RECORDS:
        record = await durable.get_record(source, kind)
        if record is None:
            raise SystemExit(f"the {source} session has no {kind} record to copy")
        await durable.put_record(target, kind, record.data, expires_at=record.expires_at)


async def _describe(case: _Case) -> dict[str, Any]:
    window = await case.session.context(system=SYSTEM)
    return {
        "case": case.label,
        "turns": case.turns,
        "hot_turns": window.stats.hot_turns,
        "kept_turns": window.stats.kept_turns,
        "context_tokens": window.total_tokens,
        "tokens_by_tier": window.stats.tokens_by_tier,
        "round_trips_no_query": await _round_trips(case.session),
    }


async def _no_query(session: Session, i: int) -> None:
    await session.context(system=SYSTEM)


async def _query(session: Session, i: int) -> None:
    await session.context(query=QUERIES[i % len(QUERIES)], system=SYSTEM)


def _settings(deployment: str, tmp: Path) -> tuple[TierMemSettings, str | None]:
    if deployment == "redis":
        url = os.environ.get("TIERMEM_TEST_REDIS_URL")
        if not url:
            raise SystemExit("--deployments redis needs TIERMEM_TEST_REDIS_URL (scripts/test.sh)")
        prefix = f"cx{uuid.uuid4().hex[:6]}"
        settings = TierMemSettings(
            hot_backend="redis", durable_backend="redis", redis_url=url, redis_prefix=prefix
        )
        return settings, url
    settings = TierMemSettings(
        hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp / f"{uuid.uuid4()}.db"
    )
    return settings, None


async def measure(
    deployment: str, sizes: list[int], runs: int, with_query: bool, tmp: Path
) -> list[dict[str, Any]]:
    settings, redis_url = _settings(deployment, tmp)
    async with MemoryService.from_settings(settings) as memory:
        cases: list[_Case] = []
        for size in sorted(sizes):
            session = await memory.session(f"bench-{size}", user_id="bench-user")
            await _fill(session, size)
            cases.append(_Case(str(size), size, session))
        small = await memory.session("bench-10-summary", user_id="bench-user")
        await _fill(small, 10)
        await memory.drain()
        await _copy_summaries(memory, f"bench-{max(sizes)}", small.id)
        cases.append(_Case("10+summary", 10, small))
        results = [await _describe(case) for case in cases]
        await _interleaved(cases, runs, _no_query, redis_url)
        for result, case in zip(results, cases, strict=True):
            result["no_query"] = case.summary(redis_url)
        if with_query:
            await _interleaved(cases, runs, _query, redis_url)
            for result, case in zip(results, cases, strict=True):
                result["with_query"] = case.summary(redis_url)
    for result in results:
        print(json.dumps(result), flush=True)
    return results


def _ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    by_case = {r["case"]: r for r in results}
    sized = [r for r in results if r["case"] != "10+summary"]
    largest = max(sized, key=lambda r: r["turns"])
    out: dict[str, float] = {}
    for base in ("10+summary", "10"):
        if base not in by_case or by_case[base] is largest:
            continue
        for metric in ("p50_ms", "cpu_ms_mean"):
            ratio = largest["no_query"][metric] / by_case[base]["no_query"][metric]
            out[f"no_query_{metric}_ratio_{largest['case']}_to_{base}"] = round(ratio, 2)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--deployments", nargs="+", default=["embedded"], choices=["embedded", "redis"]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--no-query-only", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "context.json")
    args = parser.parse_args()
    report: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for deployment in args.deployments:
            results = await measure(
                deployment, args.sizes, args.runs, not args.no_query_only, Path(tmp)
            )
            report.append({"deployment": deployment, "cases": results, **_ratios(results)})
    write_results(
        args.out,
        report,
        deployments={
            "embedded": "in-process hot tier + SQLite, BM25 recall, no embeddings",
            "redis": "Redis hot + Redis durable on one server",
        },
        budget_tokens=8_000,
        runs=args.runs,
        load_average_1m=round(os.getloadavg()[0], 1),  # 2 cores, shared machine
        note=(
            "10+summary: a 10-turn session given the largest session's summary records "
            "(like with like); CPU per call is the steadier figure on a shared machine"
        ),
    )


if __name__ == "__main__":
    asyncio.run(main())
