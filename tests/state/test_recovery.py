"""Crash recovery across two real processes (issue #11, item 3).

A worker process runs a multi-step task on a SQLite file shared by both tiers, appending
each step's side effect to a file; the test kills it with SIGKILL in the middle of the
task, starts a new worker on the same file, and checks that the task finishes with every
step completed exactly once in the state, that no step recorded as done before the kill
was done again, and that the final state is exactly what the two workers wrote.

Synchronisation goes through files and the state itself, polled with a deadline: no
sleeps-and-hope.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.state.recovery_worker import TASK, USER, plan, settings
from tiermem.models import StateBlob
from tiermem.service import MemoryService
from tiermem.state import StepStatus, TaskState, TaskStatus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]

WORKER = Path(__file__).with_name("recovery_worker.py")
STEPS = 8
DEADLINE_S = 60.0


class Job:
    """One task run by worker processes on one SQLite file."""

    def __init__(self, tmp_path: Path, steps: int = STEPS) -> None:
        self.db = tmp_path / "shared.db"
        self.effects = tmp_path / "effects.txt"
        self.marker = tmp_path / "held.txt"
        self.session = "s-recovery"
        self.steps = steps
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(  # noqa: S603 -- this interpreter, our own script
            [
                sys.executable,
                str(WORKER),
                str(self.db),
                self.session,
                str(self.effects),
                "--steps",
                str(self.steps),
                "--marker",
                str(self.marker),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    def effect_lines(self) -> list[tuple[str, int]]:
        if not self.effects.exists():
            return []
        lines = self.effects.read_text().splitlines()
        return [(step, int(pid)) for step, pid in (line.split() for line in lines)]

    def read(self) -> tuple[StateBlob, StateBlob]:
        """The task blob as the durable tier and as the hot tier hold it."""

        async def read() -> tuple[StateBlob, StateBlob]:
            async with MemoryService.from_settings(settings(self.db)) as memory:
                session = await memory.session(self.session, user_id=USER)
                durable = await session.get_state("task", fresh=True)
                hot = await session.get_state("task")
                assert durable is not None
                assert hot is not None
                return durable, hot

        return asyncio.run(read())

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.poll() is None, f"the worker exited before the kill: {self.output(proc)}"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL

    def finish(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            code = proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert code == 0, self.output(proc)

    @staticmethod
    def output(proc: subprocess.Popen[bytes]) -> str:
        if proc.poll() is None:
            return "(still running)"
        out, err = proc.communicate()
        return (out + err).decode(errors="replace")[-4000:]


def poll(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``ready()``, failing at the deadline or when the worker dies first."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the worker exited before {what}: {Job.output(proc)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {DEADLINE_S} s")
        time.sleep(0.005)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    job = Job(tmp_path)
    yield job
    for proc in job.procs:  # only our own workers, by handle
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def completed(blob: StateBlob) -> set[str]:
    task = TaskState.model_validate(blob.data).task(TASK)
    assert task is not None
    return {s.step_id for s in task.steps if s.status is StepStatus.COMPLETED}


def check_final(job: Job, first: int, second: int, done_at_kill: set[str]) -> None:
    """The task is completed, each step exactly once in the state, by the worker that did
    it; the hot copy equals the durable one; side effects were not repeated for any step
    recorded as done before the kill."""
    durable, hot = job.read()
    assert hot == durable
    task = TaskState.model_validate(durable.data).task(TASK)
    assert task is not None
    assert task.status is TaskStatus.COMPLETED
    assert [s.step_id for s in task.steps] == [s.step_id for s in plan(job.steps)]
    assert all(s.status is StepStatus.COMPLETED for s in task.steps)
    effects = job.effect_lines()
    counts = Counter(step for step, _ in effects)
    assert set(counts) == {s.step_id for s in task.steps}
    for step_id in done_at_kill:
        assert counts[step_id] == 1, f"{step_id} was recorded as done, yet done again"
    # The result of each step names the worker whose side effect was recorded last.
    last_by = {step: pid for step, pid in effects}
    for step in task.steps:
        assert step.result == {"by": last_by[step.step_id]}
        assert step.worker == f"pid-{last_by[step.step_id]}"
        expected_by = first if step.step_id in done_at_kill else second
        assert last_by[step.step_id] == expected_by


# (hold point, step held, how often the held step's effect happens, its attempts)
HOLDS = [
    ("claimed", "s03", 1, 2),  # started, killed before its side effect: redone once
    ("effect", "s03", 2, 2),  # side effect done but not recorded: at-least-once
    ("recorded", "s03", 1, 1),  # recorded, killed before the next: never redone
]


@pytest.mark.parametrize(("point", "held", "effects", "attempts"), HOLDS, ids=[h[0] for h in HOLDS])
def test_a_worker_killed_at_a_chosen_point_is_continued_by_a_new_process(
    job: Job, point: str, held: str, effects: int, attempts: int
) -> None:
    first = job.start("--hold", f"{point}:{held}")
    poll("the hold marker", job.marker.exists, first)
    durable, _ = job.read()
    done_at_kill = completed(durable)
    job.kill(first)
    assert done_at_kill == {f"s{n:02d}" for n in range(int(held[1:]) + (point == "recorded"))}

    second = job.start()
    job.finish(second)
    check_final(job, first.pid, second.pid, done_at_kill)
    counts = Counter(step for step, _ in job.effect_lines())
    assert counts[held] == effects
    assert sum(counts.values()) == STEPS + effects - 1
    durable, _ = job.read()
    task = TaskState.model_validate(durable.data).task(TASK)
    assert task is not None
    assert {s.step_id: s.attempts for s in task.steps} == {
        s.step_id: attempts if s.step_id == held else 1 for s in plan(STEPS)
    }


def test_a_worker_killed_wherever_it_happens_to_be_is_continued(job: Job) -> None:
    """No hold: the kill lands wherever the worker is once it has recorded three steps
    (possibly between a durable write and its hot copy)."""
    first = job.start("--pace-ms", "20")
    poll("three recorded steps", lambda: len(job.effect_lines()) >= 4, first)
    job.kill(first)
    durable, _ = job.read()
    done_at_kill = completed(durable)
    assert len(done_at_kill) >= 3
    assert len(done_at_kill) < STEPS, "the worker finished before the kill"

    second = job.start()
    job.finish(second)
    check_final(job, first.pid, second.pid, done_at_kill)
    counts = Counter(step for step, _ in job.effect_lines())
    twice = {step for step, n in counts.items() if n > 1}
    # Only the step in flight at the kill may have been done twice.
    assert len(twice) <= 1
    assert not twice & done_at_kill
    assert os.path.getsize(job.db) > 0
