"""CPU per StateCoordinator save: one compare-and-set write of one layer blob
(``put_state``: durable compare-and-set, then the hot copy), through the public API.

Also measured: a step of a 6-step task (``next_step`` + ``complete_step``: two saves of the
task blob, which holds the finished tasks kept too; ``create_task`` shared out), a ``load``
(one read of the session), and ``to_agent_context`` (pure rendering, token counting
included). The session holds a realistic state: an intent with four slots and two
clarifications, a 6-step task, a cart and promotions.

Process CPU time (``time.process_time``: every thread, SQLite's included) is steadier than
wall time on a shared machine; each number is the median of 5 rounds. Writes
``bench/results/state_cost.json``::

    python bench/state_cost.py [--saves 2000] [--pairing memory+memory] [--pairing embedded]

Pairings: ``memory+memory``, ``embedded`` (in-process hot tier + SQLite file: the default)
and ``env`` (``TierMemSettings()`` from ``TIERMEM_*`` variables, e.g.
``TIERMEM_HOT_BACKEND=redis TIERMEM_REDIS_URL=redis://...``, for Redis and DynamoDB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.state import Cart, CartItem, Promotion, Slot, StateCoordinator, Step
from workload import RESULTS, write_results

ROUNDS = 5


def _service(pairing: str, tmp: Path) -> tuple[MemoryService, str]:
    """The service and the pairing's name (``env`` is named after its backends)."""
    if pairing == "memory+memory":
        settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    elif pairing == "embedded":
        settings = TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp / "bench.db"
        )
    elif pairing == "env":
        settings = TierMemSettings()
        pairing = f"{settings.hot_backend}+{settings.durable_backend}"
    else:
        raise SystemExit(f"unknown pairing {pairing!r}")
    service = MemoryService.from_settings(settings, auto_detect=False, index_turns=False)
    return service, pairing


async def _realistic(coord: StateCoordinator) -> None:
    await coord.set_intent(
        "buy_manga",
        agent="ShopAgent",
        slots=[
            Slot(name="title", required=True, prompt="Which series?"),
            Slot(name="volume", required=True, prompt="Which volume?"),
            Slot(name="format", valid_values=("paperback", "digital")),
            Slot(name="gift", valid_values=(True, False)),
        ],
    )
    await coord.infer_slot("title", "Berserk", turn_index=2)
    await coord.ask_clarification("q1", "The deluxe edition or the regular one?")
    await coord.ask_clarification("q2", "Shall I gift-wrap it?", slot="gift")
    await coord.refresh_environment(
        "shop",
        tier="premium",
        locale="ja-JP",
        cart=Cart(
            items=(
                CartItem(sku="b41", title="Berserk 41", unit_price=Decimal("1650")),
                CartItem(sku="v37", title="Vagabond 37", quantity=2, unit_price=Decimal("748")),
            ),
            currency="JPY",
        ),
        promotions=[Promotion(promotion_id="p1", title="Seinen week", detail="10% off seinen")],
    )


def _plan(n: int) -> list[Step]:
    tools = ["catalog.search", "stock.check", "price.quote", "cart.add", "promo.apply", "reply"]
    return [Step(step_id=f"s{i}", tool=tool) for i, tool in enumerate(tools[:n])]


async def _per_op(op: Callable[[], Awaitable[None]], count: int) -> tuple[float, float]:
    """CPU and wall seconds per call of ``op``: the median over 5 rounds of ``count / 5``
    calls, so that a burst of load from elsewhere on the machine skews one round only."""
    per_round = max(1, count // ROUNDS)
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(ROUNDS):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(per_round):
            await op()
        cpu.append((time.process_time() - cpu0) / per_round)
        wall.append((time.perf_counter() - wall0) / per_round)
    return statistics.median(cpu), statistics.median(wall)


async def measure(pairing: str, saves: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        service, label = _service(pairing, Path(tmp))
        async with service as memory:
            session = await memory.session(user_id="bench-user")
            coord = await StateCoordinator.load(session)
            await _realistic(coord)
            for i in range(50):  # warm up: caches, prepared statements, the file
                await coord.confirm_slot("volume", i)

            values = iter(range(100, 100 + saves))

            async def save() -> None:
                await coord.confirm_slot("volume", next(values))  # one changed value

            save_cpu, save_wall = await _per_op(save, saves)

            tasks = iter(range(saves))

            async def task_of_six_steps() -> None:
                task_id = f"t{next(tasks)}"
                await coord.create_task(task_id, _plan(6), budget=timedelta(minutes=5))
                while (step := await coord.next_step(task_id)) is not None:
                    await coord.complete_step(task_id, step.step_id, {"ok": True})

            task_cpu, _ = await _per_op(task_of_six_steps, max(5, saves // 12))

            async def load() -> None:
                await StateCoordinator.load(session)

            load_cpu, _ = await _per_op(load, max(5, saves // 10))

            async def render() -> None:
                coord.to_agent_context(budget_tokens=400, tokens=memory.tokens)

            render_cpu, _ = await _per_op(render, max(5, saves // 10))
            context = coord.to_agent_context(budget_tokens=400, tokens=memory.tokens)
            blobs = {
                name: len(json.dumps(blob.data, separators=(",", ":")).encode())
                for name, blob in (await session.view()).state.items()
            }
    return {
        "pairing": label,
        "saves": saves,
        "cpu_us_per_save": round(save_cpu * 1e6, 1),
        "saves_per_s": round(1 / save_wall, 1),
        "cpu_us_per_step_cycle": round(task_cpu / 6 * 1e6, 1),
        "cpu_us_per_load": round(load_cpu * 1e6, 1),
        "cpu_us_per_agent_context": round(render_cpu * 1e6, 1),
        "agent_context_tokens": context.tokens,
        "blob_bytes": blobs,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--saves", type=int, default=2000)
    parser.add_argument("--pairing", action="append")
    parser.add_argument("--out", type=Path, default=RESULTS / "state_cost.json")
    args = parser.parse_args()
    results = [await measure(p, args.saves) for p in args.pairing or ["memory+memory", "embedded"]]
    for r in results:
        print(
            f"{r['pairing']:>14}: {r['cpu_us_per_save']:8.1f} µs CPU/save, "
            f"{r['saves_per_s']:7.1f} saves/s, {r['cpu_us_per_step_cycle']:8.1f} µs CPU/step "
            f"(2 saves), load {r['cpu_us_per_load']:.1f} µs, context "
            f"{r['cpu_us_per_agent_context']:.1f} µs ({r['agent_context_tokens']} tokens)"
        )
    await asyncio.to_thread(write_results, args.out, results)


if __name__ == "__main__":
    asyncio.run(main())
