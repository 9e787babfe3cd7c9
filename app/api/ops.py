"""Operations: seed 004's observability queries, failures, retries and the runner's load."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep, TenantDep
from app.schemas import (
    ErrorOut,
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


@router.get("/conversations/{conversation_id}/memory-chain", response_model=MemoriesOut)
async def memory_chain(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Memory history with its version chain (base_end_seq = the base memory's end)."""
    memories = await service.list_memories(tenant_id=tenant, conversation_id=conversation_id)
    return {"conversation_id": conversation_id, "memories": memories}


@router.get("/memories/stuck", response_model=list[StuckMemory])
async def stuck_memories(
    service: ServiceDep,
    settings: SettingsDep,
    tenant: TenantDep,
    older_than_seconds: Annotated[float | None, Query(ge=0, le=10**7)] = None,
) -> list[dict[str, Any]]:
    """'processing' rows older than the given age (default MEMORY_PROCESSING_TIMEOUT_SECONDS)."""
    age = settings.MEMORY_PROCESSING_TIMEOUT_SECONDS if older_than_seconds is None else older_than_seconds
    return await service.stuck(tenant_id=tenant, older_than_seconds=age)


@router.get("/memories/failed", response_model=list[FailedMemory])
async def failed_memories(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """The newest failed summaries with their reasons."""
    return await service.failures(tenant_id=tenant, limit=limit)


@router.get("/conversations/failing", response_model=list[FailingConversation])
async def failing_conversations(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """Conversations whose summaries keep failing, with their backoff and last error."""
    return await service.failing_conversations(tenant_id=tenant, limit=limit)


@router.get("/memories/window-progression", response_model=list[WindowRow])
async def window_progression(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 20
) -> list[dict[str, Any]]:
    """The newest completed windows and their sizes."""
    return await service.window_progression(tenant_id=tenant, limit=limit)


@router.get("/memories/generation-stats", response_model=GenerationStats)
async def generation_stats(service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """Summarization time over all completed memories."""
    return await service.generation_stats(tenant_id=tenant)


@router.post(
    "/memories/{memory_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses={409: {"model": ErrorOut, "description": "Another summary is processing"}},
)
async def retry_memory(
    memory_id: Annotated[int, Path(ge=1, le=2**31 - 1)], service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Run a failed memory again over the same window; 409 while another one is processing."""
    return await service.retry_memory(tenant_id=tenant, memory_id=memory_id)


@router.post(
    "/conversations/{conversation_id}/summarize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses={409: {"model": ErrorOut, "description": "A summary is running or nothing is new"}},
)
async def summarize_now(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """Start a summary now over the window ending at the newest message."""
    return await service.summarize_now(tenant_id=tenant, conversation_id=conversation_id)


@router.get("/runner", response_model=RunnerStats)
async def runner_stats(service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """This replica's background summaries (running, waiting for a slot, the caps) and the state
    of its circuit breaker for the model."""
    runner = service.runner
    breaker = service.breaker
    return {
        "accepting": runner.accepting,
        "llm_circuit": breaker.state.value,
        "llm_consecutive_failures": breaker.consecutive_failures,
        "llm_circuit_retry_in_seconds": round(breaker.retry_in_seconds, 3),
        "running": runner.running,
        "waiting": runner.waiting,
        "max_concurrent": runner.max_concurrent,
        "max_pending": runner.max_pending,
    }
