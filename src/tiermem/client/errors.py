"""Errors of the REST client, mapped back onto tiermem's own hierarchy.

An answer of the API comes back as the exception the in-process library would have raised
(``ValidationError``, ``NotFoundError``, ``ConflictError``, ``BackendUnavailableError``...),
so code written against :class:`~tiermem.service.MemoryService` handles the client's errors
unchanged. What only a remote call can meet has its own subclass::

    TierMemError
    ├── ValidationError
    │   └── RequestRejectedError     422 / 413: carries ``field`` and ``status``
    ├── AuthenticationError          401: no key, or a key that is unknown or revoked
    ├── RemoteToolError              502: a tool call failed on the server
    ├── ApiResponseError             an answer the client does not understand (a bug)
    └── BackendError
        └── BackendUnavailableError  503, connection refused, or retries exhausted
            └── RateLimitedError     429: ``retry_after`` seconds
"""

from __future__ import annotations

from typing import Any

import httpx

from tiermem.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    BudgetExceededError,
    ConflictError,
    CorruptDataError,
    NotFoundError,
    TierMemError,
    UnsupportedCapabilityError,
    ValidationError,
)

__all__ = [
    "ApiResponseError",
    "AuthenticationError",
    "RateLimitedError",
    "RemoteToolError",
    "RequestRejectedError",
    "error_from_response",
    "error_from_transport",
]

BACKEND = "tiermem-api"


class RequestRejectedError(ValidationError):
    """The server refused the request's content (422) or size (413)."""

    def __init__(self, message: str, *, field: str | None, status: int) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


class AuthenticationError(TierMemError):
    """The API key is missing, unknown or revoked (401)."""


class RemoteToolError(TierMemError):
    """A tool call on the server failed (502)."""


class ApiResponseError(TierMemError):
    """The server answered with something this client does not understand."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class RateLimitedError(BackendUnavailableError):
    """The key's rate limit is reached (429); ``retry_after`` says how long to wait."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, backend=BACKEND, retryable=True)
        self.retry_after = retry_after


def retry_after_of(response: httpx.Response, default: float = 1.0) -> float:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else default
    except ValueError:
        return default


def error_from_response(response: httpx.Response) -> TierMemError:
    """The tiermem exception for an error answer."""
    status = response.status_code
    detail: dict[str, Any] = {}
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            detail = body["error"]
    except ValueError:
        pass  # not JSON (a proxy's page): the status decides below
    message = str(detail.get("message") or f"HTTP {status} from the tiermem API")
    code = detail.get("code")
    field = detail.get("field")
    if status == 401:
        return AuthenticationError(message)
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    if status == 429:
        return RateLimitedError(message, retry_after=retry_after_of(response))
    if status in (413, 422):
        if code == "budget_exceeded":
            return BudgetExceededError(message)
        if code == "unsupported":
            return UnsupportedCapabilityError(message)
        return RequestRejectedError(message, field=field, status=status)
    if status == 502 and code == "tool_error":
        return RemoteToolError(message)
    if status in (502, 503, 504):
        return BackendUnavailableError(message, backend=BACKEND)
    if code == "corrupt_data":
        return CorruptDataError(message)
    return ApiResponseError(message, status=status)


def error_from_transport(exc: httpx.TransportError, url: str) -> TierMemError:
    """The tiermem exception for a request that got no answer."""
    if isinstance(exc, httpx.TimeoutException):
        return BackendTimeoutError(
            f"the tiermem API at {url} did not answer in time", backend=BACKEND
        )
    return BackendUnavailableError(
        f"the tiermem API at {url} cannot be reached ({type(exc).__name__}: {exc})",
        backend=BACKEND,
    )
