"""What the pass-equivalence tests share: each pass's records, at the background's cadence.

Every ``test_sN_pass_*`` file compares the summarizer of its session with a reference copy
of the one before it by running a session's passes as the background would (first after
20 turns, then every 14) and comparing what each pass wrote, timestamps left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tiermem.service import MemoryService


def timeless(value: Any) -> Any:
    """``value`` without the fields that differ run to run: times and the job key."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not k.endswith("_at") and k != "job"}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


async def pass_records(
    memory: MemoryService,
    turns: Sequence[tuple[str, Any]],
    redactions: Mapping[int, int] | None = None,
) -> list[str]:
    """Each pass's summary and structured records (JSON, timeless), as a pass every 14
    turns wrote them; ``redactions``: after the n-th turn (1-based), redact that index.
    Closes ``memory``."""
    redactions = redactions or {}
    out = []
    try:
        session = await memory.session("s-equivalence", user_id="u-1")
        for n, (role, content) in enumerate(turns, start=1):
            await session.add_turn(role, content)
            if n in redactions:
                await session.redact_turn(redactions[n])
            if n < 20 or (n - 20) % 14:
                continue
            await memory.drain()
            await memory.summaries.run(session.id, next_index=n)
            records = [
                await memory.summaries.durable.get_record(session.id, kind)
                for kind in ("summary", "structured")
            ]
            row = [timeless(r.data) if r else None for r in records]
            out.append(json.dumps(row, sort_keys=True, ensure_ascii=False))
    finally:
        await memory.aclose()
    return out


def after_each(redact: set[int]) -> dict[int, int]:
    """Redactions of these indexes, each right after its own turn is added."""
    return {index + 1: index for index in redact}
