"""When the client sends a call again (memory_client._core.Retries): a pure decision, by the kind
of call, the answer or error, and the attempt."""

from __future__ import annotations

import httpx
import pytest
from memory_client import _core

READ = _core.get_conversation("c")
APPEND = _core.append_messages("c", [{"role": "user", "content": "hi"}])
CREATE = _core.create_conversation("c")
RETRIES = _core.Retries(max_retries=2)


def answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers)


@pytest.mark.parametrize(
    ("call", "status", "again"),
    [
        (READ, 503, True),
        (CREATE, 503, True),  # the service refused it whole
        (READ, 502, True),
        (APPEND, 504, True),  # the same Idempotency-Key: stored once whatever happened
        (CREATE, 502, False),  # the service may have done it behind the gateway
        (CREATE, 504, False),
        (READ, 500, False),
        (APPEND, 409, False),
        (READ, 404, False),
    ],
)
def test_by_status(call: _core.Call[object], status: int, again: bool) -> None:
    assert RETRIES.should_retry(call, 0, answer(status), None) is again


@pytest.mark.parametrize(
    ("call", "error", "again"),
    [
        (CREATE, httpx.ConnectError("refused"), True),  # never reached the service
        (CREATE, httpx.ConnectTimeout("slow"), True),
        (CREATE, httpx.ReadTimeout("lost"), False),
        (CREATE, httpx.RemoteProtocolError("dropped"), False),
        (APPEND, httpx.ReadTimeout("lost"), True),
        (READ, httpx.RemoteProtocolError("dropped"), True),
    ],
)
def test_by_error(call: _core.Call[object], error: httpx.HTTPError, again: bool) -> None:
    assert RETRIES.should_retry(call, 0, None, error) is again


def test_attempts_are_bounded() -> None:
    assert RETRIES.should_retry(READ, 1, answer(503), None)
    assert not RETRIES.should_retry(READ, 2, answer(503), None)


def test_an_append_keeps_its_key_and_gets_one_when_none_is_given() -> None:
    assert APPEND.replayable and len(APPEND.headers["Idempotency-Key"]) >= 32
    mine = _core.append_messages("c", [], idempotency_key="round-7")
    assert mine.headers == {"Idempotency-Key": "round-7"}
    assert _core.append_messages("c", []).headers != APPEND.headers


def test_the_wait_follows_retry_after_within_the_cap() -> None:
    assert RETRIES.delay(0, answer(503, **{"Retry-After": "2"})) == 2.0
    assert RETRIES.delay(0, answer(503, **{"Retry-After": "120"})) == RETRIES.max_backoff
    assert 0 <= RETRIES.delay(3, None) <= min(RETRIES.max_backoff, RETRIES.backoff * 8)
