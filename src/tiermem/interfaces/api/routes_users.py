"""Routes of a user: sessions list, long-term memories, knowledge documents, purge."""

from __future__ import annotations

from typing import Annotated

from fastapi import File, Form, Path, Query, Request, UploadFile
from fastapi.responses import JSONResponse

from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.api.deps import Caller, CallerDep, answer, api_state
from tiermem.interfaces.api.errors import ApiError, ErrorBody
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.api.schemas import (
    ID_MAX,
    ID_PATTERN,
    DeletedResponse,
    DocumentListResponse,
    DocumentTextRequest,
    ForgetResponse,
    MemoryListResponse,
    PurgeResponse,
    RecallRequest,
    RecallResponse,
    RememberRequest,
    SessionListResponse,
)
from tiermem.longterm.knowledge import KnowledgeDocument
from tiermem.longterm.records import UserMemoryStats
from tiermem.models import MemoryRecord

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (401, 404, 413, 422, 429, 503)
}

router = RouteTable(prefix="/v1/users/{user_id}", tags=["users"], responses=_ERRORS)

UserId = Annotated[
    str,
    Path(description="The caller's user id.", min_length=1, max_length=ID_MAX, pattern=ID_PATTERN),
]
ItemId = Annotated[str, Path(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=1_000)]


def _user(caller: Caller, user_id: str) -> str:
    return caller.scope.scope(user_id, field="user_id")


def _types(request: Request, types: list[str] | None, field: str) -> list[str] | None:
    """Memory types to filter by, each one registered: an unknown (misspelt) type would
    filter everything out and answer an empty list."""
    if types is not None:
        registry = api_state(request).service.longterm.types
        for name in types:
            try:
                registry.get(name)
            except ValidationError as exc:
                raise ApiError(422, "validation", str(exc), field=field) from None
    return types


@router.get("/sessions", response_model=SessionListResponse, operation_id="list_sessions")
async def list_sessions(
    user_id: UserId, caller: CallerDep, request: Request, limit: Limit = 100
) -> JSONResponse:
    """The user's sessions, newest first."""
    refs = await api_state(request).service.list_sessions(_user(caller, user_id), limit=limit)
    return answer(caller, SessionListResponse(sessions=refs))


@router.post("/memories", response_model=MemoryRecord, status_code=201, operation_id="remember")
async def remember(
    user_id: UserId, body: RememberRequest, caller: CallerDep, request: Request
) -> JSONResponse:
    """Remember a fact, preference or other typed memory. The same content of the same
    type is one record (a repeat returns it), so a retry is safe."""
    record = await api_state(request).service.longterm.remember(
        _user(caller, user_id),
        body.content,
        memory_type=body.memory_type,
        tags=body.tags,
        importance=body.importance,
        metadata=body.metadata,
    )
    return answer(caller, record, status=201)


@router.get("/memories", response_model=MemoryListResponse, operation_id="list_memories")
async def list_memories(
    user_id: UserId,
    caller: CallerDep,
    request: Request,
    limit: Limit = 100,
    include_superseded: bool = False,
    memory_type: Annotated[list[str] | None, Query(max_length=64)] = None,
) -> JSONResponse:
    """The user's memories, newest first."""
    records = await api_state(request).service.longterm.list(
        _user(caller, user_id),
        types=_types(request, memory_type, "memory_type"),
        include_superseded=include_superseded,
        limit=limit,
    )
    return answer(caller, MemoryListResponse(memories=list(records)))


@router.get("/memories/{memory_id}", response_model=MemoryRecord, operation_id="get_memory")
async def get_memory(
    user_id: UserId,
    memory_id: ItemId,
    caller: CallerDep,
    request: Request,
) -> JSONResponse:
    record = await api_state(request).service.longterm.get(_user(caller, user_id), memory_id)
    if record is None:
        raise NotFoundError(f"user {user_id!r} has no memory {memory_id!r}")
    return answer(caller, record)


