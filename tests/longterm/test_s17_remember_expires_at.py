"""``remember(..., expires_at=)`` and ``supersede(..., expires_at=)`` (session 17): a caller
that knows when a memory stops being true sets its expiry, instead of the type's retention
counted from the write. Observed habits use it (a pattern written late still lapses 30 days
after its last session: tests/summaries/test_s16_observed_patterns.py). Runs on every
durable backend (the ``lt`` fixture); each case fails before session 17 (no such argument).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tests.longterm.conftest import LongTerm
from tiermem.errors import ValidationError


async def _listed(lt: LongTerm) -> list[str]:
    return [r.content for r in await lt.memory.list(lt.user, limit=50)]


async def test_the_given_expiry_replaces_the_types_retention(lt: LongTerm) -> None:
    now = lt.clock.now()
    soon = now + timedelta(days=3)
    record = await lt.memory.remember(
        lt.user, "Often asks about Berserk", memory_type="behavioral_pattern", expires_at=soon
    )
    assert record.expires_at == soon  # the type's retention would be 30 days
    later = await lt.memory.remember(
        lt.user, "Reads on the train", memory_type="fact", expires_at=now + timedelta(days=400)
    )
    assert later.expires_at == now + timedelta(days=400)  # longer than the type's is allowed
    lt.clock.advance(timedelta(days=3, seconds=1))
    assert await _listed(lt) == ["Reads on the train"]


async def test_a_repeat_with_an_expiry_sets_it_and_without_one_extends_only(
    lt: LongTerm,
) -> None:
    now = lt.clock.now()
    kind = "behavioral_pattern"
    first = await lt.memory.remember(lt.user, "Buys whole sets", memory_type=kind)
    assert first.expires_at == now + timedelta(days=30)
    shorter = await lt.memory.remember(
        lt.user, "Buys whole sets", memory_type=kind, expires_at=now + timedelta(days=5)
    )
    assert shorter.memory_id == first.memory_id
    assert shorter.expires_at == now + timedelta(days=5)  # given: kept as given
    lt.clock.advance(timedelta(days=1))
    again = await lt.memory.remember(lt.user, "Buys whole sets", memory_type=kind)
    assert again.expires_at == lt.clock.now() + timedelta(days=30)  # said again: restarts
    same = await lt.memory.remember(
        lt.user, "Buys whole sets", memory_type=kind, expires_at=again.expires_at
    )
    assert same.version == again.version  # nothing changed: nothing written


async def test_supersede_takes_an_expiry(lt: LongTerm) -> None:
    now = lt.clock.now()
    old = await lt.memory.remember(lt.user, "Often asks about Berserk (3 sessions)")
    new = await lt.memory.supersede(
        lt.user,
        old.memory_id,
        "Often asks about Berserk (4 sessions)",
        expires_at=now + timedelta(days=2),
    )
    assert new.expires_at == now + timedelta(days=2)
    lt.clock.advance(timedelta(days=2, seconds=1))
    assert await _listed(lt) == []


@pytest.mark.parametrize(
    ("when", "message"),
    [
        (datetime(2030, 1, 1), "no timezone"),
        ("2030-01-01T00:00:00Z", "aware datetime"),
        (None, "not after now"),  # replaced by now itself below
    ],
)
async def test_a_bad_expiry_is_refused_and_writes_nothing(
    lt: LongTerm, when: object, message: str
) -> None:
    given = lt.clock.now() if when is None else when
    with pytest.raises(ValidationError, match=message):
        await lt.memory.remember(lt.user, "Likes tea", expires_at=given)  # type: ignore[arg-type]
    old = await lt.memory.remember(lt.user, "Likes coffee")
    with pytest.raises(ValidationError, match=message):
        await lt.memory.supersede(
            lt.user,
            old.memory_id,
            "Likes green tea",
            expires_at=given,  # type: ignore[arg-type]
        )
    assert await _listed(lt) == ["Likes coffee"]
