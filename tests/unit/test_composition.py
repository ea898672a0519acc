"""One composition root: an injected long-term memory brings the one index every part uses."""

from __future__ import annotations

from tiermem.clock import UlidFactory
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.memory import LongTermMemory
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock


async def test_an_injected_longterm_shares_its_index_with_knowledge() -> None:
    clock = FakeClock()
    durable = MemoryDurableStore(clock=clock)
    index = InProcessIndex(clock=clock)
    longterm = LongTermMemory(durable, index, clock=clock, ids=UlidFactory())
    async with MemoryService(
        MemoryHotStore(clock=clock), durable, clock=clock, longterm=longterm
    ) as memory:
        assert memory.longterm is longterm
        await memory.knowledge.add_document("u-1", "returns.txt", b"Returns within 30 days.")
        # The chunks went into the injected memory's index, not into a second one.
        hits = await index.search("u-1", "returns days", kinds=("chunk",), limit=5)
        assert len(hits) == 1
