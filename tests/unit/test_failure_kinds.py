"""Which summary failures keep a conversation due past MEMORY_SUMMARY_MAX_ATTEMPTS: those of an
unavailable model or database, not those of the request or the code."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError

from app.memory.llm import EmptySummaryError, LLMCallTimeoutError, LLMRequestError
from app.memory.service import unavailable


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (LLMRequestError("InternalServerError (HTTP 503)"), True),
        (LLMRequestError("APITimeoutError", timed_out=True), True),
        (LLMRequestError("BadRequestError (HTTP 400, code context_length_exceeded)", rejected=True), False),
        (LLMCallTimeoutError("LLM call exceeded 180 s"), True),
        (EmptySummaryError("the model returned an empty summary"), False),
        (asyncpg.ConnectionDoesNotExistError("connection was closed"), True),
        (asyncpg.TooManyConnectionsError("too many clients"), True),
        (TimeoutError(), True),
        (DBAPIError("UPDATE memory", None, asyncpg.CheckViolationError("tokens_non_negative")), False),
        (ValueError("a bug"), False),
    ],
)
def test_only_an_unavailable_model_or_database_keeps_the_conversation_due(
    exc: BaseException, expected: bool
) -> None:
    assert unavailable(exc) is expected
