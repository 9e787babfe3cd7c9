"""Conversations and their messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response, status

from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep, TenantDep
from app.api.responses import errors
from app.errors import PayloadTooLarge
from app.repositories.messages import NewMessage
from app.schemas import (
    CONVERSATION_ID_PATTERN,
    AppendMessagesIn,
    AppendMessagesOut,
    ClearedOut,
    ConversationExport,
    ConversationOut,
    ConversationsPageOut,
    CreateConversationIn,
    EndConversationOut,
    ImportedOut,
    MemoryStarted,
    MessagesPageOut,
    StatsOut,
    UpdateConversationIn,
    content_chars,
)

router = APIRouter(tags=["conversations"])

REPLAYED = {
    "description": "`true` when this answers a retry with the same Idempotency-Key: nothing was stored.",
    "schema": {"type": "string", "const": "true"},
}


@router.post(
    "/conversations/{conversation_id}/messages",
    status_code=status.HTTP_201_CREATED,
    response_model=AppendMessagesOut,
    responses={
        201: {"headers": {"Idempotent-Replayed": REPLAYED}},
        **errors(
            400,
            (404, "The id is another tenant's conversation.", "conversation 'demo' not found"),
            (
                409,
                "The Idempotency-Key was used before with another body, or the conversation was "
                "ended (POST .../end) or archived: it is read-only.",
                "Idempotency-Key was already used with a different request body",
            ),
            (
                413,
                "Too many messages (MEMORY_MAX_MESSAGES_PER_REQUEST), a message too long "
                "(MEMORY_MAX_MESSAGE_CHARS), or the conversation's metadata too large.",
                "at most 100 messages per request (MEMORY_MAX_MESSAGES_PER_REQUEST)",
            ),
            415,
            422,
            503,
        ),
    },
)
async def append_messages(
    conversation_id: ConversationIdPath,
    body: AppendMessagesIn,
    service: ServiceDep,
    settings: SettingsDep,
    tenant: TenantDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            pattern=r"^[\x21-\x7e]+$",
            description="Retrying a POST with the same key returns the original result.",
        ),
    ] = None,
) -> Response:
    """Store a round (usually a user and an assistant message); `summary_due` says whether a
    summary of the conversation is now due (a runner starts it). Creates the conversation on
    first use, with the deployment's default policy."""
    if len(body.messages) > settings.MEMORY_MAX_MESSAGES_PER_REQUEST:
        raise PayloadTooLarge(
            f"at most {settings.MEMORY_MAX_MESSAGES_PER_REQUEST} messages per request, "
            f"got {len(body.messages)}"
        )
    for index, message in enumerate(body.messages):
        size = 0 if message.content is None else content_chars(message.content)
        if size > settings.MEMORY_MAX_MESSAGE_CHARS:
            raise PayloadTooLarge(
                f"messages[{index}].content has {size} characters; "
                f"the limit is {settings.MEMORY_MAX_MESSAGE_CHARS}"
            )
    result = await service.append_messages(
        tenant_id=tenant,
        conversation_id=conversation_id,
        items=[
            NewMessage(
                role=m.role,
                content=m.content,
                metadata=m.metadata,
                name=m.name,
                tool_calls=None if m.tool_calls is None else [c.model_dump() for c in m.tool_calls],
                tool_call_id=m.tool_call_id,
                source=m.source,
                kind=m.entry_type,
            )
            for m in body.messages
        ],
        metadata=body.metadata,
        idempotency_key=idempotency_key,
    )
    # The database built the body (app.repositories.rounds): sent as is.
    return Response(
        content=result.body,
        status_code=status.HTTP_201_CREATED,
        media_type="application/json",
        headers={"Idempotent-Replayed": "true"} if result.replayed else None,
    )


@router.post(
    "/conversations",
    status_code=status.HTTP_201_CREATED,
    response_model=ConversationOut,
    responses=errors(
        400,
        (409, "The id is taken (by this tenant or another).", "conversation 'trip-42' already exists"),
        (
            413,
            "The metadata is over MEMORY_MAX_METADATA_BYTES or MEMORY_MAX_METADATA_KEYS.",
            "the conversation's metadata would have 300 keys; the limit is 256 (MEMORY_MAX_METADATA_KEYS)",
        ),
        415,
        422,
        503,
    ),
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
        user_id=body.user_id,
    )


