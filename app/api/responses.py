"""What the API answers besides success, in one place: each error status with its ``code``, the
model of its body, a description and an example, as the handlers send them (app.main for the
app's errors, app.edge for what is refused before the app runs). Routes name the statuses they
can answer with ``errors(...)``; ``edge_responses`` adds those every operation can get."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from app.schemas import ErrorOut, InternalErrorOut, ValidationErrorOut

Responses = dict[int | str, dict[str, Any]]


@dataclass(frozen=True)
class ErrorDoc:
    code: str
    description: str
    detail: Any  # the example's detail
    model: type[BaseModel] = ErrorOut
    headers: dict[str, Any] = field(default_factory=dict)

    def example(self) -> dict[str, Any]:
        if self.model is InternalErrorOut:
            return {"detail": self.detail, "code": self.code, "request_id": "5f0c6e1c2b9a4b7e9d1c3a2f4e6b8d0"}
        return {"detail": self.detail, "code": self.code}


def _header(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "schema": schema}


ERRORS: dict[int, ErrorDoc] = {
    400: ErrorDoc(
        "bad_request",
        "The body is not JSON, or nests too deep (about 1,000 levels) to be parsed.",
        "the request body is not valid JSON",
    ),
    401: ErrorDoc(
        "unauthorized",
        "No API key, or an unknown one: send `Authorization: Bearer <key>` or `X-API-Key`. Checked "
        "before the body is read.",
        "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'",
        headers={"WWW-Authenticate": _header("Always `Bearer`.", {"type": "string", "const": "Bearer"})},
    ),
    404: ErrorDoc("not_found", "No such conversation for this tenant.", "conversation 'demo' not found"),
    408: ErrorDoc(
        "request_timeout",
        "The request head (under `memory-service serve`) or the next piece of the body did not "
        "arrive within MEMORY_HEADER_TIMEOUT_SECONDS.",
        "request body stalled for 10s (MEMORY_HEADER_TIMEOUT_SECONDS)",
    ),
    409: ErrorDoc("conflict", "Conflict with the stored state.", "conversation 'trip-42' already exists"),
    413: ErrorDoc(
        "payload_too_large",
        "A body over MEMORY_MAX_BODY_BYTES (MEMORY_MAX_IMPORT_BYTES for POST /conversations/import): "
        "refused before it is read when its Content-Length says so, else once it passes the limit.",
        "request body larger than 4194304 bytes (MEMORY_MAX_BODY_BYTES)",
    ),
    415: ErrorDoc(
        "unsupported_media_type",
        "The body is not sent as JSON: `Content-Type: application/json` is required.",
        "send the body as JSON, with 'Content-Type: application/json'",
    ),
    422: ErrorDoc(
        "invalid_request",
        "A field of the body, or a path, query or header parameter, is invalid: each error names it.",
        [
            {
                "loc": ["body", "messages", 0, "role"],
                "msg": "Input should be 'user', 'assistant', 'system' or 'tool'",
                "type": "literal_error",
            }
        ],
        model=ValidationErrorOut,
    ),
    429: ErrorDoc(
        "too_many_requests",
        "Too many of something open at once on this server process: retry after Retry-After.",
        "1000 event streams are open on this server (MEMORY_EVENTS_MAX_STREAMS); retry later",
        headers={"Retry-After": _header("Seconds to wait before retrying.", {"type": "integer"})},
    ),
    431: ErrorDoc(
        "header_too_large",
        "The request line and headers are larger than 16 KiB.",
        "request head larger than 16384 bytes",
    ),
    500: ErrorDoc(
        "internal_error",
        "An unexpected error: its traceback is logged with the request id.",
        "internal error",
        model=InternalErrorOut,
    ),
    503: ErrorDoc(
        "unavailable",
        "The database is unavailable (restarting, unreachable, out of connections, a statement "
        "timed out): retry after Retry-After.",
        "database unavailable, retry shortly",
        headers={"Retry-After": _header("Seconds to wait before retrying.", {"type": "integer"})},
    ),
}

# What every operation can get, before its handler runs (app.edge) or from uvicorn: see
# edge_responses.
TOO_MANY_CONNECTIONS = (
    "Under `memory-service serve`, with MEMORY_MAX_CONNECTIONS connections open: plain text from uvicorn."
)
PLAIN_503 = {"text/plain": {"schema": {"type": "string"}, "example": "Service Unavailable"}}
# Appended to what a route says a status means: the edge's reason for it, true of every route.
_EDGE_NOTES = {413: ERRORS[413].description, 503: TOO_MANY_CONNECTIONS}


def _response(status: int, description: str | None = None, detail: Any = None) -> dict[str, Any]:
    doc = ERRORS[status]
    text = description or doc.description
    if status in _EDGE_NOTES and text != _EDGE_NOTES[status]:
        note = _EDGE_NOTES[status]
        text = f"{text} Or: {note[0].lower()}{note[1:]}"
    example = doc.example() if detail is None else {**doc.example(), "detail": detail}
    content: dict[str, Any] = {"application/json": {"example": example}}
    if status == 503:
        content |= PLAIN_503
    response: dict[str, Any] = {"model": doc.model, "description": text, "content": content}
    if doc.headers:
        response["headers"] = doc.headers
    return response


def errors(*answers: int | tuple[int, str] | tuple[int, str, Any]) -> Responses:
    """The error responses of an operation: a status, or (status, what it means here[, the
    example's detail])."""
    documented: Responses = {}
    for answer in answers:
        status, *specific = (answer,) if isinstance(answer, int) else answer
        documented[status] = _response(status, *specific)
    return documented


def edge_responses(*, api_keys: bool) -> Responses:
    """What any operation may answer whatever its handler does: a slow or oversized request,
    an unexpected error, too many connections, and, when keys are on, a 401. A route that
    documents one of these itself replaces it (its description keeps the edge's reason)."""
    documented = errors(408, 413, 431, 500)
    documented[503] = {"description": TOO_MANY_CONNECTIONS, "content": PLAIN_503}
    if api_keys:
        documented = errors(401) | documented
    return documented
