"""Review of session 15 (R2): talking about a genre does not hide the favourite genre.

8e13598 left out of the profile, and out of the recall block, a favourite that an active
entity of its kind contradicts, for genre and series as for language. But an active genre
or series is what the conversation is about: "Berserk is a seinen, right?" made ``genre:
seinen`` active, and the model lost the user's favourite shojo (for recommendations, and
to answer "what genre do I like?"). Only a language is a switch (seed 001's case): it
still overrides (tests/context/test_s15_profile_override.py). Fails on 9c40a30.
"""

from __future__ import annotations

from tiermem.clock import FakeClock
from tiermem.context.models import ContextWindow
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


def _system_text(window: ContextWindow) -> str:
    return "\n".join(i.text for i in window.items if i.kind in ("profile", "recall"))


async def test_a_genre_talked_about_leaves_the_favourite_genre_in_the_profile() -> None:
    memory = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with memory:
        first = await memory.session("s1", user_id="u")
        await first.add_turn("user", "My favorite series is Frieren. I prefer shojo.")
        await memory.drain()
        session = await memory.session("s2", user_id="u")
        await session.add_turn("user", "Berserk is a seinen, right?")
        await session.add_turn("assistant", "Yes, Berserk is a seinen. Vol 3 is in stock.")
        await memory.drain()
        window = await session.context("what genre do I like? recommend something")
        (entities,) = [i for i in window.items if i.kind == "entities"]
        assert "genre: seinen" in entities.text
        shown = _system_text(window)
        assert "prefers shojo" in shown
        assert "favorite series: Frieren" in shown
