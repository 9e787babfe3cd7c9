"""LOG_FORMAT=json: one JSON object per line, with the request id from X-Request-ID on the
request's lines and on the lines of the summary that request made due (run in this process),
and seed 004's lines kept as they are. (The real process's stderr: test_metrics_processes.)"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from app import logs
from tests.integration.conftest import AppFactory
from tests.integration.test_edge import broken_route


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the service logs under "app", formatted as with LOG_FORMAT=json, at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    logger = logging.getLogger("app")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = stream.getvalue().splitlines()
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object


async def test_summary_lines_carry_the_request_id_of_the_round_that_made_them_due(
    make_app: AppFactory, json_lines: io.StringIO
) -> None:
    api = await make_app(LOG_LEVEL="DEBUG")
    secret = "card-4111111111111111"
    for n in range(4):
        response = await api.client.post(
            "/conversations/logged/messages",
            json={
                "messages": [
                    {"role": "user", "content": f"{secret} {n}"},
                    {"role": "assistant", "content": "ok"},
                ]
            },
            headers={"X-Request-ID": f"round-{n}"},
        )
        assert response.status_code == 201
        await api.idle()
    assert logs.request_id() is None  # the request's id ended with it

    lines = parsed(json_lines)
    for line in lines:
        assert {"timestamp", "level", "logger", "message", "request_id"} <= line.keys()
        datetime.fromisoformat(line["timestamp"])
    summarized = [line for line in lines if line["message"].startswith("Summarized messages")]
    # Seed 004's line, unchanged, with the ids that join it to its request and its rows.
    assert [(s["message"].split(" in ")[0], s["request_id"], s["memory_id"]) for s in summarized] == [
        ("Summarized messages 0-5 for logged", "round-2", 1),
        ("Summarized messages 0-7 for logged", "round-3", 2),
    ]
    assert {(s["level"], s["logger"], s["conversation_id"]) for s in summarized} == {
        ("INFO", "app.memory", "logged")
    }
    completed = [line for line in lines if line["message"] == "Memory 2 status updated to completed"]
    assert [(c["level"], c["request_id"], c["memory_id"]) for c in completed] == [("DEBUG", "round-3", 2)]
    # Message content is never logged, at DEBUG either.
    assert secret not in json_lines.getvalue()


async def test_an_error_line_is_one_json_object_with_the_request_id(
    make_app: AppFactory, json_lines: io.StringIO
) -> None:
    api = await make_app()
    broken_route(api)
    response = await api.client.get("/broken", headers={"X-Request-ID": "req-broken"})
    assert response.status_code == 500
    [error] = [line for line in parsed(json_lines) if line["level"] == "ERROR"]
    assert error["request_id"] == "req-broken" and error["logger"] == "app.edge"
    assert "Traceback" in error["message"] and "hunter2" not in error["message"]
