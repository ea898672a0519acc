"""The memory store's write path after issue #8's cuts: the tiered layer's entry
(``append_built``) writes exactly what ``append_through`` writes and still rejects what the
caller cannot have checked; the shortcuts (entity JSON built directly, flat sizes measured
at once, the turn size check's common case, a write updating the activity entry in place)
give what the general code gives, over randomised inputs."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.models import ActiveEntity, NewTurn, TextBlock
from tiermem.models.turns import Entity
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends import memory
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.codec import encode_turn
from tiermem.store.contract import (
    ENTITIES_RECORD,
    MAX_TURN_BYTES,
    BuiltAppend,
    CombinedAppend,
    EntityChange,
)
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

_ALPHABET = ["a", "Z", " ", '"', "\\", "\n", "\x7f", "é", "日", "😀", "\ud800", ":", "0"]


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(size))


def _entity(rng: random.Random) -> ActiveEntity:
    stamp = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(
        seconds=rng.randrange(10**6), microseconds=rng.choice([0, 1, 120, 999_999])
    )
    if rng.random() < 0.2:  # a caller's other timezone, kept by model_construct
        return ActiveEntity.model_construct(
            kind="k",
            value=_text(rng, 3),
            turn_index=None,
            updated_at=stamp.astimezone(timezone(timedelta(hours=2))),
        )
    return ActiveEntity(
        kind=_text(rng, rng.randrange(1, 6)).replace("\ud800", "x"),
        value=_text(rng, rng.randrange(0, 8)).replace("\ud800", "x"),
        turn_index=rng.choice([None, 0, 7, 10**12]),
        updated_at=stamp,
    )


def test_entity_json_is_pydantics_dump() -> None:
    rng = random.Random(8)
    for _ in range(2_000):
        entity = _entity(rng)
        assert memory._entity_json(entity) == entity.model_dump(mode="json")
        assert list(memory._entity_json(entity)) == list(entity.model_dump(mode="json"))


def _json_size(kind: object, value: object) -> int | None:
    """The reference: the member serialized as encode_data writes it."""
    try:
        member = json.dumps(
            {kind: value}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        return len(member.encode()) - 2
    except (TypeError, ValueError):
        return None


def _flat_value(rng: random.Random) -> object:
    def scalar() -> object:
        return rng.choice(
            [
                _text(rng, rng.randrange(0, 6)),
                rng.randrange(-(10**9), 10**9),
                True,
                False,
                None,
                1.5,
                float("inf"),
                [1],
                {"n": 1},
            ]
        )

    if rng.random() < 0.3:
        return scalar()
    value: dict[object, object] = {}
    for _ in range(rng.randrange(0, 5)):
        key: object = _text(rng, rng.randrange(0, 5)) if rng.random() < 0.95 else 3
        value[key] = scalar()
    return value


def test_member_size_is_the_serialized_size() -> None:
    rng = random.Random(9)
    for _ in range(5_000):
        kind = _text(rng, rng.randrange(1, 5))
        value = _flat_value(rng)
        assert memory._member_size(kind, value) == _json_size(kind, value), (kind, value)


def _turn(rng: random.Random) -> NewTurn:
    size = rng.choice(
        [
            0,
            5,
            memory._SMALL_TEXT - 3,
            memory._SMALL_TEXT + 3,
            MAX_TURN_BYTES - 40,
            MAX_TURN_BYTES + 10,
        ]
    )
    text = "x" * size + _text(rng, 3)
    blocks: list[Any] = [TextBlock(text=text)]
    if rng.random() < 0.2:
        blocks.append(TextBlock(text=_text(rng, 4)))
    metadata: dict[str, Any] = {}
    for _ in range(rng.randrange(0, 3)):
        metadata[_text(rng, 3)] = rng.choice([_text(rng, 3), 3, 2.5, None, True, [1, "\ud800"]])
    return NewTurn.model_construct(
        role="user",
        content=tuple(blocks),
        timestamp=datetime(2030, 1, 1, tzinfo=UTC),
        metadata=metadata,
        entities=tuple(
            Entity.model_construct(kind=_text(rng, 2), value=_text(rng, 3))
            for _ in range(rng.randrange(0, 3))
        ),
        agent_name=rng.choice([None, "", _text(rng, 3)]),
        intent=rng.choice([None, "", _text(rng, 3)]),
    )


def _raises(call: Any) -> str | None:
    try:
        call()
    except ValidationError as exc:
        return str(exc)
    return None


def test_turn_size_check_raises_what_encoding_raises() -> None:
    rng = random.Random(10)
    for _ in range(400):
        turn = _turn(rng).with_index(rng.randrange(100))
        checked = _raises(lambda turn=turn: memory._check_turn_size(turn))
        assert checked == _raises(lambda turn=turn: encode_turn(turn))


class _Pair:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.hot = MemoryHotStore(clock=self.clock)
        self.durable = MemoryDurableStore(clock=self.clock)


async def test_built_entry_writes_what_append_through_writes() -> None:
    rng = random.Random(11)
    public, built = _Pair(), _Pair()
    assert isinstance(built.hot, BuiltAppend)
    assert isinstance(built.hot, CombinedAppend)
    rejected = 0
    for step in range(300):
        texts = [_text(rng, 4).replace("\ud800", "x") for _ in range(rng.randrange(1, 4))]
        sid = rng.choice(["s1", "s2"])
        next_index = await public.durable.next_index(sid)
        kwargs: dict[str, Any] = {
            "window": rng.choice([1, 3, 20]),
            "hot_expires_at": public.clock.now() + timedelta(seconds=rng.choice([30, 600])),
            "durable_expires_at": rng.choice([None, public.clock.now() + timedelta(hours=1)]),
            "idempotency_key": rng.choice([None, None, f"k{rng.randrange(20)}"]),
            "first_index": rng.choice([None, next_index]),
        }
        if rng.random() < 0.4:
            entity = _entity(rng)
            entity = entity.model_copy(update={"kind": rng.choice(["series", "é:日", "k"])})
            kwargs["entities"] = EntityChange(
                upsert={entity.kind: entity}, remove=rng.choice([(), ("k",)])
            )
        turns = [text_turn(text) for text in texts]
        try:
            stored_a, result = await public.hot.append_through(public.durable, sid, turns, **kwargs)
        except ValidationError as exc:  # a lone surrogate in an entity: the same error
            message = str(exc)
            with pytest.raises(ValidationError) as caught:
                await built.hot.append_built(built.durable, sid, turns, **kwargs)
            assert str(caught.value) == message
            rejected += 1
            continue
        stored_b, version = await built.hot.append_built(built.durable, sid, turns, **kwargs)
        assert stored_a == stored_b
        assert (None if result is None else result.version) == version
        step_seconds = rng.choice([1, 100, 700])  # hot sessions expire now and then
        for pair in (public, built):
            pair.clock.advance(step_seconds)
        for sid in ("s1", "s2"):
            a, b = await public.hot.load(sid), await built.hot.load(sid)
            assert a == b, step
            record_a = await public.durable.get_record(sid, ENTITIES_RECORD)
            record_b = await built.durable.get_record(sid, ENTITIES_RECORD)
            assert record_a == record_b
            turns_a = await public.durable.get_turns(sid)
            assert turns_a == await built.durable.get_turns(sid)
    assert 0 < rejected < 30


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"idempotency_key": "bad\nkey"}, "idempotency_key"),
        ({"hot_expires_at": datetime(2030, 1, 1)}, "hot_expires_at"),
        ({"durable_expires_at": datetime(2030, 1, 1)}, "durable_expires_at"),
        ({"entities": EntityChange(remove=("bad\nkind",))}, "entity kind"),
    ],
)
async def test_built_entry_still_checks_what_the_caller_cannot_have(
    options: dict[str, Any], message: str
) -> None:
    pair = _Pair()
    kwargs: dict[str, Any] = {
        "window": 3,
        "hot_expires_at": pair.clock.now() + timedelta(minutes=1),
        "durable_expires_at": None,
        **options,
    }
    for append in (pair.hot.append_through, pair.hot.append_built):
        with pytest.raises(ValidationError, match=message):
            await append(pair.durable, "s", [text_turn("a")], **kwargs)
    huge = text_turn("x" * (MAX_TURN_BYTES + 1))
    with pytest.raises(ValidationError, match="turn 0"):
        await pair.hot.append_built(
            pair.durable,
            "s",
            [huge],
            window=3,
            hot_expires_at=pair.clock.now() + timedelta(minutes=1),
            durable_expires_at=None,
        )
    assert await pair.durable.next_index("s") == 0  # nothing written


async def test_a_write_ends_the_lease_on_its_activity_entry() -> None:
    """The activity entry is updated in place by a write: the lease an expiry claim took
    ends, as it did when a write put a fresh entry."""
    pair = _Pair()
    at = pair.clock.now()
    await pair.hot.append_built(
        pair.durable,
        "s",
        [text_turn("a")],
        window=3,
        hot_expires_at=at + timedelta(seconds=10),
        durable_expires_at=None,
    )
    pair.clock.advance(20)
    assert await pair.hot.claim_expired(owner="w1", lease=timedelta(minutes=5)) == ["s"]
    await pair.hot.append_built(
        pair.durable,
        "s",
        [text_turn("b")],
        window=3,
        hot_expires_at=pair.clock.now() + timedelta(seconds=10),
        durable_expires_at=None,
    )
    assert not await pair.hot.release_expired("s", owner="w1")  # the lease ended
    pair.clock.advance(20)
    assert await pair.hot.claim_expired(owner="w2", lease=timedelta(minutes=5)) == ["s"]


async def test_the_service_takes_the_built_entry_on_memory_pairs() -> None:
    calls: list[int] = []
    original = MemoryHotStore.append_built

    async def counted(self: MemoryHotStore, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await original(self, *args, **kwargs)

    MemoryHotStore.append_built = counted  # type: ignore[method-assign]
    try:
        settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
        async with MemoryService.from_settings(settings) as service:
            session = await service.session(user_id="u")
            await session.add_turn("user", "hello there")
            await session.add_turn("assistant", "hi")
            assert [t.text for t in await session.history()] == ["hello there", "hi"]
    finally:
        MemoryHotStore.append_built = original  # type: ignore[method-assign]
    assert len(calls) == 2
