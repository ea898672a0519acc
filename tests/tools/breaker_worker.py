"""One tiermem worker process for the two-process breaker tests: a ToolDispatcher whose
breakers live in a Redis shared by every worker, driven by JSON commands on stdin.

    python -m tests.tools.breaker_worker REDIS_URL PREFIX

Tools: ``search`` (primary; what it does is set by the ``behave`` command) with fallback
``cached_search`` (always answers). Time is a FakeClock that the driver sets explicitly, so
every worker agrees on it. Commands (one JSON object per line; one JSON answer per line):

* ``{"op": "behave", "mode": "raise" | "ok" | "slow_ok" | "hang"}``
* ``{"op": "clock", "at": ISO}``
* ``{"op": "call", "n": N, "start_at": UNIX_TIME?}``: N concurrent calls of ``search``,
  begun together at wall time ``start_at`` (a start line for racing workers); answers
  ``{"tools": [...], "probes": P, "search_invocations": S}``
* ``{"op": "call_in_background"}``: start one call of a hanging ``search`` and answer once
  it runs (to be killed mid-call)
* ``{"op": "state"}``: the breaker as this worker reads it
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from tiermem.models import JsonValue
from tiermem.store.backends.redis_hot import RedisHotStore
from tiermem.testing import FakeClock
from tiermem.tools import (
    BreakerPolicy,
    FunctionInvoker,
    PartialSink,
    SharedBreakers,
    ToolDispatcher,
    ToolError,
    ToolRegistry,
    ToolSpec,
)

T0 = datetime.fromisoformat("2030-01-01T00:00:00+00:00")
POLICY = BreakerPolicy(
    failure_threshold=3,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=20),
)


class Worker:
    def __init__(self, url: str, prefix: str) -> None:
        self.clock = FakeClock(T0)
        self.store = RedisHotStore.from_url(url, clock=self.clock, prefix=prefix)
        self.mode = "ok"
        self.search_invocations = 0
        self.background: set[asyncio.Task[object]] = set()
        self.hanging = asyncio.Event()
        registry = ToolRegistry()
        invoker = FunctionInvoker({"search": self.search, "cached_search": self.cached})
        timeout = timedelta(seconds=10)
        registry.register(ToolSpec("cached_search", timeout=timeout), invoker)
        registry.register(
            ToolSpec("search", fallbacks=("cached_search",), timeout=timeout, breaker=POLICY),
            invoker,
        )
        self.tools = ToolDispatcher(
            registry, SharedBreakers(self.store, clock=self.clock), clock=self.clock
        )

    async def search(self, arguments: Mapping[str, JsonValue], emit: PartialSink) -> str:
        self.search_invocations += 1
        if self.mode == "raise":
            raise ConnectionError("catalog service refused the connection")
        if self.mode == "slow_ok":
            # Long enough that every racing caller checks while this probe is in flight.
            await asyncio.sleep(0.5)
        if self.mode == "hang":
            self.hanging.set()
            await asyncio.Event().wait()
        return "fresh"

    async def cached(self, arguments: Mapping[str, JsonValue], emit: PartialSink) -> str:
        return "cached"

    async def one_call(self) -> dict[str, JsonValue]:
        try:
            result = await self.tools.call("search", {"q": "Berserk"})
        except ToolError as exc:
            return {"tool": None, "error": type(exc).__name__, "probe": False}
        return {
            "tool": result.tool,
            "probe": any(a.probe for a in result.attempts),
            "note": result.agent_note,
        }

    async def handle(self, command: dict[str, JsonValue]) -> dict[str, JsonValue]:
        op = command["op"]
        if op == "behave":
            self.mode = str(command["mode"])
            return {"ok": True}
        if op == "clock":
            self.clock.set(datetime.fromisoformat(str(command["at"])))
            return {"ok": True}
        if op == "call":
            start_at = command.get("start_at")
            if isinstance(start_at, float | int):
                await asyncio.sleep(max(0.0, start_at - time.time()))
            before = self.search_invocations
            n = int(command.get("n", 1))  # type: ignore[arg-type]
            results = await asyncio.gather(*(self.one_call() for _ in range(n)))
            return {
                "results": list(results),
                "probes": sum(1 for r in results if r["probe"]),
                "search_invocations": self.search_invocations - before,
            }
        if op == "call_in_background":
            task = asyncio.create_task(self.one_call())
            self.background.add(task)
            await self.hanging.wait()  # the call is inside the tool: the probe is claimed
            return {"ok": True}
        if op == "state":
            state = await self.tools.breakers.state("search")
            return {"status": state.status.value, "probe_id": state.probe_id}
        raise ValueError(f"unknown op {op!r}")


async def main(url: str, prefix: str) -> None:
    worker = Worker(url, prefix)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        answer = await worker.handle(json.loads(line))
        print(json.dumps(answer), flush=True)
    await worker.store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
