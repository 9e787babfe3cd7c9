"""The admin view (MEMORY_ADMIN_KEY): the ops endpoints over every tenant, each row with its
tenant; a tenant's key sees its own and gets a 403 there; without the setting there is none."""

from __future__ import annotations

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import AppFactory, eventually

ACME = "acme-key-0123456789"
BETA = "beta-key-0123456789"
ADMIN = "admin-key-0123456789"


async def test_the_admin_key_sees_every_tenant_and_a_tenant_key_its_own(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(
        MEMORY_API_KEYS=f"acme:{ACME},beta:{BETA}", MEMORY_ADMIN_KEY=ADMIN, MEMORY_LLM_BREAKER_FAILURES=10
    )
    llm.fail_next(2, status=500)
    for key, cid in ((ACME, "acme-1"), (BETA, "beta-1")):
        for n in range(3):
            await api.post_round(cid, n, headers={"X-API-Key": key})
        await api.idle()
    admin = {"X-API-Key": ADMIN}

    failed = (await api.client.get("/admin/ops/memories/failed", headers=admin)).json()
    assert sorted((f["tenant_id"], f["conversation_id"]) for f in failed) == [
        ("acme", "acme-1"),
        ("beta", "beta-1"),
    ]
    for key, tenant in ((ACME, "acme"), (BETA, "beta")):
        own = (await api.client.get("/ops/memories/failed", headers={"X-API-Key": key})).json()
        assert [f["conversation_id"] for f in own] == [f"{tenant}-1"]
        assert "tenant_id" not in own[0]
        # The admin view is not a tenant's.
        refused = await api.client.get("/admin/ops/memories/failed", headers={"X-API-Key": key})
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert (await api.client.get("/admin/ops/memories/failed")).status_code == 401

    failing = (await api.client.get("/admin/ops/conversations/failing", headers=admin)).json()
    assert sorted(f["tenant_id"] for f in failing) == ["acme", "beta"]

    # The admin retries beta's failed summary; both chains are visible to it.
    beta_memory = next(f["memory_id"] for f in failed if f["tenant_id"] == "beta")
    retried = await api.client.post(f"/admin/ops/memories/{beta_memory}/retry", headers=admin)
    assert retried.status_code == 202, retried.text
    await api.idle()
    chain = (await api.client.get("/admin/ops/conversations/beta-1/memory-chain", headers=admin)).json()
    assert [m["status"] for m in chain["memories"]] == ["completed"]
    # ... which acme's key cannot do.
    other = await api.client.get("/ops/conversations/beta-1/memory-chain", headers={"X-API-Key": ACME})
    assert other.status_code == 404

    windows = (await api.client.get("/admin/ops/memories/window-progression", headers=admin)).json()
    assert [(w["tenant_id"], w["conversation_id"]) for w in windows] == [("beta", "beta-1")]
    stats = (await api.client.get("/admin/ops/memories/generation-stats", headers=admin)).json()
    assert stats["total_summaries"] == 1

    # Work across tenants: an admin asks for acme's summary; while it runs, the admin sees it.
    llm.hold = True
    summarized = await api.client.post("/admin/ops/conversations/acme-1/summarize", headers=admin)
    assert summarized.status_code == 202, summarized.text
    await eventually(lambda: _has_calls(llm, 4), what="the queued summary's call")
    runner = (await api.client.get("/admin/ops/runner", headers=admin)).json()
    assert runner["running"] == 1
    assert {t["tenant_id"]: t["running"] for t in runner["tenants"]} == {"acme": 1}
    own = (await api.client.get("/ops/runner", headers={"X-API-Key": BETA})).json()
    assert own["running"] == 0
    stuck = (await api.client.get("/admin/ops/memories/stuck?older_than_seconds=0", headers=admin)).json()
    assert [(s["tenant_id"], s["conversation_id"]) for s in stuck] == [("acme", "acme-1")]
    assert (
        await api.client.get("/ops/memories/stuck?older_than_seconds=0", headers={"X-API-Key": BETA})
    ).json() == []
    llm.hold = False
    llm.release_all()
    await api.idle()


async def _has_calls(llm: FakeLLM, count: int) -> bool:
    return len(llm.calls) >= count


async def test_without_an_admin_key_there_is_no_admin_view(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_API_KEYS=f"acme:{ACME}")
    response = await api.client.get("/admin/ops/memories/failed", headers={"X-API-Key": ACME})
    assert response.status_code == 404


async def test_the_admin_key_is_no_tenant_key(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_API_KEYS=f"acme:{ACME}", MEMORY_ADMIN_KEY=ADMIN)
    response = await api.client.get("/conversations", headers={"X-API-Key": ADMIN})
    assert response.status_code == 401
