"""The one exception hierarchy of tiermem.

Every error the library raises on purpose is a :class:`TierMemError`. Errors of lower
layers (redis-py, botocore, sqlite3) are mapped to these at the backend boundary with
``raise ... from exc``, so callers never need to import a backend's exception types::

    TierMemError
    ├── ValidationError             bad input: an id, a size, a shape (also a ValueError)
    │   └── UnknownModelError       a model id the registry does not know
    ├── NotFoundError               the thing asked for does not exist (also a KeyError)
    ├── ConflictError               a compare-and-set lost: carries expected / actual
    ├── UnsupportedCapabilityError  the backend does not offer this capability
    ├── BudgetExceededError         content cannot fit the token budget; a task ran out of time
    │   └── ContextOverflowError    no step of a conversation manager can shrink it further
    │                               (tiermem.managers)
    ├── CorruptDataError            stored data cannot be decoded (skipped in lists, raised alone)
    ├── ToolError                   a tool call failed (tiermem.tools.errors)
    │   ├── ToolCallError           the tool answered with an error
    │   │   └── ToolTimeoutError    the tool did not answer in time
    │   ├── ToolUnavailableError    breakers open on the tool and its fallbacks
    │   └── ToolServerError         the tool server cannot be started or reached
    └── BackendError                a backend failed; ``retryable`` says if a retry may help
        ├── BackendUnavailableError the backend cannot be reached
        ├── BackendTimeoutError     the backend did not answer in time
        └── NotReplicatedError      a write is stored, but fewer replicas confirmed it than
                                    required (Redis ``WAIT``)

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "BudgetExceededError",
    "ConflictError",
    "CorruptDataError",
    "NotFoundError",
    "NotReplicatedError",
    "TierMemError",
    "UnknownModelError",
    "UnsupportedCapabilityError",
    "ValidationError",
]


class TierMemError(Exception):
    """Base class of every error tiermem raises on purpose."""


class ValidationError(TierMemError, ValueError):
    """Input was rejected at the edge; nothing was written."""


class UnknownModelError(ValidationError):
    """A model id is not in the model registry."""


class NotFoundError(TierMemError, KeyError):
    """The requested session, turn, record or memory does not exist (or has expired)."""

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class ConflictError(TierMemError):
    """A conditional write lost to a concurrent writer.

    ``expected`` is the version the caller based its write on, ``actual`` the version the
    store holds now (``None`` when the record does not exist). Re-read and retry.
    """

    def __init__(self, message: str, *, expected: object = None, actual: object = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class UnsupportedCapabilityError(TierMemError):
    """The configured backend does not offer a capability the caller asked for."""


class BudgetExceededError(TierMemError):
    """A budget was exceeded: required content does not fit the token budget even after
    every allowed trim, or a task's time budget ran out (:mod:`tiermem.state`)."""


class CorruptDataError(TierMemError):
    """Stored data cannot be decoded (written by a broken or much newer client).

    Reads of many items (a session's turns, a hot snapshot) skip such an item and log a
    warning; a read of that one item raises this.
    """


class BackendError(TierMemError):
    """A storage backend failed. ``retryable`` is True when the same call may succeed later."""

    def __init__(self, message: str, *, backend: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.backend = backend
        self.retryable = retryable


class BackendUnavailableError(BackendError):
    """The backend could not be reached (connection refused, DNS, closed pool)."""

    def __init__(self, message: str, *, backend: str, retryable: bool = True) -> None:
        super().__init__(message, backend=backend, retryable=retryable)


class BackendTimeoutError(BackendError):
    """The backend did not answer within its timeout."""

    def __init__(self, message: str, *, backend: str, retryable: bool = True) -> None:
        super().__init__(message, backend=backend, retryable=retryable)


class NotReplicatedError(BackendError):
    """A write was applied on the primary, but fewer replicas acknowledged it within the
    timeout than the deployment requires (Redis ``WAIT``, ``TIERMEM_REDIS_WAIT_REPLICAS``).

    The write is *not* undone: it is stored and readable, only its survival of a failover
    is unconfirmed. ``retryable`` is True when repeating the same call is harmless (an
    append with its idempotency key is recognised and writes nothing twice; an unconditional
    record write stores the same value again) and waits for the replicas again; ``required`` and
    ``acknowledged`` are the replica counts asked for and confirmed.
    """

    def __init__(
        self,
        message: str,
        *,
        backend: str,
        required: int,
        acknowledged: int,
        retryable: bool,
    ) -> None:
        super().__init__(message, backend=backend, retryable=retryable)
        self.required = required
        self.acknowledged = acknowledged
