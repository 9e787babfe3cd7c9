"""A tenant's webhooks (issue 12), and their dead letters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status

from app.api.deps import ConversationIdPath, ServiceDep, TenantDep
from app.api.responses import errors
from app.memory.service import MemoryService
from app.repositories.webhooks import MAX_PER_TENANT
from app.schemas import DeadDelivery, RetriedDelivery, WebhookCreated, WebhookIn, WebhookOut

router = APIRouter(tags=["webhooks"])

WebhookIdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The endpoint's id.")]
EventIdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The event's id in its conversation.")]


@router.post(
    "/webhooks",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookCreated,
    responses=errors(
        400,
        (
            409,
            f"The tenant has {MAX_PER_TENANT} webhooks already.",
            f"a tenant has at most {MAX_PER_TENANT} webhooks; delete one first",
        ),
        415,
        422,
        503,
    ),
)
async def create_webhook(body: WebhookIn, service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """POST every event of the tenant's conversations to `url`, signed (`Memory-Signature`, see
    the README), at least once, retried with backoff. The answer holds the signing secret: it is
    never shown again."""
    return await service.create_webhook(tenant_id=tenant, url=str(body.url))


@router.get("/webhooks", response_model=list[WebhookOut], responses=errors(503))
async def list_webhooks(service: ServiceDep, tenant: TenantDep) -> list[dict[str, Any]]:
    """The tenant's webhooks (without their secrets)."""
    return await service.list_webhooks(tenant_id=tenant)


@router.delete(
    "/webhooks/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404, 422, 503)
)
async def delete_webhook(webhook_id: WebhookIdPath, service: ServiceDep, tenant: TenantDep) -> Response:
    """Stop sending to this endpoint; its deliveries not yet made are dropped."""
    await service.delete_webhook(tenant_id=tenant, webhook_id=webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/ops/webhooks/dead", response_model=list[DeadDelivery], responses=errors(422, 503), tags=["ops"])
async def list_dead_deliveries(
    service: ServiceDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    """Deliveries that failed MEMORY_WEBHOOK_MAX_ATTEMPTS times (the dead letters), newest first."""
    return await service.dead_deliveries(tenant_id=tenant, limit=limit)


@router.post(
    "/ops/webhooks/{webhook_id}/deliveries/{conversation_id}/{event_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RetriedDelivery,
    responses=errors(
        404,
        (409, "The delivery is not dead (pending or delivered).", "the delivery is delivered, not dead"),
        422,
        503,
    ),
    tags=["ops"],
)
async def retry_delivery(
    webhook_id: WebhookIdPath,
    conversation_id: ConversationIdPath,
    event_id: EventIdPath,
    service: ServiceDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """Send a dead delivery again, now, with a fresh set of attempts."""
    return await retry(
        service, tenant, webhook_id=webhook_id, conversation_id=conversation_id, event_id=event_id
    )


async def retry(
    service: MemoryService, tenant: str | None, *, webhook_id: int, conversation_id: str, event_id: int
) -> dict[str, Any]:
    """Retry a dead delivery of the tenant (any, when None: the admin view); its RetriedDelivery."""
    await service.retry_delivery(
        tenant_id=tenant, webhook_id=webhook_id, conversation_id=conversation_id, event_id=event_id
    )
    return {
        "conversation_id": conversation_id,
        "event_id": event_id,
        "webhook_id": webhook_id,
        "status": "pending",
    }
