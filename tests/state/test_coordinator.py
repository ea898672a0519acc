"""StateCoordinator over real stores: each layer its own versioned blob, compare-and-set
with retries, exact restore after a hot loss, stale hot copies, time budgets on the
service clock, takeover between workers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta

import pytest

from tests.integration.conftest import Pairing
from tests.state.conftest import service_of
from tiermem.clock import Clock
from tiermem.errors import BudgetExceededError, ConflictError, CorruptDataError, ValidationError
from tiermem.models import JsonValue, StateBlob
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.state import (
    Cart,
    CartItem,
    Slot,
    SlotStatus,
    StateCoordinator,
    Step,
    StepStatus,
    TaskStatus,
)
from tiermem.state.coordinator import StateView
from tiermem.store.backends.memory import MemoryHotStore
from tiermem.testing.backend import fresh_id
from tiermem.tokens import TiktokenCounter

PLAN = [
    Step(step_id="find", tool="orders.get"),
    Step(step_id="track", tool="shipping.track"),
    Step(step_id="reply"),
]


async def open_session(memory: MemoryService, sid: str, **kw: str) -> Session:
    return await memory.session(sid, user_id="u-1", **kw)


async def busy(coord: StateCoordinator) -> None:
    """Change every layer: an intent with slots, a task half done, a cart."""
    await coord.set_intent(
        "track_order",
        agent="OrderAgent",
        slots=[
            Slot(name="order_id", required=True, prompt="Order number?"),
            Slot(name="carrier", valid_values=("yamato", "sagawa")),
        ],
    )
    await coord.infer_slot("carrier", "yamato", turn_index=3)
    await coord.ask_clarification("q1", "Which order?", slot="order_id")
    await coord.create_task("lookup", PLAN, goal="track", budget=timedelta(seconds=30))
    step = await coord.next_step("lookup")
    assert step is not None
    await coord.complete_step("lookup", step.step_id, {"order": "ORD-1"})
    await coord.next_step("lookup")
    await coord.refresh_environment(
        "cart",
        event_id="c1",
        cart=Cart(items=(CartItem(sku="b42", unit_price="1650"),), currency="JPY"),
        timezone="Asia/Tokyo",
    )


async def test_each_layer_is_its_own_versioned_blob(deployment: Pairing) -> None:
    memory = service_of(deployment)
    session = await open_session(memory, fresh_id("s"))
    coord = await StateCoordinator.load(session)
    assert coord.versions == {"conversation": 0, "task": 0, "environment": 0}
    await busy(coord)
    assert coord.versions == {"conversation": 3, "task": 4, "environment": 1}
    for name, version in coord.versions.items():
        blob = await session.get_state(name)
        assert blob is not None
        assert blob.version == version
    # A write to one layer leaves the others' versions alone.
    await coord.set_phase("tool_execution")
    assert coord.versions == {"conversation": 4, "task": 4, "environment": 1}


async def test_a_new_process_loads_exactly_what_was_stored(deployment: Pairing) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    coord = await StateCoordinator.load(await open_session(memory, sid))
    await busy(coord)
    again = await StateCoordinator.load(await open_session(service_of(deployment), sid))
    assert again.conversation == coord.conversation
    assert again.tasks == coord.tasks
    assert again.environment == coord.environment
    assert again.versions == coord.versions
    tokens = TiktokenCounter()
    assert again.to_agent_context(budget_tokens=500, tokens=tokens) == coord.to_agent_context(
        budget_tokens=500, tokens=tokens
    )


async def test_a_move_that_changes_nothing_writes_nothing(deployment: Pairing) -> None:
    coord = await StateCoordinator.load(await open_session(service_of(deployment), fresh_id("s")))
    await busy(coord)
    before = coord.versions
    await coord.infer_slot("carrier", "yamato", turn_index=3)
    await coord.complete_step("lookup", "find", {"order": "ORD-1"})
    await coord.create_task("lookup", PLAN, goal="track", budget=timedelta(seconds=30))
    await coord.refresh_environment("cart", event_id="c1", cart=Cart())  # redelivered
    assert coord.versions == before


async def test_a_hot_loss_restores_the_layers_exactly_and_versions_continue(
    deployment: Pairing,
) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    coord = await StateCoordinator.load(await open_session(memory, sid))
    await busy(coord)
    held = coord.versions

    await memory.tiers.hot.delete(sid)
    restored = await StateCoordinator.load(await open_session(memory, sid))
    assert (restored.conversation, restored.tasks, restored.environment) == (
        coord.conversation,
        coord.tasks,
        coord.environment,
    )
    assert restored.versions == held

    # Both the restored coordinator and the one that held the state before carry on.
    await restored.confirm_slot("order_id", "ORD-1")
    assert restored.versions["conversation"] == held["conversation"] + 1
    await coord.complete_step("lookup", "track", "in transit")
    assert coord.versions["task"] == held["task"] + 1
    await memory.tiers.hot.delete(sid)
    final = await StateCoordinator.load(await open_session(memory, sid))
    assert final.versions == {
        **held,
        "conversation": held["conversation"] + 1,
        "task": held["task"] + 1,
    }
    assert final.conversation == restored.conversation
    assert final.tasks == coord.tasks


async def test_two_coordinators_never_lose_an_update(deployment: Pairing) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    a = await StateCoordinator.load(await open_session(memory, sid), worker="a")
    names = [f"slot{n}" for n in range(12)]
    await a.set_intent("collect", slots=[Slot(name=n) for n in names])
    b = await StateCoordinator.load(await open_session(memory, sid), worker="b")
    await asyncio.gather(
        *((a if n % 2 else b).confirm_slot(name, n) for n, name in enumerate(names)),
        a.refresh_environment("profile", profile={"name": "Aki"}),
        b.create_task("t", PLAN),
    )
    final = await StateCoordinator.load(await open_session(memory, sid))
    assert [(s.name, s.value, s.status) for s in final.conversation.slots] == [
        (name, n, SlotStatus.CONFIRMED) for n, name in enumerate(names)
    ]
    assert final.versions["conversation"] == 1 + len(names)
    assert final.environment.profile == {"name": "Aki"}
    assert final.tasks.task("t") is not None


async def test_a_stale_hot_copy_is_read_past_not_written_over(deployment: Pairing) -> None:
    """A writer died between its durable write and the hot copy (simulated by a second
    service with its own hot tier): the hot copy the first service reads is stale, and its
    compare-and-set must re-read from the durable tier, not retry on the stale copy."""
    sid = fresh_id("s")
    memory = service_of(deployment)
    elsewhere = MemoryService(
        MemoryHotStore(clock=deployment.clock),
        deployment.durable,
        clock=deployment.clock,
        auto_detect=False,
        index_turns=False,
    )
    coord = await StateCoordinator.load(await open_session(memory, sid))
    await coord.set_intent("buy", slots=[Slot(name="genre"), Slot(name="volume")])
    other = await StateCoordinator.load(await open_session(elsewhere, sid))
    await other.confirm_slot("genre", "seinen")  # durable v2; this service's hot copy stays v1

    stale = await StateCoordinator.load(await open_session(memory, sid), attempts=3)
    assert stale.versions["conversation"] == 1
    await stale.confirm_slot("volume", 42)
    assert [s.value for s in stale.conversation.slots] == ["seinen", 42]
    assert stale.versions["conversation"] == 3
    # The successful write healed the hot copy.
    healed = await (await open_session(memory, sid)).get_state("conversation")
    assert healed is not None
    assert healed.version == 3


class _AlwaysLosing:
    """A session on which every compare-and-set loses."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.writes = 0

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def clock(self) -> Clock:
        return self.session.clock

    async def view(self) -> StateView:
        return await self.session.view()

    async def get_state(self, name: str, *, fresh: bool = False) -> StateBlob | None:
        return await self.session.get_state(name, fresh=fresh)

    async def put_state(
        self, name: str, data: Mapping[str, JsonValue], *, expected_version: int | None = None
    ) -> StateBlob:
        self.writes += 1
        raise ConflictError("lost", expected=expected_version, actual=99)


