"""Helpers for the tool tests: a store proxy that counts shared-keyspace calls, and a
scripted invoker."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime

from tiermem.models import JsonValue, StateBlob
from tiermem.store.contract import HotStore
from tiermem.tools import PartialSink, ToolOutput


class CountingStore:
    """Forwards the shared keyspace to ``inner``, counting calls (each one round trip).

    With ``interleave`` every call yields to the event loop before and after it runs, so
    concurrent breaker checks really interleave between their read and their write, as
    they do across processes.
    """

    def __init__(self, inner: HotStore, *, interleave: bool = False) -> None:
        self.inner = inner
        self.interleave = interleave
        self.calls: Counter[str] = Counter()

    async def _yield(self) -> None:
        if self.interleave:
            await asyncio.sleep(0)

    async def get_shared(self, name: str) -> StateBlob | None:
        self.calls["get_shared"] += 1
        await self._yield()
        result = await self.inner.get_shared(name)
        await self._yield()
        return result

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        self.calls["put_shared"] += 1
        await self._yield()
        result = await self.inner.put_shared(
            name, data, expires_at=expires_at, expected_version=expected_version
        )
        await self._yield()
        return result

    async def delete_shared(self, name: str) -> bool:
        self.calls["delete_shared"] += 1
        return await self.inner.delete_shared(name)

    @property
    def round_trips(self) -> int:
        return sum(self.calls.values())


class ScriptedInvoker:
    """An invoker whose tools do what the test says: answer, fail, hang, or emit chunks.

    ``behaviour[tool]`` is one of ``"ok"``, ``"error"`` (a tool-reported error with a
    partial result), ``"raise"`` (the call cannot be made), ``"hang"`` (never answers, after
    emitting one chunk). ``calls`` counts invocations per tool; ``gates[tool]`` (when set)
    makes that tool's calls wait for the event first.
    """

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = dict(behaviour)
        self.calls: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}

    async def invoke(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue],
        *,
        request_id: str,
        emit: PartialSink,
    ) -> ToolOutput:
        self.calls[tool] += 1
        gate = self.gates.get(tool)
        if gate is not None:
            await gate.wait()
        mode = self.behaviour.get(tool, "ok")
        if mode == "ok":
            return ToolOutput.of_text(f"{tool}: {dict(arguments)}")
        if mode == "error":
            emit({"row": 1})
            return ToolOutput(
                content=(
                    {"type": "text", "text": "rows 1-10 of 50"},
                    {"type": "text", "text": "index shard 3 is down"},
                ),
                is_error=True,
            )
        if mode == "raise":
            raise ConnectionResetError("connection reset by peer")
        if mode == "hang":
            emit("first chunk")
            await asyncio.Event().wait()
        raise AssertionError(f"unknown behaviour {mode!r}")


async def until(condition: Callable[[], bool], *, turns: int = 1000) -> None:
    """Let other tasks run until ``condition`` holds (event-loop turns, no wall-clock sleep)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition not met after {turns} event-loop turns")
