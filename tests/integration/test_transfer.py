"""Stats, export and import, and clearing (seed 003's getStats, exportSession, importSession and
clearSession) over HTTP, for every policy, against real PostgreSQL and the fake model."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from sqlalchemy import text

from app.repositories.memory import STATS_SQL
from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory
from tests.integration.test_cli import run

POLICIES: dict[str, dict[str, Any]] = {
    "sliding_window": {"name": "sliding_window", "window_size": 4, "summarize_after_seq": 3},
    "rolling_blocks": {"name": "rolling_blocks", "window": 2, "max_summaries": 2},
    "token_budget": {
        "name": "token_budget",
        "max_entries": 6,
        "recent_window": 2,
        "min_entries_to_compress": 2,
    },
    "recursive_summary": {
        "name": "recursive_summary",
        "short_term": 4,
        "update_every": 3,
        "max_summary_tokens": 5000,
        "target_min_tokens": 10,
        "target_max_tokens": 40,
    },
}


def round_messages(n: int) -> list[dict[str, Any]]:
    """Round n: every third one an agent's exchange with two parallel tool calls, the others a
    question and an answer, some with JSON content and labels."""
    if n % 3 == 2:
        calls = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": "lookup", "arguments": f'{{"q": {i}}}'},
            }
            for i in (1, 2)
        ]
        return [
            {"role": "user", "content": f"Look up two things for step {n}."},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"call_{n}_2", "content": "second: ok"},
            {"role": "tool", "tool_call_id": f"call_{n}_1", "content": "first: error, retried"},
            {"role": "assistant", "content": f"Both found for step {n}."},
        ]
    return [
        {"role": "user", "content": f"Question {n}: what about topic {n}?", "metadata": {"n": n}},
        {"role": "assistant", "content": {"answer": f"Topic {n}", "score": 0.5, "tags": ["a", n]}},
    ]


async def post_round(api: App, cid: str, n: int) -> None:
    response = await api.client.post(f"/conversations/{cid}/messages", json={"messages": round_messages(n)})
    assert response.status_code == 201, response.text


async def build(api: App, cid: str, policy: str, rounds: int = 9) -> None:
    response = await api.client.post(
        "/conversations",
        json={"conversation_id": cid, "memory_policy": POLICIES[policy], "metadata": {"user": "ana", "n": 1}},
    )
    assert response.status_code == 201, response.text
    for n in range(rounds):
        await post_round(api, cid, n)
        await api.idle()


async def export(api: App, cid: str) -> dict[str, Any]:
    response = await api.client.get(f"/conversations/{cid}/export")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def without_ids(document: dict[str, Any]) -> dict[str, Any]:
    """The document with its conversation id left out and memory ids replaced by their rank."""
    doc = copy.deepcopy(document)
    del doc["conversation"]["conversation_id"]
    rank = {m["memory_id"]: i for i, m in enumerate(doc["memories"])}
    for m in doc["memories"]:
        m["memory_id"] = rank[m["memory_id"]]
        m["base_memory_id"] = None if m["base_memory_id"] is None else rank[m["base_memory_id"]]
    return doc


def shape(document: dict[str, Any]) -> dict[str, Any]:
    """What the memory engine made of a conversation, times aside."""
    rank = {m["memory_id"]: i for i, m in enumerate(document["memories"])}
    return {
        "entries": [(e["sequence"], e["round"], e["type"], e["content"]) for e in document["entries"]],
        "memories": [
            (
                m["kind"],
                m["status"],
                m["start_sequence"],
                m["end_sequence"],
                rank.get(m["base_memory_id"]),
                m["text"],
            )
            for m in document["memories"]
        ],
    }


async def import_doc(api: App, document: dict[str, Any], cid: str | None = None) -> dict[str, Any]:
    params = {} if cid is None else {"conversation_id": cid}
    response = await api.client.post("/conversations/import", json=document, params=params)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("policy", list(POLICIES))
async def test_export_import_export_is_the_same_document(api: App, llm: FakeLLM, policy: str) -> None:
    await build(api, "original", policy)
    first = await export(api, "original")
    assert any(m["status"] == "completed" for m in first["memories"])
    assert any(e["type"] == "tool_call" for e in first["entries"])
    assert first["conversation"]["memory_policy"]["name"] == policy

    imported = await import_doc(api, first, "copy")
    assert imported == {
        "conversation_id": "copy",
        "entries": len(first["entries"]),
        "memories": len(first["memories"]),
        "dropped_processing": 0,
        "summary_due": False,
    }
    second = await export(api, "copy")
    assert second["conversation"]["conversation_id"] == "copy"
    assert without_ids(second) == without_ids(first)
    assert second["entries"] == first["entries"]  # content as posted, times and tokens kept
    # So is the time of the last message (listings and archiving go by it), not the import's.
    listed = {
        c: (await api.client.get(f"/conversations/{c}")).json()["last_message_at"]
        for c in ("original", "copy")
    }
    assert listed["copy"] == listed["original"]
    # The copy's context is the original's.
    contexts = [(await api.client.get(f"/conversations/{c}/context")).json() for c in ("original", "copy")]
    for context in contexts:
        del context["conversation_id"]
        for summary in context["summaries"]:
            del summary["memory_id"], summary["base_memory_id"]
        context["memory"] = None
    assert contexts[0] == contexts[1]

    # Under its own id again (the original deleted first), then once more: still the same.
    assert (await api.client.delete("/conversations/original")).status_code == 204
    await import_doc(api, second, "original")
    assert without_ids(await export(api, "original")) == without_ids(first)

    # The engine carries on: the same rounds give both the same summaries.
    for n in range(9, 16):
        for cid in ("original", "copy"):
            await post_round(api, cid, n)
            await api.idle()
    after = [shape(await export(api, cid)) for cid in ("original", "copy")]
    assert after[0] == after[1]
    assert len(after[0]["memories"]) > len(first["memories"])


async def test_an_ended_conversation_of_a_user_imports_ended_and_of_that_user(
    api: App, db: asyncpg.Connection
) -> None:
    created = await api.client.post(
        "/conversations",
        json={"conversation_id": "s1", "memory_policy": POLICIES["recursive_summary"], "user_id": "ana"},
    )
    assert created.status_code == 201, created.text
    for n in range(6):
        await post_round(api, "s1", n)
        await api.idle()
    assert (await api.client.post("/conversations/s1/end")).status_code == 200
    await api.idle()
    first = await export(api, "s1")
    assert first["conversation"]["user_id"] == "ana" and first["conversation"]["ended_at"] is not None

    await import_doc(api, first, "s1-copy")
    second = await export(api, "s1-copy")
    assert without_ids(second) == without_ids(first)
    refused = await api.client.post("/conversations/s1-copy/messages", json={"messages": round_messages(9)})
    assert refused.status_code == 409 and "ended" in refused.json()["detail"]
    caps = await db.fetch(
        "SELECT conversation_id, context_max_summary_tokens FROM conversations ORDER BY conversation_id"
    )
    assert [tuple(r) for r in caps] == [("s1", 5000), ("s1-copy", 5000)]
    imported = await db.fetch(
        "SELECT type, data::text AS data FROM events WHERE conversation_id = 's1-copy' ORDER BY event_id"
    )
    assert [(r["type"], orjson.loads(r["data"])) for r in imported] == [
        ("conversation:imported", {"entries": len(first["entries"]), "memories": len(first["memories"])})
    ]
    # The user's cross-conversation summary takes the copy in.
    await api.idle()
    user = (await api.client.get("/users/ana/context")).json()
    sources = {s["conversation_id"] for s in user["summary"]["sources"]}
    assert sources == {"s1", "s1-copy"}


async def test_a_summary_in_flight_is_not_imported_and_is_planned_again(
    api: App, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    await build(api, "busy", "token_budget", rounds=2)
    llm.hold = True
    await post_round(api, "busy", 2)  # passes 6 active entries: a compression starts and waits
    await asyncio.to_thread(llm.wait_for_calls, 1)
    document = await export(api, "busy")
    assert [m["status"] for m in document["memories"]] == ["processing"]
    llm.hold = False
    imported = await import_doc(api, document, "busy-copy")
    assert imported["dropped_processing"] == 1 and imported["memories"] == 0
    assert imported["summary_due"] is True
    llm.release_all()
    await api.idle()
    rows = await db.fetch(
        "SELECT conversation_id, status, start_sequence, end_sequence FROM memory ORDER BY 1"
    )
    assert [tuple(r) for r in rows] == [("busy", "completed", 0, 3), ("busy-copy", "completed", 0, 3)]


# ---- refusals ------------------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _drop_entry(doc: dict[str, Any]) -> None:
    del doc["entries"][3]


def _set(path: tuple[Any, ...], value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _first_result(doc: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(doc["entries"]) if e["type"] == "tool_result")


def _unpaired_result(doc: dict[str, Any]) -> None:
    doc["entries"][_first_result(doc)]["tool_call_id"] = "call_nobody"


def _answered_twice(doc: dict[str, Any]) -> None:
    index = _first_result(doc)
    doc["entries"][index + 1]["tool_call_id"] = doc["entries"][index]["tool_call_id"]


def _message_between_call_and_result(doc: dict[str, Any]) -> None:
    index = _first_result(doc)
    entries = doc["entries"]
    entries[index], entries[index + 2] = entries[index + 2], entries[index]
    for sequence, entry in enumerate(entries):
        entry["sequence"] = sequence


def _call_id_reused(doc: dict[str, Any]) -> None:
    calls = [e for e in doc["entries"] if e["type"] == "tool_call"]
    calls[1]["tool_calls"][0]["id"] = calls[0]["tool_calls"][0]["id"]


def _duplicate_memory(doc: dict[str, Any]) -> None:
    doc["memories"].append(copy.deepcopy(doc["memories"][-1]))


def _base_of_memory(doc: dict[str, Any]) -> None:
    doc["memories"][0]["base_memory_id"] = 999


REFUSALS: list[tuple[str, Mutation, list[Any] | None]] = [
    ("a gap in the sequences", _drop_entry, ["body", "entries", 3, "sequence"]),
    ("a repeated sequence", _set(("entries", 4, "sequence"), 3), ["body", "entries", 4, "sequence"]),
    ("a round skipped", _set(("entries", 2, "round"), 2), ["body", "entries", 2, "round"]),
    ("a round that goes back", _set(("entries", 4, "round"), 0), ["body", "entries", 4, "round"]),
    ("a tool result without its call", _unpaired_result, ["body", "entries", 6, "tool_call_id"]),
    ("a call answered twice", _answered_twice, ["body", "entries", 7, "tool_call_id"]),
    ("a message before the results", _message_between_call_and_result, ["body", "entries", 6]),
    ("a call id used twice", _call_id_reused, ["body", "entries", 14, "tool_calls", 0, "id"]),
    ("a type that does not fit", _set(("entries", 0, "type"), "tool_result"), ["body", "entries", 0]),
    ("a memory past the entries", _set(("memories", 0, "end_sequence"), 500), ["body", "memories", 0]),
    (
        "a memory cutting a round",
        _set(("memories", 0, "end_sequence"), 5),
        ["body", "memories", 0, "start_round"],
    ),
    ("a memory's tokens", _set(("memories", 0, "input_tokens"), 1), ["body", "memories", 0, "input_tokens"]),
    ("a base that does not exist", _base_of_memory, ["body", "memories", 0, "base_memory_id"]),
    ("a memory id used twice", _duplicate_memory, ["body", "memories"]),
    ("a completed memory without text", _set(("memories", 0, "text"), " "), ["body", "memories", 0, "text"]),
    ("an unknown field", _set(("conversation", "owner"), "x"), ["body", "conversation"]),
    ("an unknown policy", _set(("conversation", "memory_policy", "name"), "lru"), None),
    ("a naive timestamp", _set(("entries", 0, "created_at"), "2026-01-01T00:00:00"), None),
    (
        "a timestamp before year 1 in UTC",
        _set(("entries", 0, "created_at"), "0001-01-01T00:00:00+14:00"),
        ["body", "entries", 0, "created_at"],
    ),
    (
        "a timestamp past year 9999 in UTC",
        _set(("conversation", "created_at"), "9999-12-31T23:59:59-05:00"),
        ["body", "conversation", "created_at"],
    ),
    (
        "a completion before year 1 in UTC",
        _set(("memories", 0, "completed_at"), "0001-01-01T00:00:00+01:00"),
        ["body", "memories", 0, "completed_at"],
    ),
    ("another format", _set(("version",), 2), ["body", "version"]),
]


@pytest.mark.parametrize(("problem", "mutate", "loc"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_an_inconsistent_document_is_a_422_that_writes_nothing(
    api: App, db: asyncpg.Connection, problem: str, mutate: Mutation, loc: list[Any] | None
) -> None:
    await build(api, "source", "token_budget", rounds=9)
    document = await export(api, "source")
    assert len(document["memories"]) >= 2
    mutate(document)
    before = await db.fetchval("SELECT count(*) FROM messages")
    response = await api.client.post(
        "/conversations/import", json=document, params={"conversation_id": "bad"}
    )
    assert response.status_code == 422, (problem, response.text)
    body = response.json()
    assert body["code"] == "invalid_request"
    if loc is not None:
        assert body["detail"][0]["loc"][: len(loc)] == loc, body
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE conversation_id = 'bad'") == 0
    assert await db.fetchval("SELECT count(*) FROM messages") == before


async def test_an_existing_id_is_a_409(api: App, db: asyncpg.Connection) -> None:
    await build(api, "taken", "sliding_window", rounds=3)
    document = await export(api, "taken")
    for params in ({}, {"conversation_id": "taken"}):
        response = await api.client.post("/conversations/import", json=document, params=params)
        assert response.status_code == 409 and response.json()["code"] == "conflict", response.text
    assert await db.fetchval("SELECT count(*) FROM messages") == len(document["entries"])


async def test_bounds_are_413s(make_app: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_app(
        MEMORY_MAX_IMPORT_ENTRIES=20,
        MEMORY_MAX_IMPORT_BYTES=64 * 1024,
        MEMORY_MAX_BODY_BYTES=4096,
        MEMORY_MAX_MESSAGE_CHARS=200,
        MEMORY_MAX_METADATA_KEYS=3,
    )
    await build(api, "small", "sliding_window", rounds=4)
    document = await export(api, "small")
    assert 4096 < len(json.dumps(document)) < 64 * 1024
    # Larger than MEMORY_MAX_BODY_BYTES is fine for an import, up to MEMORY_MAX_IMPORT_BYTES.
    await import_doc(api, document, "fits")

    def refused(response: Any, setting: str) -> None:
        assert response.status_code == 413, response.text
        assert response.json()["code"] == "payload_too_large" and setting in response.json()["detail"]

    for n in range(4, 9):
        await post_round(api, "small", n)
    refused(await api.client.get("/conversations/small/export"), "MEMORY_MAX_IMPORT_ENTRIES")

    many = copy.deepcopy(document)
    many["entries"] = many["entries"] * 3
    refused(await api.client.post("/conversations/import", json=many), "MEMORY_MAX_IMPORT_ENTRIES")
    padded = copy.deepcopy(document)
    padded["entries"][0]["content"] = "x" * 70_000
    refused(await api.client.post("/conversations/import", json=padded), "MEMORY_MAX_IMPORT_BYTES")
    long = copy.deepcopy(document)
    long["entries"][0]["content"] = "x" * 201
    refused(await api.client.post("/conversations/import", json=long), "MEMORY_MAX_MESSAGE_CHARS")
    labels = copy.deepcopy(document)
    labels["conversation"]["metadata"] = {f"k{i}": i for i in range(4)}
    refused(
        await api.client.post("/conversations/import", json=labels, params={"conversation_id": "labels"}),
        "MEMORY_MAX_METADATA_KEYS",
    )
    assert await db.fetchval("SELECT count(*) FROM conversations") == 2


# ---- stats -----------------------------------------------------------------------------------------


async def test_stats_add_up_at_every_step_of_a_token_budget_replay(api: App, db: asyncpg.Connection) -> None:
    await build(api, "agent", "token_budget", rounds=0)
    for n in range(15):
        await post_round(api, "agent", n)
        await api.idle()
        stats = (await api.client.get("/conversations/agent/stats")).json()
        context = await api.context("agent")
        tokens = await db.fetchval("SELECT coalesce(sum(tokens), 0) FROM messages")
        entries = await db.fetchval("SELECT count(*) FROM messages")
        assert stats["total_entries"] == entries and stats["total_tokens"] == tokens
        assert stats["active_entries"] + stats["compressed_entries"] == stats["total_entries"]
        assert stats["active_tokens"] + stats["compressed_tokens"] == stats["total_tokens"]
        assert stats["tokens_saved"] == stats["compressed_tokens"] - stats["summary_tokens"]
        # The context is the summaries plus the active entries.
        assert stats["summaries"] == len(context["summaries"])
        assert stats["active_entries"] == len(context["messages"])
        assert stats["summary_tokens"] == context["tokens"]["summaries"]
        assert stats["active_tokens"] == context["tokens"]["messages"]
        assert stats["context_tokens"] == context["tokens"]["total"]
        newest = max((s["end_sequence"] for s in context["summaries"]), default=-1)
        assert stats["compressed_entries"] == newest + 1
        assert stats["processing"] is False
    assert stats["summaries"] >= 3 and stats["tokens_saved"] > 0
    unknown = await api.client.get("/conversations/nobody/stats")
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


# ---- clearing --------------------------------------------------------------------------------------


async def test_clear_drops_a_summary_in_flight_and_starts_again(
    api: App, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    await build(api, "agent", "token_budget", rounds=2)
    llm.hold = True
    await post_round(api, "agent", 2)  # a compression starts and waits for the model
    [call] = await asyncio.to_thread(llm.wait_for_calls, 1)
    in_flight = await db.fetchval("SELECT memory_id FROM memory WHERE status = 'processing'")
    assert call.memory_id == in_flight

    response = await api.client.delete("/conversations/agent/messages", headers={"Idempotency-Key": "x"})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "conversation_id": "agent",
        "entries": 9,
        "memories": 1,
        "dropped_processing": in_flight,
    }
    llm.hold = False
    llm.release_all()  # the summary completes now: its result must change nothing
    await api.idle()
    assert await db.fetchval("SELECT count(*) FROM memory") == 0
    for table in ("messages", "tool_calls", "tool_results", "idempotency_keys"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0, table
    conversation = (await api.client.get("/conversations/agent")).json()
    assert conversation["memory_policy"]["max_entries"] == 6  # the policy stays
    assert conversation["metadata"] == {"user": "ana", "n": 1}
    assert (conversation["message_count"], conversation["round_count"]) == (0, 0)
    stats = (await api.client.get("/conversations/agent/stats")).json()
    assert (stats["total_entries"], stats["total_tokens"], stats["summaries"]) == (0, 0, 0)

    # It starts again from sequence and round 0, as a new conversation, and its policy works.
    appended = (
        await api.client.post("/conversations/agent/messages", json={"messages": round_messages(0)})
    ).json()
    assert appended["round"] == 0 and [m["sequence"] for m in appended["messages"]] == [0, 1]
    for n in range(1, 4):
        await post_round(api, "agent", n)
        await api.idle()
    rows = await db.fetch("SELECT status, start_sequence, end_sequence FROM memory ORDER BY memory_id")
    assert [tuple(r) for r in rows] == [("completed", 0, 3), ("completed", 4, 8)]
    missing = await api.client.delete("/conversations/nobody/messages")
    assert missing.status_code == 404


async def test_a_round_racing_a_clear_is_either_before_or_after_it(api: App, db: asyncpg.Connection) -> None:
    await build(api, "race", "sliding_window", rounds=2)

    async def cleared() -> bool:
        response = await api.client.delete("/conversations/race/messages")
        return response.status_code == 200

    await asyncio.gather(*(post_round(api, "race", n) for n in range(2, 6)), cleared())
    sequences = [r["sequence"] for r in await db.fetch("SELECT sequence FROM messages ORDER BY sequence")]
    assert sequences == list(range(len(sequences)))
    row = await db.fetchrow("SELECT next_sequence, next_tokens FROM conversations")
    assert row["next_sequence"] == len(sequences)
    assert row["next_tokens"] == await db.fetchval("SELECT coalesce(sum(tokens), 0) FROM messages")


# ---- the command line ------------------------------------------------------------------------------


async def test_cli_export_and_import(
    api: App, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await build(api, "cli", "rolling_blocks", rounds=5)
    document = await export(api, "cli")

    def cli(*args: str) -> tuple[int, str, str, float]:
        return run(*args, cwd=tmp_path, DATABASE_URL=database_url, MEMORY_SUMMARIZER="offline")

    target = tmp_path / "cli.json"
    (code, _, err, _), (to_stdout, out, _, _), (missing, _, gone, _) = await asyncio.gather(
        asyncio.to_thread(cli, "export", "cli", "-o", str(target)),
        asyncio.to_thread(cli, "export", "cli"),
        # At LOG_LEVEL INFO too, a one-shot command's stderr is its own message alone.
        asyncio.to_thread(
            run,
            "export",
            "nobody",
            cwd=tmp_path,
            DATABASE_URL=database_url,
            MEMORY_SUMMARIZER="offline",
            LOG_LEVEL="INFO",
        ),
    )
    assert code == 0, err
    assert json.loads(target.read_text()) == document == json.loads(out) and to_stdout == 0
    assert missing == 1 and gone.strip() == "memory-service: conversation 'nobody' not found"

    bad = copy.deepcopy(document)
    bad["entries"][2]["round"] = 5
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    (imported, out, err, _), (taken, _, conflict, _), (refused, _, why, _) = await asyncio.gather(
        asyncio.to_thread(cli, "import", str(target), "--conversation-id", "cli-copy"),
        asyncio.to_thread(cli, "import", str(target)),
        asyncio.to_thread(cli, "import", str(tmp_path / "bad.json"), "--conversation-id", "bad"),
    )
    assert imported == 0, err
    assert json.loads(out)["conversation_id"] == "cli-copy"
    assert without_ids(await export(api, "cli-copy")) == without_ids(document)
    assert taken == 1 and conflict.strip() == "memory-service: conversation 'cli' already exists"
    assert refused == 1 and why.strip().startswith("memory-service: invalid document: body.entries.2.round: ")
    assert await db.fetchval("SELECT count(*) FROM conversations") == 2


def synthetic(cid: str, entries: int, summaries: list[tuple[int, int]]) -> dict[str, Any]:
    """A token_budget document of one-message rounds of 5 tokens, with compressions over these
    (start, end) entries."""
    when = "2026-04-01T09:00:00.000000Z"
    return {
        "format": "memory-service.conversation",
        "version": 1,
        "conversation": {
            "conversation_id": cid,
            "created_at": when,
            "memory_policy": {"name": "token_budget", "max_entries": 100_000, "max_tokens": 10_000_000},
            "metadata": {},
        },
        "entries": [
            {
                "sequence": i,
                "round": i,
                "type": "message",
                "role": "user",
                "content": f"Entry {i}.",
                "tokens": 5,
            }
            | {"created_at": when}
            for i in range(entries)
        ],
        "memories": [
            {
                "memory_id": k + 1,
                "kind": "compression",
                "status": "completed",
                "start_sequence": start,
                "end_sequence": end,
                "start_round": start,
                "end_round": end,
                "input_start_sequence": start,
                "text": f"Entries {start}-{end}.",
                "tokens": 4,
                "input_tokens": 5 * (end - start + 1),
                "created_at": when,
                "attempts": 1,
            }
            for k, (start, end) in enumerate(summaries)
        ],
    }


async def test_stats_cost_the_same_at_any_length(api: App, db: asyncpg.Connection) -> None:
    """The stats statement reads as many buffers for 20,000 entries as for 1,000 (same summaries)."""
    buffers = {}
    for cid, size in (("short", 1_000), ("long", 20_000)):
        third = size // 3
        await import_doc(
            api, synthetic(cid, size, [(0, third), (third + 1, 2 * third), (2 * third + 1, size - 10)])
        )
        stats = (await api.client.get(f"/conversations/{cid}/stats")).json()
        assert (stats["summaries"], stats["active_entries"], stats["total_tokens"]) == (3, 9, 5 * size)
        assert stats["tokens_saved"] == 5 * (size - 9) - 12
        async with api.service.engine.connect() as conn:
            plan = await conn.scalar(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + STATS_SQL.text),
                {"conversation_id": cid, "tenant_id": "default"},
            )
        top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        buffers[cid] = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert buffers["long"] <= buffers["short"] + 4, buffers


async def test_the_markdown_of_an_import_at_the_edges_of_time(api: App) -> None:
    """A conversation created in the first second the import accepts renders as markdown and
    exports back as it was; the first instant itself (which asyncpg would store as -infinity,
    exported as null) is refused."""
    await build(api, "edges", "sliding_window", rounds=2)
    document = await export(api, "edges")
    document["conversation"]["created_at"] = "0001-01-01T00:00:00Z"
    refused = await api.client.post("/conversations/import", json=document, params={"conversation_id": "e0"})
    assert refused.status_code == 422 and "out of range" in refused.text
    document["conversation"]["created_at"] = "0001-01-01T00:00:01Z"
    await import_doc(api, document, "edges-copy")
    response = await api.client.get("/conversations/edges-copy/export", params={"format": "markdown"})
    assert response.status_code == 200, response.text
    assert response.text.startswith("# Session: 0001-01-01_000001\n")
    assert "- Start: 0001-01-01T00:00:01Z\n" in response.text
    exported = await export(api, "edges-copy")
    assert exported["conversation"]["created_at"] == "0001-01-01T00:00:01.000000Z"
