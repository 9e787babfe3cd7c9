"""Which tenants an ops query covers: one (a tenant's key), or all of them (the admin key)."""

from __future__ import annotations


def of_tenant(column: str, tenant_id: str | None) -> str:
    """The SQL condition on ``column`` (a tenant_id column) for ``tenant_id``, bound as
    ``:tenant_id``; None means every tenant. Spelled out rather than ``:tenant_id IS NULL OR``,
    so that a tenant's query keeps its plan."""
    return "TRUE" if tenant_id is None else f"{column} = :tenant_id"
