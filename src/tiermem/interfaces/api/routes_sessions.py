"""Routes of sessions: open, read, close; turns; context; state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Path, Query, Request
from fastapi.responses import JSONResponse

from tiermem.context import ContextWindow
from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.api.deps import (
    CallerDep,
    answer,
    api_state,
    open_existing_session,
)
from tiermem.interfaces.api.errors import ApiError, ErrorBody
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.api.schemas import (
    ID_MAX,
    ID_PATTERN,
    ContextRequest,
    OpenSessionRequest,
    SessionInfo,
    StatePutRequest,
    TurnListResponse,
    TurnRequest,
)
from tiermem.interfaces.tenancy import InvalidIdError
from tiermem.models import SessionMetadata, StateBlob, Turn
from tiermem.session import SessionStats
from tiermem.store.keys import validate_id

__all__ = ["router"]

MAX_TURNS_PER_READ = 1_000
MAX_INDEX = 2**31 - 1

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    413: {"model": ErrorBody},
    422: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody},
}

router = RouteTable(prefix="/v1", tags=["sessions"], responses=_ERRORS)

SessionId = Annotated[
    str,
    Path(
        description="The caller's session id.",
        min_length=1,
        max_length=ID_MAX,
        pattern=ID_PATTERN,
    ),
]
Name = Annotated[str, Path(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
TurnIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]


@router.post("/sessions", response_model=SessionInfo, operation_id="open_session")
async def open_session(
    body: OpenSessionRequest, caller: CallerDep, request: Request
) -> JSONResponse:
    """Open a session: resume it if it exists (it must belong to ``user_id``), else create
    it. Omit ``session_id`` for a new one."""
    state = api_state(request)
    scope = caller.scope
    session_id = body.session_id if body.session_id is not None else state.service.ids.new_id()
    session = await state.service.session(
        scope.scope(session_id, field="session_id"),
        user_id=scope.scope(body.user_id, field="user_id"),
        user_tier=body.user_tier,
        locale=body.locale,
    )
    info = SessionInfo(metadata=await session.metadata(), stats=await session.stats())
    return answer(caller, info)


@router.get("/sessions/{session_id}", response_model=SessionInfo, operation_id="get_session")
async def get_session(session_id: SessionId, caller: CallerDep, request: Request) -> JSONResponse:
    """A session's metadata and statistics."""
    session = await open_existing_session(api_state(request), caller, session_id)
    info = SessionInfo(metadata=await session.metadata(), stats=await session.stats())
    return answer(caller, info)


@router.post(
    "/sessions/{session_id}/close", response_model=SessionMetadata, operation_id="close_session"
)
async def close_session(session_id: SessionId, caller: CallerDep, request: Request) -> JSONResponse:
    """Flush pending writes and mark the session closed."""
    session = await open_existing_session(api_state(request), caller, session_id)
    return answer(caller, await session.close())


@router.get(
    "/sessions/{session_id}/stats", response_model=SessionStats, operation_id="session_stats"
)
async def session_stats(session_id: SessionId, caller: CallerDep, request: Request) -> JSONResponse:
    session = await open_existing_session(api_state(request), caller, session_id)
    return answer(caller, await session.stats())


@router.post(
    "/sessions/{session_id}/turns", response_model=Turn, status_code=201, operation_id="add_turn"
)
async def add_turn(
    session_id: SessionId,
    body: TurnRequest,
    caller: CallerDep,
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=200,
            description="Makes a retry safe: a repeat returns the stored turn.",
        ),
    ] = None,
) -> JSONResponse:
    """Add a turn. With ``Idempotency-Key``, a retried request returns the turn the first
    one stored instead of adding it again."""
    session = await open_existing_session(api_state(request), caller, session_id)
    options = body.model_dump(exclude={"role", "content"}, exclude_none=True)
    content = body.content if isinstance(body.content, str) else list(body.content)
    turn = await session.add_turn(body.role, content, idempotency_key=idempotency_key, **options)
    return answer(caller, turn, status=201)


