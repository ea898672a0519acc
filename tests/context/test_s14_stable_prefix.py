"""The cached prefix of a context does not change with the query (session 14).

The profile sits before the cache point. It held the memories the query recalled, so two
turns with different questions had different prefixes: a cache write and no hit on every
request. Now the profile is the preferences alone, and what a query recalls comes after
the cache point, in the recall block. Review probe p10.
"""

from __future__ import annotations

from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


async def test_the_prefix_is_the_same_for_two_queries_and_recall_still_finds_memories() -> None:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as memory:
        longterm = memory.longterm
        await longterm.remember(
            "u-prefix", "I prefer the Japanese edition", memory_type="preference"
        )
        await longterm.remember("u-prefix", "Lives in Osaka, ships to the Umeda store")
        await longterm.remember("u-prefix", "Ordered Vagabond vol 3 as a birthday gift")
        session = await memory.session(user_id="u-prefix")
        await session.add_turn("user", "Hello again")
        system = "You are a manga shop assistant."
        about_shipping = await session.context("where do you ship to, Osaka?", system=system)
        about_gifts = await session.context("what did I order as a gift?", system=system)
        assert about_shipping.prefix_fingerprint == about_gifts.prefix_fingerprint
        for window, expected in ((about_shipping, "Osaka"), (about_gifts, "birthday gift")):
            profile = [i for i in window.items if i.kind == "profile"]
            assert len(profile) == 1
            assert "Japanese edition" in profile[0].text
            assert expected not in profile[0].text
            recalled = " ".join(i.text for i in window.items if i.kind == "recall")
            assert expected in recalled
