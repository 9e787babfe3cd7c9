"""Events as they happen, for this process's streams and waiting reads: one LISTEN connection
per process, fanned out in process.

Writers NOTIFY ``memory_events`` with a conversation id when they commit events of a watched
conversation (app.repositories.events). The hub wakes every subscriber of that conversation,
which then reads the events table after the last id it delivered: the table, not the
notification, is the source of truth, so a notification lost or merged with another costs
nothing. While the LISTEN connection is down nobody is told anything; once it is back, every
subscriber is woken to catch up from the table. The connection is checked with a ``SELECT 1``
every heartbeat (a network that silently drops it would otherwise never be noticed), and the
marks of the conversations watched here are renewed on the same tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import SERVER_SETTINGS
from app.errors import TooManyStreams
from app.repositories import events

logger = logging.getLogger(__name__)

# Events read per query while a stream catches up.
BATCH = 500


class EventHub:
    """Subscriptions to conversations' events in this process, the LISTEN connection behind
    them, and the bound on open streams."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        max_streams: int,
        heartbeat_seconds: float,
        listen_url: str | None = None,
    ) -> None:
        # LISTEN needs a session of its own on PostgreSQL (PgBouncer in transaction mode hands
        # the server connection to other clients between statements): ``listen_url``, else the
        # engine's.
        url = make_url(listen_url) if listen_url is not None else engine.url
        self.dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.engine = engine
        self.max_streams = max_streams
        self.heartbeat_seconds = heartbeat_seconds
        # A watch mark outlives a few missed renewals, and a process that died stops costing
        # NOTIFYs soon after.
        self.watch_seconds = max(3 * heartbeat_seconds, 30.0)
        self.streams = 0
        self._subscribers: dict[str, set[asyncio.Event]] = {}
        self._watched: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.connects = 0
        # The LISTEN connection's backend (pg_stat_activity.pid), while connected.
        self.server_pid: int | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="events-listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._wake(list(self._subscribers))

    # ---- subscriptions ------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, conversation_id: str, *, seconds: float | None = None, marked: bool = False
    ) -> AsyncIterator[asyncio.Event]:
        """An event set whenever the conversation may have new events (clear it, then read the
        table). The conversation is marked watched first (unless the caller just did, with
        :meth:`mark`), so every write that commits from now on notifies; ``seconds`` bounds the
        mark for a short wait (else it is renewed while the subscription lasts)."""
        wake = asyncio.Event()
        self._subscribers.setdefault(conversation_id, set()).add(wake)
        if seconds is None:
            self._watched[conversation_id] += 1
        try:
            if not marked:
                await self.mark(conversation_id, seconds)
            yield wake
        finally:
            subscribers = self._subscribers.get(conversation_id)
            if subscribers is not None:
                subscribers.discard(wake)
                if not subscribers:
                    del self._subscribers[conversation_id]
            if seconds is None:
                self._watched[conversation_id] -= 1
                if self._watched[conversation_id] <= 0:
                    del self._watched[conversation_id]

    def subscribers(self, conversation_id: str) -> int:
        """How many streams and reads of this process wait on the conversation's events."""
        return len(self._subscribers.get(conversation_id, ()))

    def check_capacity(self) -> None:
        """A 429 when MEMORY_EVENTS_MAX_STREAMS streams are open here. (A stream counts from its
        first byte; requests admitted in the same instant may pass the bound by a few.)"""
        if self.streams >= self.max_streams:
            raise TooManyStreams(
                f"{self.max_streams} event streams are open on this server (MEMORY_EVENTS_MAX_STREAMS); "
                "retry later"
            )

    async def stream(
        self, *, conversation_id: str, tenant_id: str, after_id: int, marked: bool
    ) -> AsyncIterator[bytes]:
        """The tenant's events of a conversation after ``after_id`` as Server-Sent Events, then
        each new one as it commits, forever (until the client goes); a comment every heartbeat
        keeps proxies from closing an idle stream. Call :meth:`mark` first (before the response
        starts, so that a database outage is still a 503) and pass what it returned: a
        conversation not created yet is marked once its creation (which always notifies) wakes
        the stream, before the stream reads."""
        self.streams += 1
        try:
            async with self.subscribe(conversation_id, marked=True) as wake:
                # Sent at once, so the client (and any proxy) sees the stream open.
                yield f"retry: 1000\n: events of {conversation_id} after {after_id}\n\n".encode()
                last = after_id
                while True:
                    wake.clear()
                    if not marked:
                        marked = await self.mark(conversation_id)
                    while True:
                        async with self.engine.connect() as conn:
                            batch = await events.after(
                                conn,
                                conversation_id=conversation_id,
                                tenant_id=tenant_id,
                                after_id=last,
                                limit=BATCH,
                            )
                        if batch:
                            yield b"".join(server_sent_event(e) for e in batch)
                            last = batch[-1]["event_id"]
                        if len(batch) < BATCH:
                            break
                    try:
                        async with asyncio.timeout(self.heartbeat_seconds):
                            await wake.wait()
                    except TimeoutError:
                        yield b": keepalive\n\n"
        finally:
            self.streams -= 1

    async def mark(self, conversation_id: str, seconds: float | None = None) -> bool:
        """Mark the conversation watched (for ``seconds``, else until the next renewals); False
        when it does not exist yet (its creation notifies anyway: mark it then)."""
        return await self._mark([conversation_id], self.watch_seconds if seconds is None else seconds) > 0

    async def _mark(self, conversation_ids: list[str], seconds: float) -> int:
        async with self.engine.begin() as conn:
            return await events.watch(conn, conversation_ids=conversation_ids, seconds=seconds)

    def _wake(self, conversation_ids: list[str]) -> None:
        for conversation_id in conversation_ids:
            for wake in self._subscribers.get(conversation_id, ()):
                wake.set()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._wake([payload])

    # ---- the LISTEN connection ----------------------------------------------------------

    async def _listen_forever(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, timeout=10, server_settings=SERVER_SETTINGS)
            except Exception as exc:
                logger.warning(
                    "Events: cannot connect to LISTEN (%s); retrying in %.1f s", type(exc).__name__, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            try:
                await self._listen(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Events: LISTEN connection lost (%s); reconnecting", type(exc).__name__)
            finally:
                self.connected.clear()
                self.server_pid = None
                await self._close(conn)

    @staticmethod
    async def _close(conn: asyncpg.Connection) -> None:
        """Close gracefully when the server is there (also when shutting down), else drop it."""
        if conn.is_closed():
            return
        try:
            await asyncio.shield(conn.close(timeout=2))
        except (Exception, asyncio.CancelledError):
            conn.terminate()

    async def _listen(self, conn: asyncpg.Connection) -> None:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        await conn.add_listener(events.CHANNEL, self._notified)
        self.server_pid = conn.get_server_pid()
        self.connected.set()
        self.connects += 1
        # Whatever was committed while nobody listened is in the table: everyone reads it now.
        self._wake(list(self._subscribers))
        while not lost.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_seconds):
                    await lost.wait()
            if lost.is_set():
                break
            await conn.fetchval("SELECT 1", timeout=self.heartbeat_seconds)
            if self._watched:
                await self._renew()
        raise ConnectionError("the LISTEN connection was closed")

    async def _renew(self) -> None:
        try:
            await self._mark(list(self._watched), self.watch_seconds)
        except Exception as exc:  # the next tick tries again; the marks last three ticks
            logger.warning("Events: could not renew watch marks (%s)", type(exc).__name__)


def server_sent_event(event: dict[str, Any]) -> bytes:
    """One event in the text/event-stream format: its id (what Last-Event-ID resumes after), its
    type, and one data line of JSON. ``data`` is JSON text: a line break in it can only be
    insignificant whitespace (JSON strings escape theirs), so it becomes a space."""
    created = event["created_at"].isoformat()
    data = event["data"].replace("\r", " ").replace("\n", " ")
    return (
        f"id: {event['event_id']}\nevent: {event['type']}\n"
        f'data: {{"event_id": {event["event_id"]}, "type": "{event["type"]}", '
        f'"created_at": "{created}", "data": {data}}}\n\n'
    ).encode()


async def wait_until(wake: asyncio.Event, done: Callable[[], Awaitable[bool]], *, seconds: float) -> bool:
    """Check ``done()`` now and each time ``wake`` is set, until it is true (True) or
    ``seconds`` pass (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        wake.clear()
        if await done():
            return True
        left = deadline - loop.time()
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                await wake.wait()
        except TimeoutError:
            return await done()
