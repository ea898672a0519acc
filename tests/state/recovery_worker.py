"""A worker process for tests/state/test_recovery.py (run as a script, not collected).

Runs one multi-step task of a session on a shared SQLite file (both tiers), the way an
agent would: claim the next step (``next_step(takeover=True)``: this worker resumes
whatever a dead one left in progress), do its side effect (append ``<step id> <pid>`` to
the effects file), record it (``complete_step``). A test kills it with SIGKILL and starts
another one on the same file.

``--hold POINT:STEP`` stops the worker for good at a chosen point of one step: ``claimed``
(started, no side effect yet), ``effect`` (side effect done, not recorded) or ``recorded``
(completed). It then writes ``--marker`` so the test knows where it stands, and waits for
its SIGKILL. ``--pace-ms`` makes each step take that long (a slow tool).

    python tests/state/recovery_worker.py DB SESSION EFFECTS --steps 8 [--hold effect:s03]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.state import StateCoordinator, Step

USER = "u-recovery"
TASK = "job"


def settings(db: Path) -> TierMemSettings:
    return TierMemSettings(hot_backend="sqlite", durable_backend="sqlite", sqlite_path=db)


def plan(steps: int) -> list[Step]:
    return [Step(step_id=f"s{n:02d}", tool="append", description=f"line {n}") for n in range(steps)]


def _hold_here(args: argparse.Namespace, point: str, step_id: str) -> None:
    if args.hold == f"{point}:{step_id}":
        Path(args.marker).write_text(f"{point}:{step_id}\n")
        while True:  # until the test's SIGKILL
            signal.pause()


def _side_effect(args: argparse.Namespace, step_id: str, pid: int) -> None:
    """The step's work: one line, written before the step is recorded as done. Blocking on
    purpose: a real tool call would hold the step just as long."""
    with open(args.effects, "a", encoding="utf-8") as effects:
        effects.write(f"{step_id} {pid}\n")
    if args.pace_ms:
        time.sleep(args.pace_ms / 1000)


async def run(args: argparse.Namespace) -> None:
    pid = os.getpid()
    async with MemoryService.from_settings(settings(Path(args.db))) as memory:
        session = await memory.session(args.session, user_id=USER)
        coord = await StateCoordinator.load(session, worker=f"pid-{pid}")
        await coord.create_task(TASK, plan(args.steps), goal="append one line per step")
        while (step := await coord.next_step(TASK, takeover=True)) is not None:
            _hold_here(args, "claimed", step.step_id)
            _side_effect(args, step.step_id, pid)
            _hold_here(args, "effect", step.step_id)
            await coord.complete_step(TASK, step.step_id, {"by": pid})
            _hold_here(args, "recorded", step.step_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("db")
    parser.add_argument("session")
    parser.add_argument("effects")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hold")
    parser.add_argument("--marker")
    parser.add_argument("--pace-ms", type=int, default=0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
