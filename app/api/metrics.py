"""Prometheus metrics of the whole service (every worker process of this `serve`): who may read
them is decided by app.edge (MEMORY_METRICS_PUBLIC, else the admin key)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app import metrics
from app.api.deps import ServiceDep

router = APIRouter(tags=["metrics"])


@router.get(metrics.METRICS_PATH, include_in_schema=False)
async def get_metrics(service: ServiceDep) -> Response:
    """Prometheus text format (app.metrics lists what is counted)."""
    return Response(content=await metrics.render(service), media_type=metrics.CONTENT_TYPE)
