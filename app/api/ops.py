"""Operations: seed 004's observability queries, failures, retries and the runner's load."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep, TenantDep
from app.api.responses import errors
from app.schemas import (
    CONVERSATION_ID_PATTERN,
    ConversationOut,
    ConversationsPageOut,
    FailedMemory,
    FailingConversation,
    GenerationStats,
    MemoriesOut,
    MemoryStarted,
    RunnerStats,
    StuckMemory,
    WindowRow,
)

router = APIRouter(prefix="/ops", tags=["ops"])


@router.get(
    "/conversations/{conversation_id}/memory-chain",
    response_model=MemoriesOut,
    responses=errors(404, 422, 503),
)
async def get_memory_chain(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Memory history with its version chain (base_end_seq = the base memory's end)."""
    memories = await service.list_memories(tenant_id=tenant, conversation_id=conversation_id)
    return {"conversation_id": conversation_id, "memories": memories}


@router.get("/conversations/archived", response_model=ConversationsPageOut, responses=errors(422, 503))
async def list_archived_conversations(
    service: ServiceDep,
    tenant: TenantDep,
    after: Annotated[str | None, Query(pattern=CONVERSATION_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Archived conversations (no new message for MEMORY_ARCHIVE_AFTER_DAYS), ordered by id;
    pass next_after as ``after`` for the next page."""
    page = await service.list_conversations(
        tenant_id=tenant, after=after, limit=limit, include_metadata=False, archived=True
    )
    return {
        "conversations": page,
        "next_after": page[-1]["conversation_id"] if len(page) == limit else None,
    }


@router.post(
    "/conversations/{conversation_id}/restore",
    response_model=ConversationOut,
    responses=errors(
        404, (409, "The conversation is not archived.", "conversation 'trip-42' is not archived"), 422, 503
    ),
)
async def restore_conversation(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Restore an archived conversation: it takes new messages again, and is archived again
    only after MEMORY_ARCHIVE_AFTER_DAYS from now with no new message."""
    return await service.restore_conversation(tenant_id=tenant, conversation_id=conversation_id)


@router.get("/memories/stuck", response_model=list[StuckMemory], responses=errors(422, 503))
async def list_stuck_memories(
    service: ServiceDep,
    settings: SettingsDep,
    tenant: TenantDep,
    older_than_seconds: Annotated[float | None, Query(ge=0, le=10**7)] = None,
) -> list[dict[str, Any]]:
    """'processing' rows older than the given age (default MEMORY_PROCESSING_TIMEOUT_SECONDS)."""
    age = settings.MEMORY_PROCESSING_TIMEOUT_SECONDS if older_than_seconds is None else older_than_seconds
    return await service.stuck(tenant_id=tenant, older_than_seconds=age)


@router.get("/memories/failed", response_model=list[FailedMemory], responses=errors(422, 503))
async def list_failed_memories(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """The newest failed summaries with their reasons."""
    return await service.failures(tenant_id=tenant, limit=limit)


@router.get("/conversations/failing", response_model=list[FailingConversation], responses=errors(422, 503))
async def list_failing_conversations(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """Conversations whose summaries keep failing, with their backoff and last error."""
    return await service.failing_conversations(tenant_id=tenant, limit=limit)


@router.get("/memories/window-progression", response_model=list[WindowRow], responses=errors(422, 503))
async def get_window_progression(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 20
) -> list[dict[str, Any]]:
    """The newest completed windows and their sizes."""
    return await service.window_progression(tenant_id=tenant, limit=limit)


@router.get("/memories/generation-stats", response_model=GenerationStats, responses=errors(503))
async def get_generation_stats(service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """Summarization time over all completed memories."""
    return await service.generation_stats(tenant_id=tenant)


@router.post(
    "/memories/{memory_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses=errors(
        (404, "No such memory for this tenant.", "memory 7 not found"),
        (
            409,
            "The memory is not failed, another summary of its conversation is processing, or the "
            "summary queue is full.",
            "a summary is already processing for this conversation",
        ),
        422,
        503,
    ),
)
async def retry_memory(
    memory_id: Annotated[int, Path(ge=1, le=2**31 - 1, examples=[1])], service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Run a failed memory again over the same window; 409 while another one is processing."""
    return await service.retry_memory(tenant_id=tenant, memory_id=memory_id)


@router.post(
    "/conversations/{conversation_id}/summarize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses=errors(
        404,
        (
            409,
            "A summary is already processing, or the policy has nothing to summarize.",
            "nothing new to summarize: the latest memory covers every message",
        ),
        422,
        503,
    ),
)
async def summarize_now(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Start a summary now over the window ending at the newest message."""
    return await service.summarize_now(tenant_id=tenant, conversation_id=conversation_id)


@router.get("/runner", response_model=RunnerStats)
async def get_runner_stats(service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """Your summary work across every replica and worker (running, queued, due), and this
    replica's runner: whether it runs summaries, its slots, its circuit breaker for the model."""
    breaker = service.breaker
    runner = service.runner
    return {
        **await service.summary_load(tenant_id=tenant),
        "runs_summaries": runner.accepting,
        "max_concurrent": runner.max_concurrent,
        "llm_circuit": breaker.state.value,
        "llm_consecutive_failures": breaker.consecutive_failures,
        "llm_circuit_retry_in_seconds": round(breaker.retry_in_seconds, 3),
    }
