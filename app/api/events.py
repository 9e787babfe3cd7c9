"""Events of a conversation as Server-Sent Events (issue 9)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from app.api.deps import ConversationIdPath, TenantDep
from app.api.responses import errors
from app.events import EventHub

router = APIRouter(tags=["events"])

# Event ids are PostgreSQL bigints: a larger one could never match, and asyncpg refuses to send it.
MAX_EVENT_ID = 2**63 - 1

STREAM_EXAMPLE = (
    "retry: 1000\n: events of demo after 0\n\n"
    "id: 1\nevent: entry:added\n"
    'data: {"event_id": 1, "type": "entry:added", "created_at": "2026-11-23T10:00:00.120000+00:00", '
    '"data": {"sequence": 0, "round": 0, "type": "message", "role": "user", "tokens": 12, "name": null, '
    '"tool_call_id": null, "created_at": "2026-11-23T10:00:00.120000+00:00"}}\n\n'
    ": keepalive\n\n"
)


@router.get(
    "/conversations/{conversation_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "A text/event-stream that stays open: each event as `id`, `event` (its type) "
            "and one `data` line of JSON, and a `: keepalive` comment every "
            "MEMORY_EVENTS_HEARTBEAT_SECONDS.",
            "content": {"text/event-stream": {"schema": {"type": "string"}, "example": STREAM_EXAMPLE}},
        },
        **errors(
            422,
            503,
            (
                429,
                "MEMORY_EVENTS_MAX_STREAMS streams are open on this server process: retry later (or on "
                "another replica).",
                "1000 event streams are open on this server (MEMORY_EVENTS_MAX_STREAMS); retry later",
            ),
        ),
    },
)
async def stream_events(
    conversation_id: ConversationIdPath,
    request: Request,
    tenant: TenantDep,
    last_event_id: Annotated[
        int | None,
        Header(
            ge=0,
            le=MAX_EVENT_ID,
            description="Resume after this event id (browsers' EventSource sends it on reconnect).",
        ),
    ] = None,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=MAX_EVENT_ID,
            description="Resume after this event id (when the client cannot send Last-Event-ID).",
        ),
    ] = None,
) -> StreamingResponse:
    """The conversation's events, oldest first, each once and in order, then each new one as it
    is committed (on any replica): `entry:added`, `summary:started`, `summary:completed`,
    `compressed`, `summary:failed`, `session:cleared`, `conversation:deleted`,
    `conversation:imported`. Resumable: pass the
    last id seen as `Last-Event-ID` (or `?after=`; the header wins). Events are kept
    MEMORY_EVENTS_TTL_HOURS. A conversation not written yet streams nothing until it is."""
    hub: EventHub = request.app.state.hub
    hub.check_capacity()
    marked = await hub.mark(conversation_id)
    resume = last_event_id if last_event_id is not None else (after or 0)
    return StreamingResponse(
        hub.stream(conversation_id=conversation_id, tenant_id=tenant, after_id=resume, marked=marked),
        media_type="text/event-stream",
        # No proxy buffering (nginx), no caching: events must pass as they come.
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
