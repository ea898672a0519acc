"""Errors of tool calls, under :class:`~tiermem.errors.TierMemError`::

    TierMemError
    └── ToolError                   a tool call produced no result
        ├── ToolCallError           the tool ran (or was started) and failed
        │   └── ToolTimeoutError    the tool did not answer within its timeout
        ├── ToolUnavailableError    the tool's breaker is open and no fallback answered
        └── ToolServerError         a tool server cannot be reached (raised by invokers)

Every one carries what an agent needs to recover: the ``attempts`` made (each with its
partial results), the ``degradations`` met (each with a sentence to show the model), and
the tool's ``fallbacks``. Asking for a tool that is not registered raises
:class:`~tiermem.errors.NotFoundError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiermem.errors import TierMemError
from tiermem.models import JsonValue

if TYPE_CHECKING:
    from tiermem.tools.degradation import Degradation
    from tiermem.tools.invocation import ToolInvocation

__all__ = [
    "ToolCallError",
    "ToolError",
    "ToolServerError",
    "ToolTimeoutError",
    "ToolUnavailableError",
]


class ToolError(TierMemError):
    """A tool call produced no result."""

    def __init__(
        self,
        message: str,
        *,
        tool: str,
        attempts: tuple[ToolInvocation, ...] = (),
        degradations: tuple[Degradation, ...] = (),
        fallbacks: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.tool = tool
        """The tool that was asked for."""
        self.attempts = attempts
        """Every call made, in order (the tool asked for, then fallbacks)."""
        self.degradations = degradations
        self.fallbacks = fallbacks
        """The tool's fallbacks, in the order they are tried."""

    @property
    def partial(self) -> tuple[JsonValue, ...]:
        """What the last attempt produced before failing: the chunks it emitted, then the
        content blocks of the error result it returned (which often hold a partial answer).
        Empty when there was no attempt or it produced nothing."""
        if not self.attempts:
            return ()
        last = self.attempts[-1]
        returned = last.output.content if last.output is not None and last.output.is_error else ()
        return (*last.partial, *returned)


class ToolCallError(ToolError):
    """The tool was called and failed: it reported an error, or the call could not be made.

    Its breaker counted the failure. The agent may retry later or call a fallback.
    """


class ToolTimeoutError(ToolCallError):
    """The tool did not answer within its timeout; the call was cancelled."""


class ToolUnavailableError(ToolError):
    """The tool's breaker is open (or its probe is in flight) and no fallback answered.

    ``degradations`` says, for every tool tried, since when it is unavailable and when it
    will be retried; ``str(error)`` is those sentences.
    """


class ToolServerError(ToolError):
    """A tool server cannot be reached: it did not start, the connection was lost, or it
    answered with a protocol error. Invokers raise it; through the dispatcher it becomes the
    cause of a :class:`ToolCallError` and counts against the tool's breaker. ``tool`` is the
    tool being called, or "" when none was (starting the server, listing tools).
    """

    def __init__(self, message: str, *, server: str, tool: str = "") -> None:
        super().__init__(message, tool=tool)
        self.server = server
