"""What an agent reads at the start of a round."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from app.api.deps import ConversationIdPath, ServiceDep, TenantDep
from app.schemas import ContextOut, MemoriesOut

router = APIRouter(tags=["context"])


@router.get("/conversations/{conversation_id}/context", response_model=ContextOut)
async def get_context(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> Response:
    """The latest completed memory plus every message after it (the gap). While a newer summary
    is processing, this is the previous completed one with a larger gap: never blocked, never
    missing a message."""
    # PostgreSQL builds the JSON (the hot read path); the response model documents its shape.
    body = await service.get_context_json(tenant_id=tenant, conversation_id=conversation_id)
    return Response(content=body, media_type="application/json")


@router.get("/conversations/{conversation_id}/memories", response_model=MemoriesOut)
async def list_memories(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """The version chain: every memory of the conversation, newest window first."""
    memories = await service.list_memories(tenant_id=tenant, conversation_id=conversation_id)
    return {"conversation_id": conversation_id, "memories": memories}
