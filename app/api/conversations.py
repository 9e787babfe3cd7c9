"""Conversations and their messages."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status

from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep, TenantDep
from app.errors import PayloadTooLarge
from app.repositories.messages import NewMessage
from app.schemas import (
    CONVERSATION_ID_PATTERN,
    AppendMessagesIn,
    AppendMessagesOut,
    ConversationOut,
    ConversationsPageOut,
    CreateConversationIn,
    ErrorOut,
    MessagesPageOut,
    content_chars,
)

router = APIRouter(tags=["conversations"])


@router.post(
    "/conversations/{conversation_id}/messages",
    status_code=status.HTTP_201_CREATED,
    response_model=AppendMessagesOut,
    responses={
        409: {"model": ErrorOut, "description": "Idempotency-Key reused with another body"},
        413: {
            "model": ErrorOut,
            "description": "Too many messages, a message too long, or the conversation's metadata too large",
        },
    },
)
async def append_messages(
    conversation_id: ConversationIdPath,
    body: AppendMessagesIn,
    service: ServiceDep,
    settings: SettingsDep,
    tenant: TenantDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            pattern=r"^[\x21-\x7e]+$",
            description="Retrying a POST with the same key returns the original result.",
        ),
    ] = None,
) -> dict[str, Any]:
    """Store a round (usually a user and an assistant message) and maybe start a summary.
    Creates the conversation on first use, with the deployment's default policy."""
    if len(body.messages) > settings.MEMORY_MAX_MESSAGES_PER_REQUEST:
        raise PayloadTooLarge(
            f"at most {settings.MEMORY_MAX_MESSAGES_PER_REQUEST} messages per request, "
            f"got {len(body.messages)}"
        )
    for index, message in enumerate(body.messages):
        size = content_chars(message.content)
        if size > settings.MEMORY_MAX_MESSAGE_CHARS:
            raise PayloadTooLarge(
                f"messages[{index}].content has {size} characters; "
                f"the limit is {settings.MEMORY_MAX_MESSAGE_CHARS}"
            )
    result = await service.append_messages(
        tenant_id=tenant,
        conversation_id=conversation_id,
        items=[NewMessage(role=m.role, content=m.content, metadata=m.metadata) for m in body.messages],
        metadata=body.metadata,
        idempotency_key=idempotency_key,
    )
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return result.body


@router.post(
    "/conversations",
    status_code=status.HTTP_201_CREATED,
    response_model=ConversationOut,
    responses={
        409: {"model": ErrorOut, "description": "The conversation id is taken"},
        413: {"model": ErrorOut, "description": "Metadata too large"},
    },
)
async def create_conversation(
    body: CreateConversationIn, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Create a conversation with a memory policy (every parameter resolved in the answer)."""
    return await service.create_conversation(
        tenant_id=tenant,
        conversation_id=body.conversation_id,
        memory_policy=body.memory_policy,
        metadata=body.metadata,
    )


@router.get("/conversations/{conversation_id}/messages", response_model=MessagesPageOut)
async def list_messages(
    conversation_id: ConversationIdPath,
    service: ServiceDep,
    tenant: TenantDep,
    after_sequence: Annotated[int, Query(ge=-1, le=2**31 - 1)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Messages with sequence > after_sequence, oldest first: at most ``limit`` of them and
    MEMORY_MAX_PAGE_BYTES of content (always at least one)."""
    page, more = await service.list_messages(
        tenant_id=tenant,
        conversation_id=conversation_id,
        after_sequence=after_sequence,
        limit=limit,
    )
    return {
        "conversation_id": conversation_id,
        "messages": page,
        "next_after_sequence": page[-1]["sequence"] if more else None,
    }


@router.get("/conversations/{conversation_id}", response_model=ConversationOut)
async def get_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    return await service.get_conversation(tenant_id=tenant, conversation_id=conversation_id)


@router.delete("/conversations/{conversation_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> Response:
    """Delete the conversation, its messages and its memories."""
    await service.delete_conversation(tenant_id=tenant, conversation_id=conversation_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/conversations", response_model=ConversationsPageOut)
async def list_conversations(
    service: ServiceDep,
    tenant: TenantDep,
    after: Annotated[str | None, Query(pattern=CONVERSATION_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    include_metadata: Annotated[bool, Query(description="Include each conversation's metadata.")] = False,
) -> dict[str, Any]:
    """Conversations ordered by id; pass next_after as ``after`` for the next page. Metadata is
    null unless ``include_metadata`` is true, so a page stays small."""
    page = await service.list_conversations(
        tenant_id=tenant, after=after, limit=limit, include_metadata=include_metadata
    )
    return {
        "conversations": page,
        "next_after": page[-1]["conversation_id"] if len(page) == limit else None,
    }
