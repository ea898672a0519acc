"""The conversation overrides the profile (seed 001, session 15).

Seed 001: "Profile says English, Redis says Japanese (user just switched) | Active
conversation overrides profile | Conversation tier wins for current session". The context
showed both the long-term profile (``preferred_language: English``) and the session's
active entities (``language: japanese``) with no rule between them, so the model could
follow the stale profile. Now a preference an active entity of its kind contradicts is
left out of the profile; the other preferences stay; the cached prefix changes when the
user switches and not from turn to turn.
"""

from __future__ import annotations

from tiermem.context.models import ContextWindow
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

SYSTEM = "You are a manga shop assistant."


def _profile(window: ContextWindow) -> str:
    (profile,) = [i for i in window.items if i.kind == "profile"]
    return profile.text


def _slow_prefix(window: ContextWindow) -> str:
    (slow,) = [p for p in window.cache_points if p.name == "slow"]
    return slow.fingerprint


def _memory_service() -> MemoryService:
    return MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory")
    )


# ------------------------------------------------------------------- the public API


async def test_an_active_language_leaves_the_contradicted_preference_out_of_the_profile() -> None:
    async with _memory_service() as memory:
        longterm = memory.longterm
        await longterm.upsert_preference("u-lang", "preferred_language", "English")
        await longterm.upsert_preference("u-lang", "favorite_genre", "seinen")
        await longterm.upsert_preference("u-lang", "preferred_format", "paperback")
        session = await memory.session(user_id="u-lang")
        await session.add_turn("user", "Hello again")
        before = await session.context("anything new?", system=SYSTEM)
        assert "preferred_language: English" in _profile(before)

        await session.add_turn("user", "Do you have Vagabond in Japanese?")
        window = await session.context("is it in stock?", system=SYSTEM)
        profile = _profile(window)
        assert "English" not in profile
        assert "favorite_genre: seinen" in profile
        assert "preferred_format: paperback" in profile
        (entities,) = [i for i in window.items if i.kind == "entities"]
        assert "language: japanese" in entities.text
        # The profile's provenance names what it shows, not the preference left out.
        (item,) = [i for i in window.items if i.kind == "profile"]
        preferences = await longterm.preferences("u-lang")
        shown = {
            r.memory_id for r in preferences if r.metadata["preference_key"] != "preferred_language"
        }
        assert set(item.provenance.memory_ids) == shown
        # The session overrides the stored preference; it does not correct it.
        (language,) = [
            r for r in preferences if r.metadata["preference_key"] == "preferred_language"
        ]
        assert language.metadata["preference_value"] == "English"


async def test_without_active_entities_the_profile_is_the_user_context_unchanged() -> None:
    async with _memory_service() as memory:
        longterm = memory.longterm
        await longterm.upsert_preference("u-none", "preferred_language", "English")
        await longterm.upsert_preference("u-none", "favorite_genre", "shojo")
        session = await memory.session(user_id="u-none")
        await session.add_turn("user", "Hello, anything to recommend?")
        window = await session.context("recommend something", system=SYSTEM)
        expected = await longterm.build_user_context("u-none", "", budget_tokens=800)
        assert _profile(window) == expected.text
        assert "preferred_language: English" in expected.text
        assert "favorite_genre: shojo" in expected.text


async def test_an_entity_that_agrees_with_the_profile_leaves_it_as_it_is() -> None:
    async with _memory_service() as memory:
        longterm = memory.longterm
        await longterm.upsert_preference("u-same", "preferred_language", "日本語")
        session = await memory.session(user_id="u-same")
        await session.add_turn("user", "Is Berserk vol 42 out in Japanese?")
        window = await session.context("is it out?", system=SYSTEM)
        assert "preferred_language: 日本語" in _profile(window)


async def test_the_prefix_holds_while_entities_stay_and_changes_once_at_a_switch() -> None:
    async with _memory_service() as memory:
        longterm = memory.longterm
        await longterm.upsert_preference("u-pfx", "preferred_language", "English")
        await longterm.upsert_preference("u-pfx", "favorite_genre", "shojo")
        session = await memory.session(user_id="u-pfx")
        await session.add_turn("user", "Do you have Berserk in Japanese?")
        first = await session.context("in Japanese?", system=SYSTEM)
        await session.add_turn("assistant", "Yes, volumes 1 to 42 are in stock.")
        await session.add_turn("user", "Great, how much is volume 42?")
        second = await session.context("how much?", system=SYSTEM)
        assert "English" not in _profile(first)
        assert _profile(first) == _profile(second)
        assert _slow_prefix(first) == _slow_prefix(second)
        assert first.prefix_fingerprint == second.prefix_fingerprint

        # The user switches back: the profile agrees again and its line returns, once.
        await session.add_turn("user", "Actually the English edition, please.")
        third = await session.context("English edition?", system=SYSTEM)
        await session.add_turn("user", "And volume 41 too.")
        fourth = await session.context("vol 41?", system=SYSTEM)
        assert "preferred_language: English" in _profile(third)
        assert _slow_prefix(third) != _slow_prefix(second)
        assert _slow_prefix(third) == _slow_prefix(fourth)
