"""A user's memory across conversations (seed 001's cross-conversational summary)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.api.deps import ServiceDep, TenantDep
from app.api.responses import errors
from app.schemas import USER_ID_PATTERN, UserContextOut, UserMemoriesOut

router = APIRouter(tags=["users"])

UserIdPath = Annotated[
    str,
    Path(
        pattern=USER_ID_PATTERN,
        description="1-64 characters: letters, digits and . _ : @ - (not starting with a symbol).",
        examples=["ana"],
    ),
]


@router.get(
    "/users/{user_id}/context",
    response_model=UserContextOut,
    responses=errors(
        (404, "No conversation of this tenant names this user.", "user 'ana' not found"), 422, 503
    ),
)
async def get_user_context(user_id: UserIdPath, service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """The user's latest completed cross-conversation summary, built in the background from
    their last 5 conversations whenever one ends or its summary advances; while a newer one is
    being built, this one is served, and `freshness` says so."""
    return await service.user_context(tenant_id=tenant, user_id=user_id)


@router.get(
    "/users/{user_id}/memories",
    response_model=UserMemoriesOut,
    responses=errors(
        (404, "No conversation of this tenant names this user.", "user 'ana' not found"), 422, 503
    ),
)
async def list_user_memories(user_id: UserIdPath, service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """Every version of the user's cross-conversation summary, newest first (the chain)."""
    return {"user_id": user_id, "memories": await service.user_memories(tenant_id=tenant, user_id=user_id)}
