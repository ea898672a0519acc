"""The tools an agent may call: what each one is, who runs it, and what replaces it.

A :class:`ToolSpec` is a tool's definition (name, description, JSON schema of its
arguments, timeout, breaker policy, ordered fallbacks); the :class:`ToolRegistry` pairs each
spec with the :class:`~tiermem.tools.invoker.ToolInvoker` that runs it. The registry is
configuration, built once per process at start-up; the state that changes (breakers) is
shared through the hot store, see :mod:`tiermem.tools.breaker_store`.

Fallbacks are tools too, registered before the tools that name them, so a fallback list
can never point at nothing or loop back. A fallback receives the same arguments as the tool
it stands in for.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import cast

from tiermem.errors import NotFoundError, ValidationError
from tiermem.models import JsonValue
from tiermem.store.keys import validate_id
from tiermem.tools.breaker import BreakerPolicy
from tiermem.tools.invoker import ToolInvoker

__all__ = [
    "DEFAULT_PROBE_LEASE",
    "DEFAULT_TIMEOUT",
    "RegisteredTool",
    "ToolRegistry",
    "ToolSpec",
]

DEFAULT_TIMEOUT = timedelta(seconds=2)
"""Seed 000's per-call budget for a tool."""
DEFAULT_PROBE_LEASE = timedelta(seconds=30)
"""The least a probe's lease lasts when the spec gives no breaker policy (it is at least
twice the timeout)."""


def _schema(value: Mapping[str, JsonValue], tool: str) -> dict[str, JsonValue]:
    if not isinstance(value, Mapping):
        raise ValidationError(
            f"input_schema of tool {tool!r} must be a JSON Schema object, "
            f"got {type(value).__name__}"
        )
    if value.get("type", "object") != "object":
        raise ValidationError(
            f"input_schema of tool {tool!r} must describe an object (MCP tools take named "
            f"arguments), got type {value.get('type')!r}"
        )
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"input_schema of tool {tool!r} is not JSON: {exc}") from exc
    return copy.deepcopy(dict(value))


def _check_invoker(invoker: object, tools: str) -> None:
    if not callable(getattr(invoker, "invoke", None)):
        raise ValidationError(
            f"invoker of tool {tools!r} must have an async invoke(tool, arguments, *, "
            f"request_id, emit) method (a ToolInvoker), got {type(invoker).__name__}"
        )