async def test_a_conflict_that_outlasts_the_retries_surfaces(deployment: Pairing) -> None:
    losing = _AlwaysLosing(await open_session(service_of(deployment), fresh_id("s")))
    coord = await StateCoordinator.load(losing, attempts=3)
    with pytest.raises(ConflictError, match="kept changing under 3 attempts"):
        await coord.set_phase("farewell")
    assert losing.writes == 3


async def test_the_time_budget_runs_on_the_service_clock(deployment: Pairing) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    coord = await StateCoordinator.load(await open_session(memory, sid))
    await coord.create_task("t", PLAN, budget=timedelta(seconds=3))
    await coord.next_step("t")
    deployment.clock.advance(2)
    assert coord.time_left("t") == timedelta(seconds=1)
    await coord.complete_step("t", "find", 1)
    deployment.clock.advance(1)
    with pytest.raises(BudgetExceededError, match="ran out of its 3 s budget"):
        await coord.next_step("t")
    # The timeout is stored, not only raised.
    stored = (await StateCoordinator.load(await open_session(memory, sid))).task("t")
    assert stored.status is TaskStatus.TIMED_OUT
    assert [s.status for s in stored.steps] == [
        StepStatus.COMPLETED,
        StepStatus.TIMED_OUT,
        StepStatus.TIMED_OUT,
    ]
    # Without a checkpoint there is nothing to roll back to (see the next test).
    with pytest.raises(ValidationError, match="no checkpoint"):
        await coord.rollback("t", "start", budget=timedelta(seconds=5))


