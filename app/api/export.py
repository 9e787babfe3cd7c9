"""A conversation exported as seed 001's session markdown (GET .../export?format=markdown)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from app.api.deps import ConversationIdPath, ServiceDep, TenantDep
from app.api.responses import errors

router = APIRouter(tags=["conversations"])

MARKDOWN_EXAMPLE = """# Session: 2026-04-01_100000

## Metadata
- Conversation: session-7
- Start: 2026-04-01T10:00:00Z
- End: 2026-04-01T11:00:00Z
- Message Count: 24
- Summary Version: 3

## Short-Term Messages (Last 10)
**Message 15 (User):** I've been thinking about what we discussed...
**Message 16 (Assistant):** That's wonderful that you're reflecting...

## Medium-Term Summary
# Medium-Term Memory
...
"""


@router.get(
    "/conversations/{conversation_id}/export",
    response_class=Response,
    responses={
        200: {
            "description": "Seed 001's session markdown: metadata, the last 10 messages, the summary.",
            "content": {"text/markdown": {"schema": {"type": "string"}, "example": MARKDOWN_EXAMPLE}},
        },
        **errors(404, 422, 503),
    },
)
async def export_conversation(
    conversation_id: ConversationIdPath,
    service: ServiceDep,
    tenant: TenantDep,
    format: Annotated[
        Literal["markdown"],
        Query(description="`markdown`: seed 001's session markdown (the only format this route serves)."),
    ] = "markdown",
) -> Response:
    """A conversation (archived ones too) as seed 001's session markdown."""
    text = await service.export_markdown(tenant_id=tenant, conversation_id=conversation_id)
    return Response(content=text, media_type="text/markdown; charset=utf-8")