@router.post(
    "/conversations/{conversation_id}/end",
    response_model=EndConversationOut,
    responses=errors(
        404,
        (
            409,
            "The conversation is archived (restore it first).",
            "conversation 'trip-42' is archived; restore it with POST /ops/conversations/{id}/restore first",
        ),
        422,
        503,
    ),
)
async def end_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """End a session (seed 001): the conversation becomes read-only (a 409 on new messages), its
    policy starts a final summary (for recursive_summary one covering every message), and its
    user's cross-conversation summary is rebuilt. Ending it again changes nothing."""
    return await service.end_conversation(tenant_id=tenant, conversation_id=conversation_id)


@router.get(
    "/conversations/{conversation_id}/messages",
    response_model=MessagesPageOut,
    responses=errors(404, 422, 503),
)
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


@router.get(
    "/conversations/{conversation_id}",
    response_model=ConversationOut,
    responses=errors(404, 422, 503),
)
async def get_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    return await service.get_conversation(tenant_id=tenant, conversation_id=conversation_id)


@router.patch(
    "/conversations/{conversation_id}",
    response_model=ConversationOut,
    responses=errors(
        400,
        404,
        (
            409,
            "The body names another policy than the conversation's.",
            "the conversation's policy is 'sliding_window'; switching to 'token_budget' is not "
            "supported, as its summaries follow its own policy's rules: start a new conversation "
            "with that policy instead",
        ),
        415,
        422,
        503,
    ),
)
async def update_conversation(
    conversation_id: ConversationIdPath, body: UpdateConversationIn, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Change the parameters of the conversation's policy (seed 003's updateConfig), from its
    next round on; the ones not given keep their values."""
    return await service.update_policy(
        tenant_id=tenant, conversation_id=conversation_id, memory_policy=body.memory_policy
    )


@router.post(
    "/conversations/{conversation_id}/compress",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses=errors(
        404,
        (
            409,
            "A summary is already processing, or the policy has nothing to summarize now.",
            "nothing to compress: 3 active entries, of which the newest 10 stay and at least 5 older "
            "ones (whole tool exchanges) are needed",
        ),
        422,
        503,
    ),
)
async def compress(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Summarize now what the conversation's policy would (seed 003's manual compression: the
    uncompressed entries but the recent window); a runner starts it."""
    return await service.summarize_now(tenant_id=tenant, conversation_id=conversation_id)


