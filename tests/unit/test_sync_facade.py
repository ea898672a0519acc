"""The sync facade drives the async core from plain blocking code, all of it.

The walking test discovers, by introspection, every public coroutine method reachable from
a :class:`SyncMemory` (through public attributes, and through what calls return) and calls
each one through the facade, with valid arguments, on the in-memory backends: a coroutine
method the facade leaves async, or an object it forgets to wrap, fails it. A new coroutine
method fails it too until :data:`ARGS` says how to call it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import pkgutil
import re
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tiermem
from tiermem.background import Batch
from tiermem.errors import TierMemError
from tiermem.longterm.detect import DetectedMemory
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.knowledge import KnowledgeDocument
from tiermem.models import (
    ActiveEntity,
    MemoryRecord,
    Provenance,
    SessionMetadata,
    SessionRef,
    UserTier,
)
from tiermem.session import TurnInput
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.sync import SyncMemory

EMBEDDED = TierMemSettings(hot_backend="memory", durable_backend="memory")


def test_sync_facade_round_trip(tmp_path: Path) -> None:
    settings = TierMemSettings(
        hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "t.db"
    )
    with SyncMemory.from_settings(settings) as memory:
        session = memory.session("s-sync", user_id="u-1")
        turn = session.add_turn("user", "I prefer seinen")
        assert turn.index == 0
        assert [t.text for t in session.history()] == ["I prefer seinen"]
        assert session.id == "s-sync"
        assert [r.session_id for r in memory.list_sessions("u-1")] == ["s-sync"]
    # The data outlives the facade: it is in the SQLite file.
    with SyncMemory.from_settings(settings) as memory:
        again = memory.session("s-sync", user_id="u-1")
        assert [t.text for t in again.get_turns()] == ["I prefer seinen"]


def test_sync_facade_reaches_long_term_memory_and_knowledge() -> None:
    with SyncMemory.from_settings(EMBEDDED) as memory:
        record = memory.longterm.remember("u-1", "collects first editions", memory_type="fact")
        assert memory.longterm.get("u-1", record.memory_id) == record
        document = memory.knowledge.add_document("u-1", "notes.md", b"# Seinen", format="md")
        assert isinstance(document, KnowledgeDocument)
        assert memory.access.flush() is not None


def test_attributes_are_set_on_the_service_and_closed_facades_refuse_work() -> None:
    memory = SyncMemory.from_settings(EMBEDDED)
    memory.auto_detect = False
    assert memory.__wrapped__.auto_detect is False
    memory.close()
    memory.close()  # closing twice is harmless
    with pytest.raises(TierMemError, match="closed"):
        memory.list_sessions("u-1")


# ---------------------------------------------------------------- the walk


@dataclass(frozen=True)
class World:
    """A fresh embedded memory with one session of two turns, a fact and a document."""

    memory: Any
    session: Any
    fact: MemoryRecord
    document: KnowledgeDocument
    metadata: SessionMetadata
    later: datetime

    @property
    def new_turn(self) -> Any:
        return self.memory.prepare_turn(TurnInput(role="user", content="and vol 43?"))


@contextmanager
def world() -> Iterator[World]:
    memory = SyncMemory.from_settings(EMBEDDED)
    try:
        session = memory.session("s-1", user_id="u-1")
        session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
        session.add_turn("assistant", "Yes, vol 42 is in stock.")
        session.put_state("cart", {"items": 1})
        fact = memory.longterm.remember("u-1", "collects first editions")
        document = memory.knowledge.add_document("u-1", "notes.md", b"# Seinen picks", format="md")
        memory.drain()
        later = memory.clock.now() + timedelta(hours=1)
        yield World(memory, session, fact, document, session.metadata(), later)
    finally:
        memory.close()


Call = tuple[tuple[Any, ...], dict[str, Any]]

from tiermem.tools import BreakerPolicy  # noqa: E402


def a(*args: Any, **kwargs: Any) -> Call:
    return args, kwargs


async def no_op_items(items: list[int]) -> None:
    return None


NO_OP_BATCH = Batch(no_op_items)


async def no_op_job() -> None:
    return None


async def handoff(view: Any) -> None:
    return None


async def echo(arguments: Any, emit: Any) -> Any:
    return {"echo": dict(arguments)}


def echo_permit() -> Any:
    from tiermem.tools import Admission, BreakerState, Permit

    return Permit(tool="echo", admission=Admission.CALL, state=BreakerState(), version=0)


def echo_registry() -> Any:
    from tiermem.tools import ToolRegistry, ToolSpec
    from tiermem.tools.invoker import FunctionInvoker

    registry = ToolRegistry()
    registry.register(ToolSpec("echo", "Echo the arguments"), FunctionInvoker({"echo": echo}))
    return registry


# How to call each method: "Class.method" -> World -> (args, kwargs).
ARGS: dict[str, Callable[[World], Call]] = {
    # MemoryService
    "MemoryService.aclose": lambda w: a(),
    "MemoryService.drain": lambda w: a(),
    "MemoryService.list_sessions": lambda w: a("u-1"),
    "MemoryService.prepare_turns": lambda w: a([TurnInput(role="user", content="hi")]),
    "MemoryService.analyse_turns": lambda w: a([TurnInput(role="user", content="hi")]),
    "MemoryService.purge_user": lambda w: a("u-1"),
    "MemoryService.session": lambda w: a("s-1", user_id="u-1"),
    "MemoryService.sweeper": lambda w: a(handoff, owner="walker"),
    "MemoryService.tools": lambda w: a(echo_registry()),
    "ToolDispatcher.call": lambda w: a("echo", {"x": 1}),
    "ToolDispatcher.status": lambda w: a("echo"),
    "ToolDispatcher.statuses": lambda w: a(),
    "ToolDispatcher.agent_notes": lambda w: a(),
    "SharedBreakers.state": lambda w: a("echo"),
    "SharedBreakers.check": lambda w: a("echo", BreakerPolicy()),
    "SharedBreakers.record_success": lambda w: a(echo_permit(), BreakerPolicy()),
    "SharedBreakers.record_failure": lambda w: a(echo_permit(), BreakerPolicy(), error="x"),
    "SharedBreakers.reset": lambda w: a("echo"),
    # Session
    "Session.active_entities": lambda w: a(),
    "Session.add_turn": lambda w: a("user", "I love horror"),
    "Session.add_turns": lambda w: a([TurnInput(role="user", content="hi")]),
    "Session.clear": lambda w: a(),
    "Session.context": lambda w: a("Berserk stock", budget=2_000, system="You sell manga."),
    "Session.close": lambda w: a(),
    "Session.get_state": lambda w: a("cart"),
    "Session.get_turn": lambda w: a(0),
    "Session.get_turns": lambda w: a(),
    "Session.history": lambda w: a(),
    "Session.metadata": lambda w: a(),
    "Session.put_state": lambda w: a("cart", {"items": 2}),
    "Session.redact_turn": lambda w: a(0),
    "Session.remember_from_turns": lambda w: a(),
    "Session.set_entities": lambda w: a({"genre": "shonen"}),
    "Session.stats": lambda w: a(),
    "Session.update_metadata": lambda w: a(locale="ja-JP"),
    "Session.view": lambda w: a(),
    # ExpirySweeper
    "ExpirySweeper.sweep_once": lambda w: a(),
    # AccessTracker
    "AccessTracker.aclose": lambda w: a(),
    "AccessTracker.flush": lambda w: a(),
    # BackgroundWork
    "BackgroundWork.aclose": lambda w: a(),
    "BackgroundWork.drain": lambda w: a(),
    "BackgroundWork.submit": lambda w: a("u-1", "s-1", no_op_job),
    "BackgroundWork.submit_batched": lambda w: a("u-1", "s-1", NO_OP_BATCH, 1),
    "BackgroundWork.wait_for": lambda w: a(user_id="u-1"),
    # KnowledgeBase
    "KnowledgeBase.add_document": lambda w: a("u-1", "more.txt", b"more", format="txt"),
    "KnowledgeBase.delete_document": lambda w: a("u-1", w.document.document_id),
    "KnowledgeBase.get_chunks": lambda w: a("u-1", w.document.document_id),
    "KnowledgeBase.get_document": lambda w: a("u-1", w.document.document_id),
    "KnowledgeBase.indexed_docs": lambda w: a("u-1"),
    "KnowledgeBase.list_documents": lambda w: a("u-1"),
    "KnowledgeBase.resolve_chunks": lambda w: a("u-1", [f"{w.document.document_id}#0"]),
    # LongTermMemory
    "LongTermMemory.aclose": lambda w: a(),
    "LongTermMemory.build_user_context": lambda w: a("u-1", "seinen", budget_tokens=500),
    "LongTermMemory.changes": lambda w: a("u-1"),
    "LongTermMemory.forget": lambda w: a("u-1", w.fact.memory_id),
    "LongTermMemory.forget_session": lambda w: a("u-1", "s-1"),
    "LongTermMemory.get": lambda w: a("u-1", w.fact.memory_id),
    "LongTermMemory.get_preference": lambda w: a("u-1", "favorite_genre"),
    "LongTermMemory.index_docs": lambda w: a([]),
    "LongTermMemory.index_turns": lambda w: a("u-1", "s-1", w.session.get_turns(), expires_at=None),
    "LongTermMemory.list": lambda w: a("u-1"),
    "LongTermMemory.preference_history": lambda w: a("u-1", "favorite_genre"),
    "LongTermMemory.preferences": lambda w: a("u-1"),
    "LongTermMemory.purge_user": lambda w: a("u-1"),
    "LongTermMemory.recall": lambda w: a("u-1", "first editions"),
    "LongTermMemory.remember": lambda w: a("u-1", "drinks tea"),
    "LongTermMemory.retire_preference": lambda w: a("u-1", "favorite_genre", reason="forget it"),
    "LongTermMemory.remember_detected": lambda w: a(
        "u-1", [DetectedMemory("fact", "drinks tea", "remember_request")], provenance=Provenance()
    ),
    "LongTermMemory.stats": lambda w: a("u-1"),
    "LongTermMemory.supersede": lambda w: a("u-1", w.fact.memory_id, "collects signed firsts"),
    "LongTermMemory.unindex_turns": lambda w: a("u-1", "s-1", [0]),
    "LongTermMemory.upsert_preference": lambda w: a("u-1", "favorite_genre", "shonen"),
    # Recaller
    "Recaller.aclose": lambda w: a(),
    "Recaller.recall": lambda w: a("u-1", "seinen"),
    "Recaller.embed_documents": lambda w: a([]),
    "Recaller.neighbour_turns": lambda w: a([]),
    # InProcessIndex
    "InProcessIndex.aclose": lambda w: a(),
    "InProcessIndex.collect_expired": lambda w: a(),
    "InProcessIndex.purge_user": lambda w: a("u-1"),
    "InProcessIndex.remove": lambda w: a("u-1", ["d-1"]),
    "InProcessIndex.search": lambda w: a("u-1", "seinen", kinds=("memory", "turn"), limit=5),
    "InProcessIndex.upsert": lambda w: a(
        [IndexedDoc(user_id="u-1", doc_id="d-1", kind="memory", text="tea", created_at=w.later)]
    ),
    "InProcessIndex.vector_search": lambda w: a("u-1", [0.6, 0.8], kinds=("memory",), limit=5),
    # TieredSessionStore
    "TieredSessionStore.append": lambda w: a(w.metadata, [w.new_turn], turn_count_hint=2),
    "TieredSessionStore.clear": lambda w: a("s-1"),
    "TieredSessionStore.close": lambda w: a("s-1"),
    "TieredSessionStore.create": lambda w: a(
        w.metadata.model_copy(update={"session_id": "s-2", "turn_count": 0})
    ),
    "TieredSessionStore.durable_view": lambda w: a("s-1"),
    "TieredSessionStore.flush": lambda w: a("s-1"),
    "TieredSessionStore.forget_user_sessions": lambda w: a("u-1"),
    "TieredSessionStore.get_turn": lambda w: a("s-1", 0),
    "TieredSessionStore.get_turns": lambda w: a("s-1"),
    "TieredSessionStore.holds_turn": lambda w: a("s-1", 0),
    "TieredSessionStore.list_sessions": lambda w: a("u-1"),
    "TieredSessionStore.put_state": lambda w: a(
        w.metadata, "cart", {"items": 2}, expected_version=None
    ),
    "TieredSessionStore.redact": lambda w: a("s-1", 0),
    "TieredSessionStore.update_entities": lambda w: a(
        w.metadata, {"genre": ActiveEntity(kind="genre", value="shonen", updated_at=w.later)}
    ),
    "TieredSessionStore.update_metadata": lambda w: a("s-1", lambda m: m),
    "TieredSessionStore.view": lambda w: a("s-1"),
    # MemoryDurableStore
    "MemoryDurableStore.aclose": lambda w: a(),
    "MemoryDurableStore.append_turns": lambda w: a("s-1", [w.new_turn]),
    "MemoryDurableStore.delete_memory": lambda w: a("u-1", w.fact.memory_id),
    "MemoryDurableStore.delete_session": lambda w: a("s-1"),
    "MemoryDurableStore.get_memories": lambda w: a("u-1", [w.fact.memory_id]),
    "MemoryDurableStore.get_memory": lambda w: a("u-1", w.fact.memory_id),
    "MemoryDurableStore.get_record": lambda w: a("s-1", "metadata"),
    "MemoryDurableStore.get_session": lambda w: a("s-1"),
    "MemoryDurableStore.get_turn": lambda w: a("s-1", 0),
    "MemoryDurableStore.get_turns": lambda w: a("s-1"),
    "MemoryDurableStore.list_sessions": lambda w: a("u-1"),
    "MemoryDurableStore.next_index": lambda w: a("s-1"),
    "MemoryDurableStore.purge_user": lambda w: a("u-1"),
    "MemoryDurableStore.put_memory": lambda w: a(w.fact),
    "MemoryDurableStore.put_record": lambda w: a("s-1", "notes", {"a": 1}),
    "MemoryDurableStore.query_memories": lambda w: a("u-1"),
    "MemoryDurableStore.redact_turn": lambda w: a("s-1", 0),
    "MemoryDurableStore.register_session": lambda w: a(
        SessionRef(session_id="s-2", user_id="u-1", created_at=w.later)
    ),
    "MemoryDurableStore.tail_turns": lambda w: a("s-1", 1),
    # MemoryHotStore
    "MemoryHotStore.aclose": lambda w: a(),
    "MemoryHotStore.append_turns": lambda w: a("s-1", [w.new_turn], window=20, expires_at=w.later),
    "MemoryHotStore.append_built": lambda w: a(
        MemoryDurableStore(),
        "s-8",
        [w.new_turn],
        window=20,
        hot_expires_at=w.later,
        durable_expires_at=None,
    ),
    "MemoryHotStore.append_through": lambda w: a(
        MemoryDurableStore(),
        "s-9",
        [w.new_turn],
        window=20,
        hot_expires_at=w.later,
        durable_expires_at=None,
    ),
    "MemoryHotStore.claim_expired": lambda w: a(owner="walker", lease=timedelta(seconds=30)),
    "MemoryHotStore.copy_state": lambda w: a(
        "s-1", w.session.get_state("cart"), expires_at=w.later
    ),
    "MemoryHotStore.delete": lambda w: a("s-1"),
    "MemoryHotStore.delete_shared": lambda w: a("breaker"),
    "MemoryHotStore.get_shared": lambda w: a("breaker"),
    "MemoryHotStore.get_state": lambda w: a("s-1", "cart"),
    "MemoryHotStore.load": lambda w: a("s-1"),
    "MemoryHotStore.put_metadata": lambda w: a("s-1", w.metadata, expires_at=w.later),
    "MemoryHotStore.put_shared": lambda w: a("breaker", {"state": "open"}, expires_at=None),
    "MemoryHotStore.put_state": lambda w: a("s-1", "cart", {"items": 3}, expires_at=w.later),
    "MemoryHotStore.release_expired": lambda w: a("s-1", owner="walker"),
    "MemoryHotStore.restore": lambda w: restore_args(w),
    "MemoryHotStore.touch": lambda w: a("s-1", expires_at=w.later),
    "MemoryHotStore.update_entities": lambda w: a(
        "s-1",
        {"genre": ActiveEntity(kind="genre", value="shonen", updated_at=w.later)},
        expires_at=w.later,
    ),
    # summaries (docs/summaries.md)
    "MemoryService.roll_up": lambda w: a("u-1"),
    "Session.summaries": lambda w: a(),
    "Session.structured": lambda w: a(),
    "Session.watermarks": lambda w: a(),
    "SummaryJobs.after_append": lambda w: a("u-1", "s-1", w.session.get_turns(), 2),
    "SummaryJobs.read": lambda w: a("s-1"),
    "SummaryJobs.redacted": lambda w: a("s-1", 0),
    "SessionHandoff.redacted": lambda w: a(
        "u-1", "s-1", 0, w.memory.__wrapped__.tiers.durable_view
    ),
    "SummaryJobs.run": lambda w: a("s-1"),
    "SummaryJobs.current_for_recall": lambda w: a("s-1", True),
    "SummaryJobs.unindex": lambda w: a("u-1", "s-1"),
    "SummaryRecall.replace": lambda w: a(
        "u-1", "s-1", claimed=[], lines=[], turns={}, at=w.later, expires_at=None
    ),
    "SummaryRecall.remove_keys": lambda w: a("u-1", "s-1", ["lx"]),
    "SummaryJobs.refresh_lines": lambda w: a("s-1"),
    "SummaryRecall.resolve": lambda w: a("u-1", ["s-1#summary-x"]),
    "ContextCache.sections": lambda w: a(w.memory.__wrapped__.summaries, "s-1", [None, None, None]),
    "TieredSessionStore.view_with_records": lambda w: a("s-1", ["summary"]),
    "SummaryJobs.wait_through": lambda w: a("s-1", 1),
    "ProgressiveRollup.history": lambda w: a("u-1"),
    "ProgressiveRollup.roll_up": lambda w: a("u-1"),
    "ExtractiveSummarizer.summarize": lambda w: a(w.session.get_turns(), target_tokens=100),
    "RuleStructuredExtractor.extract": lambda w: a(w.session.get_turns()),
}


def restore_args(w: World) -> Call:
    snapshot = w.memory.tiers.hot.load("s-1")
    return a(
        "s-1",
        turns=snapshot.turns,
        next_index=snapshot.next_index,
        metadata=snapshot.metadata,
        entities=snapshot.entities,
        state=snapshot.state,
        window=20,
        expires_at=w.later,
    )


def is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


def public_methods(cls: type) -> dict[str, Any]:
    found = {}
    for name in dir(cls):
        if not name.startswith("_"):
            attr = inspect.getattr_static(cls, name)
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            if inspect.isfunction(attr):
                found[name] = attr
    return found


def has_async_methods(value: Any) -> bool:
    if isinstance(value, type) or inspect.isroutine(value) or inspect.ismodule(value):
        return False
    return any(is_async(m) for m in public_methods(type(value)).values())


def async_classes() -> dict[str, type]:
    """Every tiermem class with public coroutine methods, by name: what a sync method's
    return annotation may name."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tiermem.__path__, "tiermem."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for value in vars(module).values():
            if isinstance(value, type) and any(is_async(m) for m in public_methods(value).values()):
                found[value.__name__] = value
    return found


