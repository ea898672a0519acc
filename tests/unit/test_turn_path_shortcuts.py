"""Shortcuts on every turn's path keep what they replaced.

* :func:`validate_id` remembers the ids it accepted: a remembered id is accepted again
  without the checks, every other value is still checked (a bad id is refused however
  often it comes, a ``str`` subclass is never remembered), and the memory is bounded.
* The density score is built without ``ImportanceScore``'s checks: it is the score the
  checked constructor builds, for generated turns and for rules with other bounds.
* A session's background lane is kept per session id: each session's jobs still go to
  the lane its id hashes to (so they run in order), and the table is bounded.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.background import BackgroundWork
from tiermem.errors import ValidationError
from tiermem.models import TextBlock
from tiermem.policies.importance import (
    DEFAULT_IMPORTANCE_RULES,
    ImportanceScore,
    RuleImportanceScorer,
)
from tiermem.store import keys
from tiermem.store.keys import validate_id


def test_a_remembered_id_is_accepted_and_bad_ids_are_still_refused() -> None:
    assert validate_id("session-1", what="session_id") == "session-1"
    assert "session-1" in keys._VALID
    assert validate_id("session-1", what="session_id") == "session-1"
    for bad, message in [
        ("", "must not be empty"),
        ("a\nb", "control character"),
        ("x" * 257, "the limit is 256"),
        (42, "must be a string"),
    ]:
        for _ in range(2):  # refused the second time too: never remembered
            with pytest.raises(ValidationError, match=message):
                validate_id(bad, what="session_id")
    assert "a\nb" not in keys._VALID


def test_a_str_subclass_is_checked_every_time() -> None:
    class Sneaky(str):
        pass

    sneaky = Sneaky("sneaky-id")
    assert validate_id(sneaky, what="user_id") == "sneaky-id"
    assert not any(type(v) is not str for v in keys._VALID)


def test_the_remembered_ids_are_bounded() -> None:
    for n in range(keys._VALID_KEPT + 10):
        validate_id(f"bounded-{n}", what="session_id")
    assert len(keys._VALID) <= keys._VALID_KEPT
    assert validate_id("bounded-0", what="session_id") == "bounded-0"


WORDS = [
    "Hello", "ok", "thanks", "Berserk", "vol", "42", "ORD-12345", "ships", "tomorrow",
    "日本語", "ベルセルク", "1,200", "3.5", "the", "store", "!", "?", "\n",
]  # fmt: skip
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["user", "assistant"]),
    texts,
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_density_scores_are_what_the_checked_constructor_builds(
    role: str, text: str, a: float, b: float
) -> None:
    floor, ceiling = min(a, b), max(a, b)
    rules = replace(DEFAULT_IMPORTANCE_RULES, density_floor=floor, density_ceiling=ceiling)
    scored = RuleImportanceScorer(rules).score(role, (TextBlock(text=text),))
    if scored.reason != "density":
        return
    assert floor <= scored.score <= ceiling
    checked = ImportanceScore(scored.score, "density")
    assert scored == checked
    assert hash(scored) == hash(checked)
    assert repr(scored) == repr(checked)


def test_each_session_keeps_the_lane_its_id_hashes_to() -> None:
    async def scenario() -> None:
        work = BackgroundWork(workers=3, max_pending=30)
        ran: list[tuple[str, int]] = []

        def job(sid: str, n: int) -> object:
            async def run() -> None:
                ran.append((sid, n))

            return run

        sids = [f"s{n}" for n in range(12)]
        for n in range(3):
            for sid in sids:
                await work.submit("u", sid, job(sid, n))  # type: ignore[arg-type]
        for sid in sids:
            lane = work._lane_of[sid]
            assert lane is work._lanes[zlib.crc32(sid.encode()) % 3]
        await work.drain()
        for sid in sids:
            assert [n for s, n in ran if s == sid] == [0, 1, 2]
        await work.aclose()
        assert not work._lane_of

    asyncio.run(scenario())