@router.get("/sessions/{session_id}/turns/{index}", response_model=Turn, operation_id="get_turn")
async def get_turn(
    session_id: SessionId, index: TurnIndex, caller: CallerDep, request: Request
) -> JSONResponse:
    """One archived turn by index."""
    session = await open_existing_session(api_state(request), caller, session_id)
    return answer(caller, await session.get_turn(index))


@router.get(
    "/sessions/{session_id}/turns", response_model=TurnListResponse, operation_id="get_turns"
)
async def get_turns(
    session_id: SessionId,
    caller: CallerDep,
    request: Request,
    start: Annotated[int, Query(ge=0, le=MAX_INDEX)] = 0,
    end: Annotated[
        int | None,
        Query(ge=0, le=MAX_INDEX, description=f"Exclusive; at most {MAX_TURNS_PER_READ} turns."),
    ] = None,
) -> JSONResponse:
    """Archived turns with ``start <= index < end`` (at most 1,000 per request)."""
    if end is None:
        end = start + MAX_TURNS_PER_READ
    if end < start:
        raise ApiError(422, "validation", "end must not be less than start", field="end")
    if end - start > MAX_TURNS_PER_READ:
        raise ApiError(
            422,
            "validation",
            f"at most {MAX_TURNS_PER_READ} turns per request; page with start and end",
            field="end",
        )
    session = await open_existing_session(api_state(request), caller, session_id)
    turns = await session.get_turns(start, end)
    return answer(caller, TurnListResponse(turns=turns))


@router.get(
    "/sessions/{session_id}/history",
    response_model=TurnListResponse,
    operation_id="history",
)
async def history(session_id: SessionId, caller: CallerDep, request: Request) -> JSONResponse:
    """The hot window of recent turns, oldest first."""
    session = await open_existing_session(api_state(request), caller, session_id)
    return answer(caller, TurnListResponse(turns=list(await session.history())))


@router.post("/sessions/{session_id}/context", response_model=ContextWindow, operation_id="context")
async def context(
    session_id: SessionId, body: ContextRequest, caller: CallerDep, request: Request
) -> JSONResponse:
    """The context to send the model now: items with provenance and token counts, cache
    points with fingerprints, and stats. Read-only."""
    state = api_state(request)
    session = await open_existing_session(state, caller, session_id)
    window = await session.context(
        body.query,
        body.budget,
        body.model,
        body.system,
        list(body.tools),
        current=body.current,
        recall_k=body.recall_k,
        optimize=body.optimize,
    )
    state.metrics.observe_context(session.id, window)
    return answer(caller, window)


def _state_name(name: str) -> str:
    try:
        return validate_id(name, what="name")
    except ValidationError as exc:
        raise InvalidIdError(str(exc), field="name") from None


@router.get(
    "/sessions/{session_id}/state/{name}", response_model=StateBlob, operation_id="get_state"
)
async def get_state(
    session_id: SessionId,
    name: Name,
    caller: CallerDep,
    request: Request,
    fresh: bool = False,
) -> JSONResponse:
    """A named state blob with its version; ``fresh`` reads the durable tier."""
    session = await open_existing_session(api_state(request), caller, session_id)
    blob = await session.get_state(_state_name(name), fresh=fresh)
    if blob is None:
        raise NotFoundError(f"session {session_id!r} has no state {name!r}")
    return answer(caller, blob)


@router.put(
    "/sessions/{session_id}/state/{name}", response_model=StateBlob, operation_id="put_state"
)
async def put_state(
    session_id: SessionId,
    name: Name,
    body: StatePutRequest,
    caller: CallerDep,
    request: Request,
) -> JSONResponse:
    """Write a named state blob; with ``expected_version`` it is compare-and-set (409 when
    the stored version differs)."""
    session = await open_existing_session(api_state(request), caller, session_id)
    blob = await session.put_state(
        _state_name(name), body.data, expected_version=body.expected_version
    )
    return answer(caller, blob)
