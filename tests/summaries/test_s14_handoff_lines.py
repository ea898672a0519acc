"""The handoff summary says each line once (session 14, review probe p15).

Before: a session short enough to be summarized from all its raw turns was summarized
with its rolling summaries (of those same turns) as the prior, so the offline summarizer
carried each tier line and read the same sentence from its turn again: every line twice
in the interaction summary, in the roll-up and in the next session's context, and half
the handoff's token budget spent on the repeats.
"""

from __future__ import annotations

from datetime import timedelta

from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

SAID = [
    ("user", "I'm looking for a birthday gift for my nephew, he is 12."),
    ("assistant", "How about Naruto volume 1 or Spy x Family volume 1?"),
    ("user", "I'll think about it and come back tomorrow."),
]


def repeated(text: str) -> list[str]:
    lines = [line.strip() for line in text.replace(" - [", "\n- [").splitlines() if line.strip()]
    return sorted({line for line in lines if lines.count(line) > 1})


async def test_the_handoff_summary_and_roll_up_say_each_line_once() -> None:
    clock = FakeClock()
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=clock
    )
    async with service:
        session = await service.session("s1", user_id="u1")
        for role, text in SAID:
            await session.add_turn(role, text)
        await session.close()
        await service.drain()
        await service.roll_up("u1")
        (record,) = await service.longterm.list("u1", types=["interaction_summary"])
        assert repeated(record.content) == []
        for role, text in SAID:
            if role == "user":
                assert text in record.content
        history = await service.rollup.history("u1")
        assert repeated(history.text) == []
        clock.advance(timedelta(days=1))
        later = await service.session("s2", user_id="u1")
        await later.add_turn("user", "Hi, I'm back!")
        window = await later.context("Hi, I'm back!")
        for block in window.system:
            text = getattr(block, "text", "")
            assert repeated(text) == [], text
