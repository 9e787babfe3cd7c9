"""The ops endpoints over every tenant, for operators holding the admin key (MEMORY_ADMIN_KEY):
the same queries as app.api.ops with each row's tenant. Served only when the key is set; app.edge
lets only that key through (a tenant's key gets a 403)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, status

from app.api import webhooks
from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep
from app.api.webhooks import EventIdPath, WebhookIdPath
from app.edge import ADMIN
from app.errors import Unauthorized
from app.schemas import (
    AdminDeadDelivery,
    AdminFailedMemory,
    AdminFailingConversation,
    AdminRunnerStats,
    AdminStuckMemory,
    AdminWindowRow,
    ErrorOut,
    GenerationStats,
    MemoriesOut,
    MemoryStarted,
    RetriedDelivery,
)


async def require_admin(request: Request) -> None:
    """The edge marked the request as the admin key's; refuse one that did not pass through it."""
    state = request.scope.get("state")
    if not (isinstance(state, dict) and state.get(ADMIN) is True):
        raise Unauthorized("this endpoint needs the admin key (MEMORY_ADMIN_KEY)")


router = APIRouter(
    prefix="/admin/ops",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses={
        401: {"model": ErrorOut, "description": "Missing or invalid key"},
        403: {"model": ErrorOut, "description": "A tenant's key: the admin view needs MEMORY_ADMIN_KEY"},
        404: {"model": ErrorOut, "description": "Unknown conversation or memory"},
        503: {"model": ErrorOut, "description": "Database unavailable; retry"},
    },
)

# Every tenant.
ALL = None


@router.get("/conversations/{conversation_id}/memory-chain", response_model=MemoriesOut)
async def admin_memory_chain(conversation_id: ConversationIdPath, service: ServiceDep) -> dict[str, Any]:
    """Any tenant's memory history with its version chain."""
    memories = await service.list_memories(tenant_id=ALL, conversation_id=conversation_id)
    return {"conversation_id": conversation_id, "memories": memories}


@router.get("/memories/stuck", response_model=list[AdminStuckMemory])
async def admin_stuck_memories(
    service: ServiceDep,
    settings: SettingsDep,
    older_than_seconds: Annotated[float | None, Query(ge=0, le=10**7)] = None,
) -> list[dict[str, Any]]:
    """Every tenant's 'processing' rows older than the given age (default
    MEMORY_PROCESSING_TIMEOUT_SECONDS)."""
    age = settings.MEMORY_PROCESSING_TIMEOUT_SECONDS if older_than_seconds is None else older_than_seconds
    return await service.stuck(tenant_id=ALL, older_than_seconds=age)


@router.get("/memories/failed", response_model=list[AdminFailedMemory])
async def admin_failed_memories(
    service: ServiceDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """The newest failed summaries of every tenant."""
    return await service.failures(tenant_id=ALL, limit=limit)


@router.get("/conversations/failing", response_model=list[AdminFailingConversation])
async def admin_failing_conversations(
    service: ServiceDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """Every tenant's conversations whose summaries keep failing."""
    return await service.failing_conversations(tenant_id=ALL, limit=limit)


@router.get("/memories/window-progression", response_model=list[AdminWindowRow])
async def admin_window_progression(
    service: ServiceDep, limit: Annotated[int, Query(ge=1, le=1000)] = 20
) -> list[dict[str, Any]]:
    """The newest completed windows of every tenant."""
    return await service.window_progression(tenant_id=ALL, limit=limit)


@router.get("/memories/generation-stats", response_model=GenerationStats)
async def admin_generation_stats(service: ServiceDep) -> dict[str, Any]:
    """Summarization time over every tenant's completed memories."""
    return await service.generation_stats(tenant_id=ALL)


@router.post(
    "/memories/{memory_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses={409: {"model": ErrorOut, "description": "Another summary is processing"}},
)
async def admin_retry_memory(
    memory_id: Annotated[int, Path(ge=1, le=2**31 - 1)], service: ServiceDep
) -> dict[str, Any]:
    """Run any tenant's failed memory again over the same window."""
    return await service.retry_memory(tenant_id=ALL, memory_id=memory_id)


@router.post(
    "/conversations/{conversation_id}/summarize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MemoryStarted,
    responses={409: {"model": ErrorOut, "description": "A summary is running or nothing is new"}},
)
async def admin_summarize_now(conversation_id: ConversationIdPath, service: ServiceDep) -> dict[str, Any]:
    """Queue the summary the policy would make now, for any tenant's conversation."""
    return await service.summarize_now(tenant_id=ALL, conversation_id=conversation_id)


@router.get("/runner", response_model=AdminRunnerStats)
async def admin_runner_stats(service: ServiceDep) -> dict[str, Any]:
    """Summary work across every replica and worker, in all and per tenant, and this replica's
    runner and circuit breaker."""
    tenants = await service.summary_loads_by_tenant()
    waited = [t["oldest_due_seconds"] for t in tenants if t["oldest_due_seconds"] is not None]
    breaker = service.breaker
    runner = service.runner
    return {
        "running": sum(t["running"] for t in tenants),
        "queued": sum(t["queued"] for t in tenants),
        "due": sum(t["due"] for t in tenants),
        "oldest_due_seconds": max(waited, default=None),
        "tenants": tenants,
        "runs_summaries": runner.accepting,
        "max_concurrent": runner.max_concurrent,
        "llm_circuit": breaker.state.value,
        "llm_consecutive_failures": breaker.consecutive_failures,
        "llm_circuit_retry_in_seconds": round(breaker.retry_in_seconds, 3),
    }


@router.get("/webhooks/dead", response_model=list[AdminDeadDelivery])
async def admin_dead_deliveries(
    service: ServiceDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """The newest dead webhook deliveries of every tenant."""
    return await service.dead_deliveries(tenant_id=ALL, limit=limit)


@router.post(
    "/webhooks/{webhook_id}/deliveries/{conversation_id}/{event_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RetriedDelivery,
    responses={409: {"model": ErrorOut, "description": "The delivery is not dead (pending or delivered)."}},
)
async def admin_retry_delivery(
    webhook_id: WebhookIdPath,
    conversation_id: ConversationIdPath,
    event_id: EventIdPath,
    service: ServiceDep,
) -> dict[str, Any]:
    """Send any tenant's dead delivery again, now, with a fresh set of attempts."""
    return await webhooks.retry(
        service, ALL, webhook_id=webhook_id, conversation_id=conversation_id, event_id=event_id
    )
