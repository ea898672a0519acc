"""The API's one error shape and the mapping of tiermem's exceptions to HTTP.

Every error answer is ``{"error": {"code", "message", "field"}}``: ``code`` is stable and
machine-readable, ``message`` says what was wrong and what to do, ``field`` names the
offending request field when there is one. Bad input is always a 4xx (never a 500); a
backend that cannot be reached is a 503 with ``Retry-After``; only a bug is a 500, and
its answer carries no detail (the traceback is logged).

====================================  ======  =========================
exception                             status  code
====================================  ======  =========================
RequestValidationError (pydantic)     422     ``validation``
ValidationError / InvalidIdError      422     ``validation``
BudgetExceededError                   422     ``budget_exceeded``
UnsupportedCapabilityError            422     ``unsupported``
NotFoundError                         404     ``not_found``
ConflictError                         409     ``conflict``
ToolError                             502     ``tool_error``
BackendError (and subclasses)         503     ``unavailable``
CorruptDataError                      500     ``corrupt_data``
anything else                         500     ``internal``
====================================  ======  =========================
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tiermem.errors import (
    BackendError,
    BudgetExceededError,
    ConflictError,
    CorruptDataError,
    NotFoundError,
    TierMemError,
    UnknownModelError,
    UnsupportedCapabilityError,
    ValidationError,
)
from tiermem.interfaces.api.schemas import ID_PATTERN
from tiermem.interfaces.tenancy import InvalidIdError
from tiermem.tools.errors import ToolError

__all__ = ["ApiError", "ErrorBody", "ErrorDetail", "error_response", "install_error_handlers"]

logger = logging.getLogger(__name__)

_UNPARSEABLE = "There was an error parsing the body"

RETRY_AFTER_SECONDS = 1
"""What a 503 tells a client to wait: backends come back in seconds or not soon; a client
retrying with backoff (the SDK does) covers both."""


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    """The body of every error answer."""

    error: ErrorDetail


class ApiError(Exception):
    """An error the API raises itself (auth, limits, bad ranges), already an HTTP answer."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "field": field}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


_LOC_SKIP = frozenset({"body", "query", "path", "header", "cookie"})
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})


def _loc_field(loc: Sequence[Any]) -> str | None:
    """``("body", "content", "list[...]", 0, "text", "text")`` -> ``content.0.text.text``:
    the request part and union-branch names are left out."""
    if loc and loc[0] in _LOC_SKIP:
        loc = loc[1:]  # where the value was (body, query string...), not which field
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_NAMES))]
    return ".".join(parts) or None


def _first_error(errors: Sequence[Any]) -> tuple[str | None, str]:
    """The field and message of the most specific error (the deepest location: for a
    union, the branch that came closest)."""
    if not errors:
        return None, "the request is not valid"
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    field = _loc_field(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "string_pattern_mismatch" and (
        first.get("ctx", {}).get("pattern") == ID_PATTERN
    ):
        message = "ids may not contain newlines, tabs or other control characters"
    where = f"{field}: " if field else ""
    return field, f"{where}{message}"


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def guess_field(message: str, candidates: Sequence[str]) -> str | None:
    """The request field a library message is about: the earliest candidate the message
    names (library messages start with, or quote, the field they reject)."""
    best: tuple[int, str] | None = None
    lowered = message.lower()
    for name in candidates:
        for variant in {name, name.replace("_", " "), name.replace("-", " ")}:
            pos = lowered.find(variant.lower())
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, name)
    return best[1] if best else None


def _request_fields(request: Request) -> list[str]:
    fields = list(request.path_params)
    route = request.scope.get("route")
    body_model = getattr(route, "body_field", None)
    annotation = getattr(getattr(body_model, "field_info", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields += list(annotation.model_fields)
    fields += [k for k in request.query_params]
    if "idempotency-key" in request.headers:
        fields.append("Idempotency-Key")
    return fields


def _scrub(request: Request, message: str) -> str:
    """Remove the caller's tenant prefix from a library message (ids inside the stores
    are scoped; the caller must only ever see its own ids)."""
    prefix = getattr(request.state, "tenant_prefix", None)
    return message.replace(prefix, "") if prefix else message


def _map(request: Request, exc: Exception) -> JSONResponse:
    message = _scrub(request, str(exc))
    if isinstance(exc, InvalidIdError):
        return error_response(422, "validation", message, field=exc.field)
    if isinstance(exc, UnknownModelError):
        return error_response(422, "validation", message, field="model")
    if isinstance(exc, ValidationError):
        field = guess_field(message, _request_fields(request))
        return error_response(422, "validation", message, field=field)
    if isinstance(exc, PydanticValidationError):
        field, text = _first_error(exc.errors())
        return error_response(422, "validation", _scrub(request, text), field=field)
    if isinstance(exc, BudgetExceededError):
        return error_response(422, "budget_exceeded", message, field="budget")
    if isinstance(exc, UnsupportedCapabilityError):
        return error_response(422, "unsupported", message)
    if isinstance(exc, NotFoundError):
        return error_response(404, "not_found", message)
    if isinstance(exc, ConflictError):
        return error_response(409, "conflict", message)
    if isinstance(exc, ToolError):
        return error_response(502, "tool_error", message)
    if isinstance(exc, BackendError):
        # The backend's own words may name hosts or internals: keep them in the log.
        logger.warning("backend %s failed on %s: %s", exc.backend, request.url.path, exc)
        return error_response(
            503,
            "unavailable",
            f"a storage backend ({exc.backend}) is unavailable; retry later",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, CorruptDataError):
        logger.error("corrupt data on %s: %s", request.url.path, exc)
        return error_response(500, "corrupt_data", message)
    logger.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every exception into the one error shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(
            exc.status,
            exc.code,
            _scrub(request, exc.message),
            field=exc.field,
            headers=exc.headers,
        )

    async def on_request_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        field, message = _first_error(exc.errors())
        return error_response(422, "validation", _scrub(request, message), field=field)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and exc.detail == _UNPARSEABLE:
            # FastAPI's answer to a body its JSON parser gave up on (recursion, encoding).
            return error_response(
                422,
                "validation",
                "the request body cannot be parsed: it is not valid JSON, not UTF-8, or "
                "nests deeper than the parser allows (the limit for stored data is 64 levels)",
            )
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        return error_response(
            exc.status_code,
            codes.get(exc.status_code, "http_error"),
            str(exc.detail),
            headers=getattr(exc, "headers", None),
        )

    async def on_library(request: Request, exc: Exception) -> JSONResponse:
        return _map(request, exc)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(TierMemError, on_library)
    app.add_exception_handler(PydanticValidationError, on_library)
    app.add_exception_handler(Exception, on_library)
