"""Shared dependencies, declared once as Annotated aliases.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool,
which costs a thread hand-off per request for what is an attribute lookup."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Path, Request

from app.errors import Unauthorized
from app.memory.service import MemoryService
from app.schemas import CONVERSATION_ID_PATTERN
from app.settings import Settings

DEFAULT_TENANT = "default"


async def get_service(request: Request) -> MemoryService:
    service: MemoryService = request.app.state.service
    return service


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


async def get_tenant(request: Request) -> str:
    """The caller's tenant. With MEMORY_API_KEYS unset every caller is the default tenant.

    Reads the headers itself rather than through header parameters: this runs on every request,
    and the keys are documented in the README (they are not part of any operation's schema).
    """
    keys: dict[bytes, str] = request.app.state.api_key_digests
    if not keys:
        return DEFAULT_TENANT
    presented = request.headers.get("x-api-key")
    authorization = request.headers.get("authorization")
    if presented is None and authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer":
            presented = token.strip()
    if not presented:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'")
    digest = _digest(presented)
    tenant = None
    # Compare against every key in constant time, so timing reveals neither key nor position.
    for candidate, owner in keys.items():
        if hmac.compare_digest(candidate, digest):
            tenant = owner
    if tenant is None:
        raise Unauthorized("invalid API key")
    return tenant


def api_key_digests(settings: Settings) -> dict[bytes, str]:
    """Keys are held only as SHA-256 digests once parsed."""
    return {_digest(key): tenant for key, tenant in settings.api_keys.items()}


ServiceDep = Annotated[MemoryService, Depends(get_service)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
TenantDep = Annotated[str, Depends(get_tenant)]
ConversationIdPath = Annotated[
    str,
    Path(
        pattern=CONVERSATION_ID_PATTERN,
        description="1-50 characters: letters, digits and . _ : - (not starting with a symbol).",
    ),
]
