"""Shared dependencies, declared once as Annotated aliases.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool,
which costs a thread hand-off per request for what is an attribute lookup."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.edge import TENANT
from app.errors import Unauthorized
from app.memory.service import MemoryService
from app.schemas import CONVERSATION_ID_PATTERN
from app.settings import Settings


async def get_service(request: Request) -> MemoryService:
    service: MemoryService = request.app.state.service
    return service


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_tenant(request: Request) -> str:
    """The caller's tenant, as EdgeMiddleware authenticated it before the body was read (the
    default tenant when MEMORY_API_KEYS is unset). No tenant means the request did not pass
    through it: refuse rather than guess."""
    state = request.scope.get("state")
    tenant = state.get(TENANT) if isinstance(state, dict) else None
    if not isinstance(tenant, str):
        raise Unauthorized("request not authenticated")
    return tenant


ServiceDep = Annotated[MemoryService, Depends(get_service)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
TenantDep = Annotated[str, Depends(get_tenant)]
ConversationIdPath = Annotated[
    str,
    Path(
        pattern=CONVERSATION_ID_PATTERN,
        description="1-50 characters: letters, digits and . _ : - (not starting with a symbol).",
        examples=["demo"],
    ),
]
