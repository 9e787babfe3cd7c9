"""Webhook deliveries (issue 12): every event of a tenant POSTed, signed, to each of its
endpoints, at least once, by any replica or worker.

The body is JSON: ``{"id": "<conversation_id>:<event_id>", "conversation_id", "event_id",
"type", "created_at", "data"}``; ``id`` is the same on every attempt, so a receiver drops
repeats by it. The ``Memory-Signature`` header is ``t=<unix seconds>,v1=<hex>``, where ``v1`` is
HMAC-SHA256, keyed by the endpoint's secret, of ``"<t>.<body>"`` (Stripe's scheme): a receiver
recomputes it over the raw body and refuses a mismatch or a ``t`` too far from its clock.

A sender claims due deliveries (app.repositories.webhooks), POSTs them concurrently with a
timeout, and records each outcome; a 2xx is delivered, anything else (an error status, a
timeout, a refused connection) is retried with exponential backoff, and dead after
MEMORY_WEBHOOK_MAX_ATTEMPTS. It runs on its own task with its own HTTP client: a slow receiver
holds up neither requests nor summaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass

import httpx
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repositories import webhooks
from app.repositories.webhooks import Delivery

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "Memory-Signature"
# Deliveries sent at once per process.
CONCURRENCY = 16


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(24)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The Memory-Signature header for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance_seconds: float = 300) -> bool:
    """What a receiver does (the README shows it): the header's signature matches the body and
    its timestamp is within ``tolerance_seconds`` of ``now``."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    expected = signature(secret, timestamp, body).split("v1=", 1)[1]
    return abs(now - timestamp) <= tolerance_seconds and hmac.compare_digest(expected, parts.get("v1", ""))


def body_of(delivery: Delivery) -> bytes:
    return orjson.dumps(
        {
            "id": f"{delivery.conversation_id}:{delivery.event_id}",
            "conversation_id": delivery.conversation_id,
            "event_id": delivery.event_id,
            "type": delivery.type,
            "created_at": delivery.created_at,
            "data": orjson.Fragment(delivery.data),
        }
    )


@dataclass(frozen=True, slots=True)
class Retries:
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float


class WebhookSender:
    """Claims and sends due deliveries until stopped; checks every ``interval`` seconds, and at
    once again while it finds work."""

    def __init__(
        self, *, engine: AsyncEngine, timeout_seconds: float, interval_seconds: float, retries: Retries
    ) -> None:
        self.engine = engine
        self.timeout_seconds = timeout_seconds
        self.interval_seconds = interval_seconds
        self.retries = retries
        # A claimed delivery not recorded within this (its sender died) is claimed again.
        self.lease_seconds = timeout_seconds + 30
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhook-sender")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_seconds, follow_redirects=False) as client:
            while True:
                try:
                    sent = await self.send_due(client)
                except Exception as exc:  # the database is away: try again later
                    logger.warning("Webhooks: could not claim deliveries (%s)", type(exc).__name__)
                    sent = 0
                if sent < CONCURRENCY:
                    await asyncio.sleep(self.interval_seconds)

    async def send_due(self, client: httpx.AsyncClient) -> int:
        """Claim up to CONCURRENCY due deliveries, send them, record the outcomes; how many."""
        async with self.engine.begin() as conn:
            claimed = await webhooks.claim(conn, limit=CONCURRENCY, lease_seconds=self.lease_seconds)
        await asyncio.gather(*(self._send(client, delivery) for delivery in claimed))
        return len(claimed)

    async def _send(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        body = body_of(delivery)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: signature(delivery.secret, int(time.time()), body),
            "User-Agent": "memory-service-webhooks",
        }
        error: str | None = None
        try:
            response = await client.post(delivery.url, content=body, headers=headers)
            if not response.is_success:
                error = f"HTTP {response.status_code}"
        except httpx.TimeoutException:
            error = f"no answer within {self.timeout_seconds:g} s (MEMORY_WEBHOOK_TIMEOUT_SECONDS)"
        except httpx.HTTPError as exc:
            # httpx's transport errors often carry no message (a connection closed mid-answer):
            # say so rather than leave an empty reason.
            reason = str(exc) or "the connection failed or closed without an answer"
            error = f"{type(exc).__name__}: {reason}"[:300]
        async with self.engine.begin() as conn:
            if error is None:
                await webhooks.delivered(conn, delivery=delivery)
                return
            dead = await webhooks.failed(
                conn,
                delivery=delivery,
                error=error,
                max_attempts=self.retries.max_attempts,
                backoff_seconds=self.retries.backoff_seconds,
                backoff_max_seconds=self.retries.backoff_max_seconds,
            )
        logger.warning(
            "Webhook %d: event %d of %s, attempt %d failed (%s)%s",
            delivery.webhook_id,
            delivery.event_id,
            delivery.conversation_id,
            delivery.attempt,
            error,
            ": dead" if dead else "",
        )