@router.delete(
    "/conversations/{conversation_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=errors(404, 422, 503),
)
async def delete_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> Response:
    """Delete the conversation, its messages and its memories."""
    await service.delete_conversation(tenant_id=tenant, conversation_id=conversation_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/conversations", response_model=ConversationsPageOut, responses=errors(422, 503))
async def list_conversations(
    service: ServiceDep,
    tenant: TenantDep,
    after: Annotated[str | None, Query(pattern=CONVERSATION_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    include_metadata: Annotated[bool, Query(description="Include each conversation's metadata.")] = False,
    include_archived: Annotated[
        bool, Query(description="Include archived conversations (left out by default).")
    ] = False,
) -> dict[str, Any]:
    """Conversations ordered by id; pass next_after as ``after`` for the next page. Metadata is
    null unless ``include_metadata`` is true, so a page stays small. Archived conversations are
    left out unless ``include_archived`` is true."""
    page = await service.list_conversations(
        tenant_id=tenant,
        after=after,
        limit=limit,
        include_metadata=include_metadata,
        archived=None if include_archived else False,
    )
    return {
        "conversations": page,
        "next_after": page[-1]["conversation_id"] if len(page) == limit else None,
    }


# ---- stats, export and import, clearing (seed 003) ------------------------------------------------


@router.get(
    "/conversations/{conversation_id}/stats",
    response_model=StatsOut,
    responses=errors(404, 422, 503),
)
async def get_stats(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Seed 003's getStats for any policy: entries and tokens in all, compressed (up to the newest
    summary the context shows) and active (after it), the shown summaries and the tokens they
    save. Costs the same however long the conversation is."""
    return await service.stats(tenant_id=tenant, conversation_id=conversation_id)


# Seed 001's session markdown, as GET .../export?format=markdown answers it.
MARKDOWN_EXPORT_EXAMPLE = """# Session: 2026-04-01_100000

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

_EXPORT_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`json`: the export document. `markdown`: seed 001's session markdown "
        "(metadata, the last 10 messages, the summary).",
        "content": {"text/markdown": {"schema": {"type": "string"}, "example": MARKDOWN_EXPORT_EXAMPLE}},
    }
}


@router.get(
    "/conversations/{conversation_id}/export",
    response_model=ConversationExport,
    responses=_EXPORT_OK
    | errors(
        404,
        (
            413,
            "The conversation has more entries or memory rows than an import takes "
            "(MEMORY_MAX_IMPORT_ENTRIES; `json` only).",
            "the conversation has 60000 entries and 12 memory rows; an export holds at most 50000 of "
            "each (MEMORY_MAX_IMPORT_ENTRIES)",
        ),
        422,
        503,
    ),
)
async def export_conversation(
    conversation_id: ConversationIdPath,
    service: ServiceDep,
    tenant: TenantDep,
    format: Annotated[
        Literal["json", "markdown"],
        Query(
            description="`json`: the whole conversation as a document POST /conversations/import takes "
            "back; `markdown`: seed 001's session markdown, for people."
        ),
    ] = "json",
) -> Response:
    """The whole conversation (archived ones too) as one JSON document (seed 003's exportSession):
    its policy and metadata, every entry as posted with its round, type, tokens and time, and every
    memory row; POST /conversations/import takes it back. Or, with `format=markdown`, as seed 001's
    session markdown."""
    if format == "markdown":
        text = await service.export_markdown(tenant_id=tenant, conversation_id=conversation_id)
        return Response(content=text, media_type="text/markdown; charset=utf-8")
    body = await service.export_conversation(tenant_id=tenant, conversation_id=conversation_id)
    return Response(content=body, media_type="application/json")


@router.post(
    "/conversations/import",
    status_code=status.HTTP_201_CREATED,
    response_model=ImportedOut,
    responses=errors(
        400,
        (
            409,
            "The conversation id is taken (by this tenant or another).",
            "conversation 'demo' already exists",
        ),
        (
            413,
            "The document is over MEMORY_MAX_IMPORT_BYTES, has more entries or memory rows than "
            "MEMORY_MAX_IMPORT_ENTRIES, an entry longer than MEMORY_MAX_MESSAGE_CHARS, or metadata "
            "over the metadata limits.",
            "the document has 60000 entries; the limit is 50000 (MEMORY_MAX_IMPORT_ENTRIES)",
        ),
        415,
        (
            422,
            "A field is invalid, or the document contradicts itself (sequences with gaps, a memory "
            "range outside the entries, a tool result without its call, a base memory that does not "
            "exist, ...): each error names where.",
            [
                {
                    "loc": ["body", "entries", 4, "sequence"],
                    "msg": "entries must be numbered 0, 1, 2, ... in order, without gaps or repeats: "
                    "entry 4 has sequence 5",
                    "type": "value_error",
                }
            ],
        ),
        503,
    ),
)
async def import_conversation(
    body: ConversationExport,
    service: ServiceDep,
    tenant: TenantDep,
    conversation_id: Annotated[
        str | None,
        Query(pattern=CONVERSATION_ID_PATTERN, description="Import under this id (default: the document's)."),
    ] = None,
) -> dict[str, Any]:
    """Store an exported conversation (seed 003's importSession), in one transaction: entries keep
    their sequences, rounds, times and token counts, memory rows get new ids (their bases
    follow). Summaries that were in flight when it was exported are not imported: the policy is
    asked again, as after a round, and `summary_due` says whether a summary starts."""
    return await service.import_conversation(tenant_id=tenant, document=body, conversation_id=conversation_id)


@router.delete(
    "/conversations/{conversation_id}/messages",
    response_model=ClearedOut,
    responses=errors(
        404,
        (
            409,
            "The conversation was ended or is archived: read-only.",
            "conversation 'trip-42' was ended (POST .../end) and is read-only: start a new conversation",
        ),
        422,
        503,
    ),
)
async def clear_messages(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Seed 003's clearSession: delete every entry and memory row (a summary in flight is
    dropped, its result discarded) and start again from sequence and round 0, as a new
    conversation; the conversation, its policy and its metadata stay."""
    return await service.clear_messages(tenant_id=tenant, conversation_id=conversation_id)