Step = tuple[str, str]  # ("attr", name) or ("call", "Class.method")


def resolve(w: World, path: tuple[Step, ...]) -> Any:
    node = w.memory
    for kind, name in path:
        if kind == "attr":
            node = getattr(node, name)
        else:
            args, kwargs = ARGS[name](w)
            node = getattr(node, name.split(".", 1)[1])(*args, **kwargs)
    return node


def settle(result: Any) -> Any:
    if isinstance(result, concurrent.futures.Future):
        return result.result(timeout=30)
    return result


def test_every_reachable_coroutine_method_blocks_through_the_facade() -> None:
    producers = async_classes()
    queue: deque[tuple[Step, ...]] = deque([()])
    walked: dict[type, tuple[Step, ...]] = {}
    called: list[str] = []
    missing: list[str] = []
    while queue:
        path = queue.popleft()
        with world() as w:
            node = resolve(w, path)
            cls = type(node.__wrapped__)
            if cls in walked:
                continue
            walked[cls] = path
            # Public attributes holding async objects are wrapped, and walked.
            for name in dir(node.__wrapped__):
                if name.startswith("_") or name in public_methods(cls):
                    continue
                raw = getattr(node.__wrapped__, name)
                if has_async_methods(raw):
                    assert hasattr(getattr(node, name), "__wrapped__"), f"{cls.__name__}.{name}"
                    queue.append((*path, ("attr", name)))
        for name, method in sorted(public_methods(cls).items()):
            key = f"{cls.__name__}.{name}"
            returns = str(inspect.signature(method).return_annotation)
            produces = any(word in producers for word in re.findall(r"\w+", returns))
            constructor = isinstance(inspect.getattr_static(cls, name), classmethod)
            if not is_async(method) and (constructor or not produces):
                continue
            if key not in ARGS:
                missing.append(key)
                continue
            with world() as w:
                facade_method = getattr(resolve(w, path), name)
                assert not is_async(facade_method), key
                args, kwargs = ARGS[key](w)
                result = facade_method(*args, **kwargs)
                if inspect.isgenerator(result):
                    result = list(result)
                result = settle(result)
                assert not inspect.isawaitable(result), f"{key} returned {result!r}"
                if has_async_methods(result):
                    raise AssertionError(f"{key} returned an unwrapped {type(result).__name__}")
                if hasattr(result, "__wrapped__") and not callable(result):
                    queue.append((*path, ("call", key)))
            called.append(key)
    assert not missing, f"add arguments to ARGS for: {', '.join(missing)}"
    assert {"MemoryService", "Session", "KnowledgeBase", "AccessTracker"} <= {
        c.__name__ for c in walked
    }
    assert "KnowledgeBase.add_document" in called
    assert "AccessTracker.flush" in called
    stale = set(ARGS) - set(called)
    assert not stale, f"ARGS names methods that no longer exist: {sorted(stale)}"