@router.delete("/memories/{memory_id}", response_model=ForgetResponse, operation_id="forget")
async def forget(
    user_id: UserId,
    memory_id: ItemId,
    caller: CallerDep,
    request: Request,
) -> JSONResponse:
    """Forget one memory; ``forgotten`` is false when there was none."""
    done = await api_state(request).service.longterm.forget(_user(caller, user_id), memory_id)
    return answer(caller, ForgetResponse(forgotten=done))


@router.post("/recall", response_model=RecallResponse, operation_id="recall")
async def recall(
    user_id: UserId, body: RecallRequest, caller: CallerDep, request: Request
) -> JSONResponse:
    """The user's memories (and with ``scope`` archived turns and document chunks) most
    relevant to ``query``, best first, each with its score and provenance."""
    hits = await api_state(request).service.longterm.recall(
        _user(caller, user_id),
        body.query,
        types=_types(request, body.types, "types"),
        min_importance=body.min_importance,
        k=body.k,
        scope=tuple(body.scope),
    )
    return answer(caller, RecallResponse(hits=hits))


@router.get("/stats", response_model=UserMemoryStats, operation_id="user_stats")
async def user_stats(user_id: UserId, caller: CallerDep, request: Request) -> JSONResponse:
    """Counts, tokens and ages of the user's memories."""
    return answer(caller, await api_state(request).service.longterm.stats(_user(caller, user_id)))


@router.delete("", response_model=PurgeResponse, operation_id="purge_user")
async def purge_user(user_id: UserId, caller: CallerDep, request: Request) -> JSONResponse:
    """GDPR erasure: delete everything of the user from every tier and the index."""
    deleted = await api_state(request).service.purge_user(_user(caller, user_id))
    return answer(caller, PurgeResponse(deleted=deleted))


# -- knowledge documents ---------------------------------------------------------------


@router.post(
    "/documents",
    response_model=KnowledgeDocument,
    status_code=201,
    operation_id="upload_document",
)
async def upload_document(
    user_id: UserId,
    caller: CallerDep,
    request: Request,
    file: Annotated[UploadFile, File(description="txt, md, pdf or docx")],
    tags: Annotated[list[str] | None, Form(max_length=64)] = None,
) -> JSONResponse:
    """Upload a document (multipart ``file``); its format comes from the file name."""
    data = await file.read()
    document = await api_state(request).service.knowledge.add_document(
        _user(caller, user_id), file.filename or "", data, tags=tags or ()
    )
    return answer(caller, document, status=201)


@router.post(
    "/documents/text",
    response_model=KnowledgeDocument,
    status_code=201,
    operation_id="add_text_document",
)
async def add_text_document(
    user_id: UserId, body: DocumentTextRequest, caller: CallerDep, request: Request
) -> JSONResponse:
    """Add a text or Markdown document sent as JSON."""
    try:
        data = body.text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("text is not valid Unicode (a lone surrogate?)") from None
    document = await api_state(request).service.knowledge.add_document(
        _user(caller, user_id), body.name, data, format=body.format, tags=body.tags
    )
    return answer(caller, document, status=201)


@router.get("/documents", response_model=DocumentListResponse, operation_id="list_documents")
async def list_documents(
    user_id: UserId, caller: CallerDep, request: Request, limit: Limit = 100
) -> JSONResponse:
    documents = await api_state(request).service.knowledge.list_documents(
        _user(caller, user_id), limit=limit
    )
    return answer(caller, DocumentListResponse(documents=documents))


@router.get(
    "/documents/{document_id}",
    response_model=KnowledgeDocument,
    operation_id="get_document",
)
async def get_document(
    user_id: UserId,
    document_id: ItemId,
    caller: CallerDep,
    request: Request,
) -> JSONResponse:
    document = await api_state(request).service.knowledge.get_document(
        _user(caller, user_id), document_id
    )
    return answer(caller, document)


@router.delete(
    "/documents/{document_id}",
    response_model=DeletedResponse,
    operation_id="delete_document",
)
async def delete_document(
    user_id: UserId,
    document_id: ItemId,
    caller: CallerDep,
    request: Request,
) -> JSONResponse:
    done = await api_state(request).service.knowledge.delete_document(
        _user(caller, user_id), document_id
    )
    return answer(caller, DeletedResponse(deleted=done))
