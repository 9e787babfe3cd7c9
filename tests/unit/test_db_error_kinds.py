"""A database that refuses connections is 'unavailable' (503, retried, kept due) on either
event loop the service runs on: asyncio's, and uvloop's (under `serve` and `worker`), whose
frames once made a refused connection look like a bug (a 500, a crashed drain)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg
import pytest
import uvloop

from app.db import classify_db_error


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def refused() -> BaseException:
    try:
        await asyncpg.connect(f"postgresql://nobody@127.0.0.1:{closed_port()}/none", timeout=5)
    except Exception as exc:
        return exc
    raise AssertionError("nothing listens there, yet it connected")


RUNNERS: list[Callable[[Coroutine[Any, Any, BaseException]], BaseException]] = [asyncio.run, uvloop.run]


@pytest.mark.parametrize("run", RUNNERS, ids=["asyncio", "uvloop"])
def test_a_refused_connection_means_the_database_is_unavailable(
    run: Callable[[Coroutine[Any, Any, BaseException]], BaseException],
) -> None:
    exc = run(refused())
    assert isinstance(exc, ConnectionRefusedError)
    failure = classify_db_error(exc)
    assert failure is not None and failure.connection_lost


def test_an_oserror_raised_elsewhere_says_nothing_about_the_database() -> None:
    try:
        open("/no/such/file/anywhere")  # noqa: SIM115
    except OSError as exc:
        assert classify_db_error(exc) is None
