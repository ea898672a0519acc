"""One of two processes writing to the same session (tests/reliability/test_concurrency.py).

``python -m tests.reliability.concurrency_worker CONFIG_JSON``: opens the service the
settings in the config name, waits for the start file, then runs its share of interleaved
operations on one session (an append, or every ``meta_every``-th operation a metadata
update and a compare-and-set increment of a shared state counter) and prints, as JSON, what
was acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tiermem.errors import ConflictError
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

COUNTER = "counter"


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.005)


async def increment(session: Any) -> int:
    """Read-modify-write of a shared counter: compare-and-set, re-read on conflict."""
    while True:
        blob = await session.get_state(COUNTER, fresh=True)
        current = int(blob.data["n"]) if blob is not None else 0
        version = blob.version if blob is not None else 0
        try:
            await session.put_state(COUNTER, {"n": current + 1}, expected_version=version)
            return current + 1
        except ConflictError:
            continue


async def run(config: dict[str, Any]) -> dict[str, Any]:
    settings = TierMemSettings(**config["settings"])
    memory = MemoryService.from_settings(
        settings, index_turns=False, auto_detect=False, auto_summarize=False
    )
    worker, ops, meta_every = config["worker"], config["ops"], config["meta_every"]
    turns: list[list[Any]] = []
    attributes: list[str] = []
    increments = 0
    async with memory:
        session = await memory.session(config["session_id"], user_id=config["user_id"])
        go = Path(config["go_file"])
        await asyncio.to_thread(Path(config["ready_file"]).touch)  # the parent waits for both
        await asyncio.to_thread(wait_for, go)  # both workers start together
        for i in range(ops):
            if i % meta_every == meta_every - 1:
                name = f"{worker}-{i}"
                await session.update_metadata(attributes={name: i})
                attributes.append(name)
                await increment(session)
                increments += 1
            else:
                turn = await session.add_turn("user", f"{worker} {i}")
                turns.append([turn.index, turn.text])
    return {"turns": turns, "attributes": attributes, "increments": increments}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(json.loads(sys.argv[1])))))
