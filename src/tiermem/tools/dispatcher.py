"""Calling tools: breaker check, timeout, tracking, fallbacks, in one place.

:meth:`ToolDispatcher.call` follows seed 000's invocation lifecycle (§4.3) with its gaps
closed:

1. The breaker of the tool asked for is checked (one shared read). Open: the call is
   rejected without touching the tool, and the next fallback in the tool's list is tried
   the same way. Due for recovery: this caller becomes the one probe across all workers.
2. The tool runs under its timeout (``asyncio.timeout``); partial chunks it emits are kept,
   also when it then fails or times out. An invoker that connects first
   (:class:`~tiermem.tools.invoker.PreparingInvoker`, e.g. an MCP server to restart) does so
   before that timeout starts, within its own limit; a failed connection is a failed call.
3. Success is returned as a :class:`ToolResult` (with the sentences describing any tool
   that was skipped on the way). A failure is counted against the tool's breaker. If the
   breaker is still closed, the failure is raised as :class:`~tiermem.tools.errors.ToolCallError`
   (or :class:`~tiermem.tools.errors.ToolTimeoutError`): the tool is trusted, and the agent
   decides whether to retry. If that failure opened the breaker (or was the failed probe),
   the next fallback is tried, as in step 1.
4. When no tool in the chain answered, :class:`~tiermem.tools.errors.ToolUnavailableError`
   says why, tool by tool. An error never comes back as an empty result.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping

from tiermem.clock import Clock, IdFactory, SystemClock, UlidFactory
from tiermem.errors import ValidationError
from tiermem.models import FrozenModel, JsonValue, UtcDatetime
from tiermem.store.keys import validate_id
from tiermem.tools.breaker import BreakerPolicy, BreakerState, BreakerStatus, ToolHealth
from tiermem.tools.breaker_store import Permit, SharedBreakers
from tiermem.tools.degradation import Degradation, describe_degradation
from tiermem.tools.errors import ToolCallError, ToolTimeoutError, ToolUnavailableError
from tiermem.tools.invocation import (
    DEFAULT_RECENT_LIMIT,
    InFlight,
    InvocationOutcome,
    InvocationTracker,
    ToolInvocation,
    ToolStats,
)
from tiermem.tools.invoker import PreparingInvoker, ToolOutput
from tiermem.tools.latency import DEFAULT_LATENCY_WINDOW
from tiermem.tools.registry import RegisteredTool, ToolRegistry

__all__ = ["DEFAULT_MAX_PARTIAL_CHUNKS", "ToolDispatcher", "ToolResult", "ToolStatus"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_PARTIAL_CHUNKS = 256
"""Partial chunks kept per call; more are counted in ``partial_dropped``."""


class ToolResult(FrozenModel):
    """A tool call that produced an answer, maybe from a fallback."""

    requested_tool: str
    tool: str
    """The tool that answered: ``requested_tool`` or one of its fallbacks."""
    output: ToolOutput
    invocation: ToolInvocation
    attempts: tuple[ToolInvocation, ...]
    """Every call made for this request, the answering one last."""
    degradations: tuple[Degradation, ...] = ()
    """Tools skipped or given up on before ``tool`` answered."""

    @property
    def degraded(self) -> bool:
        return self.tool != self.requested_tool

    @property
    def text(self) -> str:
        return self.output.text

    @property
    def agent_note(self) -> str | None:
        """What the agent should know about how this answer was obtained, or None."""
        return " ".join(d.message for d in self.degradations) or None


class ToolStatus(FrozenModel):
    """A tool's health as every worker sees it, plus this process's statistics."""

    name: str
    description: str
    health: ToolHealth
    breaker: BreakerStatus
    recent_failures: int
    since: UtcDatetime | None = None
    retry_at: UtcDatetime | None = None
    last_error: str | None = None
    fallbacks: tuple[str, ...] = ()
    stats: ToolStats
    message: str | None = None
    """A sentence for the agent when the tool is not healthy."""


def _arguments(arguments: object, tool: str) -> dict[str, JsonValue]:
    """The caller's arguments as a JSON object, checked once here: a value a tool cannot be
    sent would fail inside the invoker and count against the tool's breaker."""
    if arguments is None:
        return {}
    if not isinstance(arguments, Mapping):
        raise ValidationError(
            f"arguments of tool {tool!r} must be a mapping of name to value, got "
            f"{type(arguments).__name__}"
        )
    args = dict(arguments)
    if not all(isinstance(name, str) for name in args):
        raise ValidationError(f"argument names are strings; tool {tool!r} got {list(args)!r}")
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"arguments of tool {tool!r} must be JSON (dicts with string keys, lists, "
            f"strings, finite numbers, booleans, None): {exc}"
        ) from None
    return args


