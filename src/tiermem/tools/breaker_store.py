"""Circuit breakers whose state every worker shares, kept in the hot store's shared keyspace.

Each tool's breaker is one shared blob, ``<namespace>:<tool>`` (``breaker:search`` by
default), holding :func:`~tiermem.tools.breaker.encode_state`. The decisions are the pure
functions of :mod:`tiermem.tools.breaker`; this module only reads and writes:

* :meth:`SharedBreakers.check` — one ``get_shared`` (one round trip on Redis). Only when the
  caller becomes the half-open probe does it write, with compare-and-set on the version it
  read: of all workers that saw the breaker due for a probe at once, exactly one wins the
  write and probes; the others re-read and are rejected.
* :meth:`SharedBreakers.record_success` — no I/O at all unless the call was the probe (a
  success never changes a closed breaker).
* :meth:`SharedBreakers.record_failure` — one compare-and-set write on the version seen at
  check time; on a conflict, re-read and re-decide, with :func:`tiermem.retry.pause`
  between attempts, at most :data:`tiermem.retry.CAS_ATTEMPTS` times.

Blob expiry collects breakers nobody uses: a closed breaker's blob expires when its last
failure leaves the window; an open or half-open one a day after its retry time, after which
the breaker reads as closed again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from tiermem.clock import Clock, IdFactory, SystemClock, UlidFactory
from tiermem.errors import ConflictError, CorruptDataError
from tiermem.models import JsonValue, StateBlob
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.keys import validate_id
from tiermem.tools.breaker import (
    CLOSED_STATE,
    Admission,
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    Transition,
    admit,
    decode_state,
    encode_state,
    record_failure,
    record_success,
)

__all__ = ["DEFAULT_NAMESPACE", "IDLE_FORGET", "Permit", "SharedBreakers", "SharedKeyspace"]

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "breaker"
IDLE_FORGET = timedelta(days=1)
"""How long after its retry time an open breaker nobody asked about is forgotten."""
_NAME_CACHE_LIMIT = 4096


class SharedKeyspace(Protocol):
    """The part of :class:`~tiermem.store.contract.HotStore` breakers use: every hot store
    is one."""

    async def get_shared(self, name: str) -> StateBlob | None: ...

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob: ...

    async def delete_shared(self, name: str) -> bool: ...


@dataclass(frozen=True)
class Permit:
    """The answer of :meth:`SharedBreakers.check`: whether to call, and what to report back.

    Pass it to :meth:`SharedBreakers.record_success` or :meth:`SharedBreakers.record_failure`
    when the call ends.
    """

    tool: str
    admission: Admission
    state: BreakerState
    """The breaker as this caller left it (half-open with its lease, for a probe)."""
    version: int
    """The blob version ``state`` was read or written at (0: no blob)."""
    probe_id: str | None = None

    @property
    def admitted(self) -> bool:
        return self.admission is not Admission.REJECT

    @property
    def is_probe(self) -> bool:
        return self.admission is Admission.PROBE


class SharedBreakers:
    """Per-tool circuit breakers shared through a hot store's shared keyspace.

    ``clock`` decides every transition (give all workers the same kind of clock: breakers
    compare times written by different processes). ``ids`` makes probe ids.

    Every method raises the store's :class:`~tiermem.errors.BackendError` when it cannot be
    reached, and :class:`~tiermem.errors.ValidationError` for a tool name that cannot be an
    id. A blob that cannot be decoded reads as a closed breaker (logged, and counted in
    :attr:`corrupt_reads`) and is overwritten by the next transition: a damaged record must
    not lock a tool out.
    """

    def __init__(
        self,
        store: SharedKeyspace,
        *,
        clock: Clock | None = None,
        ids: IdFactory | None = None,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self._store = store
        self._clock = clock or SystemClock()
        self._ids = ids or UlidFactory()
        self.namespace = validate_id(namespace, what="breaker namespace")
        self.corrupt_reads = 0
        # Validated names, so the hot path does not re-validate (half a check's CPU in the
        # memory store); bounded by the number of tools, capped against misuse.
        self._names: dict[str, str] = {}

    def blob_name(self, tool: str) -> str:
        """The shared blob that holds ``tool``'s breaker."""
        name = self._names.get(tool)
        if name is None:
            name = validate_id(f"{self.namespace}:{tool}", what="breaker blob name")
            if len(self._names) < _NAME_CACHE_LIMIT:
                self._names[tool] = name
        return name

    async def _read(self, tool: str) -> tuple[BreakerState, int]:
        blob = await self._store.get_shared(self.blob_name(tool))
        return self._decode(tool, blob)

    def _decode(self, tool: str, blob: StateBlob | None) -> tuple[BreakerState, int]:
        if blob is None:
            return CLOSED_STATE, 0
        try:
            return decode_state(blob.data), blob.version
        except CorruptDataError as exc:
            self.corrupt_reads += 1
            logger.warning("breaker of tool %s reads as closed: %s", tool, exc)
            return CLOSED_STATE, blob.version

    @staticmethod
    def _expires_at(state: BreakerState, policy: BreakerPolicy, now: datetime) -> datetime:
        if state.status is BreakerStatus.CLOSED:
            return (state.failures[-1] if state.failures else now) + policy.window
        due = max(t for t in (state.retry_at, state.probe_until, now) if t is not None)
        return due + IDLE_FORGET

    async def _write(
        self, tool: str, policy: BreakerPolicy, transition: Transition, version: int
    ) -> int:
        """Write ``transition.after`` if the blob is still at ``version``; the new version.

        Raises:
            ConflictError: another worker wrote first.
        """
        blob = await self._store.put_shared(
            self.blob_name(tool),
            encode_state(transition.after),
            expires_at=self._expires_at(transition.after, policy, self._clock.now()),
            expected_version=version,
        )
        logger.info(
            "breaker of tool %s: %s (%s -> %s)",
            tool,
            transition.event,
            transition.before.status.value,
            transition.after.status.value,
        )
        return blob.version

    async def state(self, tool: str) -> BreakerState:
        """The breaker's current state; one read."""
        state, _ = await self._read(tool)
        return state

    async def check(self, tool: str, policy: BreakerPolicy) -> Permit:
        """May ``tool`` be called now? One read; a write only to become the probe.

        Raises:
            ConflictError: the breaker kept changing under :data:`~tiermem.retry.CAS_ATTEMPTS`
                attempts to claim the probe.
        """
        for attempt in range(CAS_ATTEMPTS):
            state, version = await self._read(tool)
            decision = admit(state, policy, self._clock.now(), new_probe_id=self._ids.new_id)
            if decision.admission is not Admission.PROBE:
                return Permit(tool, decision.admission, state, version)
            after = decision.transition.after
            try:
                version = await self._write(tool, policy, decision.transition, version)
            except ConflictError:
                # Another worker changed the breaker (most often: claimed the probe).
                await pause(attempt)
                continue
            return Permit(tool, Admission.PROBE, after, version, after.probe_id)
        raise ConflictError(
            f"the breaker of tool {tool!r} kept changing under {CAS_ATTEMPTS} attempts to "
            "claim its probe; try again"
        )

    async def record_success(self, permit: Permit, policy: BreakerPolicy) -> Transition:
        """Report that the admitted call succeeded. No I/O unless it was the probe.

        Raises:
            ConflictError: as for :meth:`record_failure`.
        """
        if not permit.is_probe:
            # record_success without a probe id never changes a breaker.
            return Transition(before=permit.state, after=permit.state)
        return await self._update(permit, policy, error=None)

    async def record_failure(
        self, permit: Permit, policy: BreakerPolicy, *, error: str
    ) -> Transition:
        """Report that the admitted call failed with ``error`` (a short description).

        Raises:
            ConflictError: the breaker kept changing under
                :data:`~tiermem.retry.CAS_ATTEMPTS` attempts to record it.
        """
        return await self._update(permit, policy, error=error)

    async def _update(
        self, permit: Permit, policy: BreakerPolicy, *, error: str | None
    ) -> Transition:
        state, version = permit.state, permit.version
        for attempt in range(CAS_ATTEMPTS):
            now = self._clock.now()
            if error is None:
                transition = record_success(state, policy, now, probe_id=permit.probe_id)
            else:
                transition = record_failure(
                    state, policy, now, error=error, probe_id=permit.probe_id
                )
            if not transition.changed:
                return transition
            try:
                await self._write(permit.tool, policy, transition, version)
            except ConflictError:
                await pause(attempt)
                state, version = await self._read(permit.tool)
                continue
            return transition
        raise ConflictError(
            f"the breaker of tool {permit.tool!r} kept changing under {CAS_ATTEMPTS} attempts "
            "to record an outcome; try again"
        )

    async def reset(self, tool: str) -> bool:
        """Close the breaker by deleting its blob (an operator's action); False if there was
        none."""
        return await self._store.delete_shared(self.blob_name(tool))