@dataclass(frozen=True)
class ToolSpec:
    """One tool's definition.

    ``breaker`` None picks :class:`~tiermem.tools.breaker.BreakerPolicy` defaults with a
    probe lease of at least :data:`DEFAULT_PROBE_LEASE` and twice the timeout.

    Raises:
        ValidationError: a name or fallback that cannot be an id, the tool among its own
            fallbacks or a fallback listed twice, a schema that is not a JSON object schema,
            a non-positive timeout, or a probe lease that does not outlast the timeout.
    """

    name: str
    description: str = ""
    input_schema: Mapping[str, JsonValue] = field(default_factory=lambda: {"type": "object"})
    fallbacks: tuple[str, ...] = ()
    timeout: timedelta = DEFAULT_TIMEOUT
    breaker: BreakerPolicy | None = None

    def __post_init__(self) -> None:
        validate_id(self.name, what="tool name")
        if not isinstance(self.description, str):
            raise ValidationError(
                f"description of tool {self.name!r} must be a string, got "
                f"{type(self.description).__name__}"
            )
        object.__setattr__(self, "input_schema", _schema(self.input_schema, self.name))
        if isinstance(self.fallbacks, str) or not isinstance(self.fallbacks, Iterable):
            raise ValidationError(
                f"fallbacks of tool {self.name!r} must be a list of tool names, got "
                f"{self.fallbacks!r}"
            )
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise ValidationError(
                f"breaker of tool {self.name!r} must be a BreakerPolicy or None, got "
                f"{type(self.breaker).__name__}"
            )
        fallbacks = tuple(self.fallbacks)
        for fallback in fallbacks:
            validate_id(fallback, what=f"fallback of tool {self.name!r}")
        if self.name in fallbacks:
            raise ValidationError(f"tool {self.name!r} lists itself as its own fallback")
        if len(set(fallbacks)) != len(fallbacks):
            raise ValidationError(f"tool {self.name!r} lists a fallback twice: {fallbacks}")
        object.__setattr__(self, "fallbacks", fallbacks)
        if not isinstance(self.timeout, timedelta) or self.timeout <= timedelta(0):
            raise ValidationError(
                f"timeout of tool {self.name!r} must be a positive timedelta, got {self.timeout!r}"
            )
        if self.breaker is None:
            lease = max(DEFAULT_PROBE_LEASE, 2 * self.timeout)
            object.__setattr__(self, "breaker", BreakerPolicy(probe_lease=lease))
        elif self.breaker.probe_lease <= self.timeout:
            raise ValidationError(
                f"the probe lease of tool {self.name!r} ({self.breaker.probe_lease}) must "
                f"outlast its timeout ({self.timeout}), or a live probe would lose its lease"
            )

    @property
    def policy(self) -> BreakerPolicy:
        """The breaker policy (never None after construction)."""
        return cast(BreakerPolicy, self.breaker)  # __post_init__ filled in a None

    def manifest(self) -> dict[str, JsonValue]:
        """The tool as an LLM tool list shows it: name, description, input schema."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": copy.deepcopy(dict(self.input_schema)),
        }


@dataclass(frozen=True)
class RegisteredTool:
    spec: ToolSpec
    invoker: ToolInvoker


class ToolRegistry:
    """Tool specs with their invokers, in registration order."""

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(self, spec: ToolSpec, invoker: ToolInvoker) -> RegisteredTool:
        """Add a tool.

        Raises:
            ValidationError: ``spec`` is not a ToolSpec or ``invoker`` has no ``invoke``,
                the name is taken, or a fallback is not registered yet (register
                fallbacks first).
        """
        if not isinstance(spec, ToolSpec):
            raise ValidationError(f"register takes a ToolSpec, got {type(spec).__name__}")
        _check_invoker(invoker, spec.name)
        if spec.name in self._tools:
            raise ValidationError(f"tool {spec.name!r} is already registered")
        missing = [name for name in spec.fallbacks if name not in self._tools]
        if missing:
            raise ValidationError(
                f"fallbacks {missing} of tool {spec.name!r} are not registered; register "
                "fallbacks before the tools that use them"
            )
        entry = RegisteredTool(spec, invoker)
        self._tools[spec.name] = entry
        return entry

    def register_all(self, specs: Iterable[ToolSpec], invoker: ToolInvoker) -> None:
        """Add several tools served by one invoker (an MCP server's), fallbacks first
        whatever their order in ``specs``.

        Raises:
            ValidationError: as :meth:`register`, for a fallback that is neither registered
                nor among ``specs`` (or a cycle of fallbacks); nothing is registered then.
        """
        if isinstance(specs, str | Mapping) or not isinstance(specs, Iterable):
            raise ValidationError(
                f"register_all takes a list of ToolSpec, got {type(specs).__name__}"
            )
        specs = list(specs)
        wrong = [s for s in specs if not isinstance(s, ToolSpec)]
        if wrong:
            raise ValidationError(
                f"register_all takes a list of ToolSpec, got {type(wrong[0]).__name__} in it"
            )
        _check_invoker(invoker, ", ".join(s.name for s in specs))
        pending = {spec.name: spec for spec in specs}
        ordered: list[ToolSpec] = []
        known = set(self._tools)
        while pending:
            ready = [s for s in pending.values() if all(f in known for f in s.fallbacks)]
            if not ready:
                stuck = {name: spec.fallbacks for name, spec in pending.items()}
                raise ValidationError(
                    f"fallbacks of these tools are neither registered nor among the tools "
                    f"given, or form a cycle: {stuck}"
                )
            for spec in ready:
                ordered.append(spec)
                known.add(spec.name)
                del pending[spec.name]
        duplicates = [spec.name for spec in ordered if spec.name in self._tools]
        if duplicates:
            raise ValidationError(f"tools {duplicates} are already registered")
        for spec in ordered:
            self.register(spec, invoker)

    def get(self, name: str) -> RegisteredTool:
        """Raises:
        NotFoundError: no tool of that name is registered.
        """
        entry = self._tools.get(name)
        if entry is None:
            raise NotFoundError(
                f"no tool named {name!r} is registered; registered tools: {sorted(self._tools)}"
            )
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec]:
        return (entry.spec for entry in self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def manifest(self) -> list[dict[str, JsonValue]]:
        """Every tool as an LLM tool list shows it (see :meth:`ToolSpec.manifest`)."""
        return [entry.spec.manifest() for entry in self._tools.values()]