class ToolDispatcher:
    """Calls registered tools through their shared breakers, with tracking and fallbacks.

    ``monotonic`` measures durations (seconds, any origin); ``clock`` stamps records and
    judges breaker times in messages. One dispatcher per process; many processes share
    breakers through the store behind ``breakers``.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        breakers: SharedBreakers,
        *,
        clock: Clock | None = None,
        ids: IdFactory | None = None,
        monotonic: Callable[[], float] = time.perf_counter,
        latency_window: int = DEFAULT_LATENCY_WINDOW,
        recent_limit: int = DEFAULT_RECENT_LIMIT,
        max_partial_chunks: int = DEFAULT_MAX_PARTIAL_CHUNKS,
    ) -> None:
        for what, value in (
            ("latency_window", latency_window),
            ("recent_limit", recent_limit),
            ("max_partial_chunks", max_partial_chunks),
        ):
            if type(value) is not int or value < 1:
                raise ValidationError(f"{what} must be an integer >= 1, got {value!r}")
        self.registry = registry
        self.breakers = breakers
        self._clock = clock or SystemClock()
        self._ids = ids or UlidFactory()
        self._monotonic = monotonic
        self._max_partial = max_partial_chunks
        self.tracker = InvocationTracker(latency_window=latency_window, recent_limit=recent_limit)

    # -- calls --------------------------------------------------------------------------

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue] | None = None,
        *,
        request_id: str | None = None,
    ) -> ToolResult:
        """Call ``tool`` (or, when its breaker is open, its fallbacks in order).

        Raises:
            NotFoundError: ``tool`` is not registered.
            ValidationError: a ``request_id`` that cannot be an id, or ``arguments`` that
                are not a JSON object (refused before the tool or its breaker sees them).
            ToolCallError: the tool (or the fallback that was tried) failed and its breaker
                is still closed; ``ToolTimeoutError`` when it did not answer in time.
            ToolUnavailableError: every tool of the chain is unavailable or just failed.
            BackendError: the store holding the breakers cannot be reached.
            ConflictError: a breaker kept changing under every compare-and-set attempt.
        """
        entry = self.registry.get(tool)
        if request_id is None:
            request_id = self._ids.new_id()
        else:
            validate_id(request_id, what="request_id")
        args = _arguments(arguments, tool)
        chain = (entry.spec.name, *entry.spec.fallbacks)
        attempts: list[ToolInvocation] = []
        skipped: list[tuple[str, BreakerState, BreakerPolicy]] = []
        cause: BaseException | None = None
        for position, name in enumerate(chain):
            current = self.registry.get(name)
            policy = current.spec.policy
            permit = await self.breakers.check(name, policy)
            if not permit.admitted:
                self.tracker.rejected(name)
                skipped.append((name, permit.state, policy))
                continue
            record, cause = await self._invoke(current, args, request_id, position, tool, permit)
            attempts.append(record)
            if record.outcome is InvocationOutcome.SUCCESS and record.output is not None:
                await self.breakers.record_success(permit, policy)
                degradations = self._describe(skipped, fallback=name)
                if degradations:
                    logger.info("tool %s answered for %s (request %s)", name, tool, request_id)
                return ToolResult(
                    requested_tool=tool,
                    tool=name,
                    output=record.output,
                    invocation=record,
                    attempts=tuple(attempts),
                    degradations=degradations,
                )
            transition = await self.breakers.record_failure(
                permit, policy, error=record.error or record.outcome.value
            )
            if transition.after.status is BreakerStatus.CLOSED:
                raise self._call_error(entry, record, attempts, skipped) from cause
            skipped.append((name, transition.after, policy))
        degradations = self._describe(skipped, fallback=None)
        raise ToolUnavailableError(
            " ".join(d.message for d in degradations),
            tool=tool,
            attempts=tuple(attempts),
            degradations=degradations,
            fallbacks=entry.spec.fallbacks,
        ) from cause

    async def _invoke(
        self,
        entry: RegisteredTool,
        arguments: dict[str, JsonValue],
        request_id: str,
        position: int,
        requested: str,
        permit: Permit,
    ) -> tuple[ToolInvocation, BaseException | None]:
        spec = entry.spec
        chunks: list[JsonValue] = []
        dropped = 0

        def emit(chunk: JsonValue) -> None:
            nonlocal dropped
            if len(chunks) < self._max_partial:
                chunks.append(chunk)
            else:
                dropped += 1

        invoker = entry.invoker
        started_at = self._clock.now()
        call = InFlight(
            request_id, position, spec.name, permit.is_probe, started_at, started_at + spec.timeout
        )
        self.tracker.started(call)
        start = self._monotonic()
        output: ToolOutput | None = None
        error: str | None = None
        cause: BaseException | None = None
        timer: asyncio.Timeout | None = None
        try:
            if isinstance(invoker, PreparingInvoker):
                # (Re)connecting is bounded by the invoker (e.g. an MCP server's
                # connect_timeout), not by the tool's timeout: a slow server start is not
                # the tool being slow. Its failure is still the call's failure (below).
                await invoker.prepare(spec.name)
                # The answer's deadline starts now.
                call = InFlight(
                    request_id,
                    position,
                    spec.name,
                    permit.is_probe,
                    started_at,
                    self._clock.now() + spec.timeout,
                )
                self.tracker.started(call)
            # asyncio.timeout fixes its deadline when created: only after prepare.
            timer = asyncio.timeout(spec.timeout.total_seconds())
            async with timer:
                output = await invoker.invoke(
                    spec.name, dict(arguments), request_id=request_id, emit=emit
                )
        except TimeoutError as exc:
            if timer is not None and timer.expired():
                outcome, cause = InvocationOutcome.TIMEOUT, exc
                error = f"timed out after {spec.timeout.total_seconds():g} s"
            else:  # raised by the invoker itself (e.g. its connect step): not the timeout
                outcome, cause = InvocationOutcome.ERROR, exc
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except Exception as exc:  # noqa: BLE001 -- any failure of an invoker is the tool's failure: counted by its breaker and raised as ToolCallError / ToolUnavailableError
            outcome, cause = InvocationOutcome.ERROR, exc
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except BaseException:
            # Cancelled by the caller: nothing is known about the tool. A probe's lease
            # runs out and another worker probes.
            self.tracker.abandoned(call)
            raise
        else:
            if not isinstance(output, ToolOutput):
                outcome = InvocationOutcome.ERROR
                error = f"the invoker returned {type(output).__name__}, not a ToolOutput"
                output = None
            elif output.is_error:
                outcome = InvocationOutcome.ERROR
                error = output.text or "the tool reported an error without a message"
            else:
                outcome = InvocationOutcome.SUCCESS
        record = ToolInvocation(
            request_id=request_id,
            attempt=position,
            tool=spec.name,
            requested_tool=requested,
            probe=permit.is_probe,
            arguments=arguments,
            started_at=started_at,
            finished_at=self._clock.now(),
            duration_ms=round((self._monotonic() - start) * 1000, 3),
            outcome=outcome,
            output=output,
            partial=tuple(chunks),
            partial_dropped=dropped,
            error=error,
        )
        self.tracker.finished(record)
        return record, cause

    def _describe(
        self, skipped: list[tuple[str, BreakerState, BreakerPolicy]], *, fallback: str | None
    ) -> tuple[Degradation, ...]:
        now = self._clock.now()
        return tuple(
            describe_degradation(name, state, policy, now, fallback=fallback)
            for name, state, policy in skipped
        )

    def _call_error(
        self,
        entry: RegisteredTool,
        record: ToolInvocation,
        attempts: list[ToolInvocation],
        skipped: list[tuple[str, BreakerState, BreakerPolicy]],
    ) -> ToolCallError:
        spec = entry.spec
        who = repr(record.tool)
        if record.tool != spec.name:
            who += f" (fallback of {spec.name!r})"
        message = f"tool {who} failed: {record.error}"
        if record.partial:
            message += f"; {len(record.partial)} partial chunks arrived before (error.partial)"
        if record.tool == spec.name and spec.fallbacks:
            message += f"; fallbacks: {', '.join(spec.fallbacks)}"
        kind = ToolTimeoutError if record.outcome is InvocationOutcome.TIMEOUT else ToolCallError
        return kind(
            message,
            tool=spec.name,
            attempts=tuple(attempts),
            degradations=self._describe(skipped, fallback=record.tool),
            fallbacks=spec.fallbacks,
        )

    # -- state --------------------------------------------------------------------------

    async def status(self, tool: str) -> ToolStatus:
        """``tool``'s health (one shared read) and this process's statistics.

        Raises:
            NotFoundError: ``tool`` is not registered.
            BackendError: the store holding the breakers cannot be reached.
        """
        spec = self.registry.get(tool).spec
        state = await self.breakers.state(tool)
        fallback = spec.fallbacks[0] if spec.fallbacks else None
        described = describe_degradation(
            tool, state, spec.policy, self._clock.now(), fallback=fallback
        )
        healthy = described.health is ToolHealth.HEALTHY
        return ToolStatus(
            name=tool,
            description=spec.description,
            health=described.health,
            breaker=state.status,
            recent_failures=described.recent_failures,
            since=described.since,
            retry_at=described.retry_at,
            last_error=state.last_error,
            fallbacks=spec.fallbacks,
            stats=self.tracker.stats(tool),
            message=None if healthy else described.message,
        )

    async def statuses(self) -> list[ToolStatus]:
        """Every registered tool's status, in registration order (one read per tool)."""
        return [await self.status(spec.name) for spec in self.registry]

    async def agent_notes(self) -> list[str]:
        """One sentence per tool that is not healthy, for the agent's context."""
        return [status.message for status in await self.statuses() if status.message]

    def stats(self, tool: str) -> ToolStats:
        """This process's counts and rolling latency percentiles for ``tool``.

        Raises:
            NotFoundError: ``tool`` is not registered.
        """
        self.registry.get(tool)
        return self.tracker.stats(tool)

    def in_flight(self) -> list[InFlight]:
        return self.tracker.in_flight()

    def recent(self) -> list[ToolInvocation]:
        return self.tracker.recent()