async def test_a_result_after_the_deadline_is_kept_on_the_timed_out_step(
    deployment: Pairing,
) -> None:
    coord = await StateCoordinator.load(await open_session(service_of(deployment), fresh_id("s")))
    await coord.create_task("t", PLAN[:1], budget=timedelta(seconds=1))
    await coord.checkpoint("t", "start")
    await coord.next_step("t")
    deployment.clock.advance(5)
    step = await coord.complete_step("t", "find", "late answer")
    assert (step.status, step.result) == (StepStatus.TIMED_OUT, "late answer")
    task = await coord.rollback("t", "start", budget=timedelta(seconds=5))
    assert task.status is TaskStatus.ACTIVE
    assert await coord.next_step("t") is not None


async def test_a_step_held_by_another_worker_is_taken_over_only_on_request(
    deployment: Pairing,
) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    first = await StateCoordinator.load(await open_session(memory, sid), worker="first")
    await first.create_task("t", PLAN)
    await first.next_step("t")
    second = await StateCoordinator.load(await open_session(memory, sid), worker="second")
    with pytest.raises(ConflictError, match="in progress in worker 'first'"):
        await second.next_step("t")
    step = await second.next_step("t", takeover=True)
    assert step is not None
    assert (step.step_id, step.worker, step.attempts) == ("find", "second", 2)
    # Completing is idempotent, whoever repeats it.
    await second.complete_step("t", "find", "x")
    before = second.versions["task"]
    assert (await first.complete_step("t", "find", "x")).status is StepStatus.COMPLETED
    assert (await second.complete_step("t", "find", "x")).status is StepStatus.COMPLETED
    assert second.versions["task"] == before


async def test_the_environment_starts_from_the_session_and_tracks_events(
    deployment: Pairing,
) -> None:
    memory = service_of(deployment)
    coord = await StateCoordinator.load(
        await open_session(memory, fresh_id("s"), user_tier="vip", locale="ja-JP")
    )
    assert (coord.environment.tier, coord.environment.locale) == ("vip", "ja-JP")
    assert coord.local_time().zone == "Asia/Tokyo"
    await coord.refresh_environment("user-service", event_id="e2", tier="premium")
    await coord.refresh_environment(
        "user-service",
        event_id="e1",
        occurred_at=deployment.clock.now() - timedelta(minutes=1),
        tier="standard",
    )
    assert coord.environment.tier == "premium"


async def test_the_agent_context_cites_the_blob_versions(deployment: Pairing) -> None:
    coord = await StateCoordinator.load(await open_session(service_of(deployment), fresh_id("s")))
    await busy(coord)
    context = coord.to_agent_context(budget_tokens=400, tokens=TiktokenCounter())
    assert {s.layer: s.version for s in context.sources} == coord.versions
    assert "Ask the user for order_id" in context.text
    assert "running track (shipping.track)" in context.text


async def test_unreadable_and_newer_blobs(deployment: Pairing) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    session = await open_session(memory, sid)
    # A newer release wrote a field this one does not know, and a newer schema.
    await session.put_state(
        "conversation", {"schema_version": 2, "phase": "greeting", "mood": "happy"}
    )
    await session.put_state(
        "task",
        {
            "tasks": [
                {
                    "task_id": "t",
                    "steps": [{"step_id": "a", "status": "paused"}],
                    "created_at": "2030-01-01T00:00:00Z",
                }
            ]
        },
    )
    with pytest.raises(CorruptDataError, match=r"state 'task' .* cannot be read"):
        await StateCoordinator.load(session)
    await session.put_state("task", {"some_future_field": [1, 2]})
    coord = await StateCoordinator.load(session)
    assert coord.conversation.model_extra == {"mood": "happy"}
    with pytest.raises(ValidationError, match="written with schema 2"):
        await coord.set_phase("farewell")
    # Unknown fields survive a rewrite by this release.
    await coord.create_task("t", PLAN)
    blob = await session.get_state("task")
    assert blob is not None
    assert blob.data["some_future_field"] == [1, 2]


async def test_results_and_params_are_compared_as_they_are_stored(deployment: Pairing) -> None:
    memory = service_of(deployment)
    sid = fresh_id("s")
    plan = [Step(step_id="find", params={"ids": (1, 2)})]
    coord = await StateCoordinator.load(await open_session(memory, sid))
    await coord.create_task("t", plan)
    await coord.next_step("t")
    await coord.complete_step("t", "find", ("a", "b"))
    # A restarted worker repeats both calls with the same Python values: nothing changes.
    again = await StateCoordinator.load(await open_session(memory, sid))
    before = again.versions
    await again.create_task("t", plan)
    step = await again.complete_step("t", "find", ("a", "b"))
    assert step.result == ["a", "b"]
    assert again.versions == before
    with pytest.raises(ValidationError, match="must be JSON"):
        await again.complete_step("t", "find", {"when": object()})