# ---------------------------------------------------------------- odd shapes of results


class Gadget:
    """An async object with an async generator, a task handle and a sync method."""

    def __init__(self) -> None:
        self.child: Gadget | None = None

    async def numbers(self, n: int) -> Any:  # an async generator
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    async def start(self) -> asyncio.Task[int]:
        async def work() -> int:
            await asyncio.sleep(0)
            return 42

        return asyncio.get_running_loop().create_task(work())

    def running_loop(self) -> bool:
        return asyncio.get_running_loop() is not None


class FakeService:
    def __init__(self) -> None:
        self.gadget = Gadget()

    async def aclose(self) -> None:
        return None


def test_generators_tasks_and_sync_methods_work_through_the_facade() -> None:
    memory = SyncMemory(FakeService)  # type: ignore[arg-type]
    try:
        gadget = memory.gadget
        assert list(gadget.numbers(3)) == [0, 1, 2]
        assert gadget.start().result(timeout=5) == 42
        assert gadget.running_loop()  # sync methods run on the service's loop
        assert gadget.child is None
    finally:
        memory.close()


def test_user_tiers_pass_through() -> None:
    with SyncMemory.from_settings(EMBEDDED) as memory:
        session = memory.session("s-vip", user_id="u-1", user_tier=UserTier.VIP)
        assert session.metadata().user_tier == UserTier.VIP
