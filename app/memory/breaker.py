"""A circuit breaker for the model: during an outage, summaries fail fast instead of each
waiting out its timeouts and retries, and none is started while the circuit is open.

Closed: calls go through. After ``failures`` consecutive failed calls it opens for
``open_seconds``: no summary starts. Then it is half-open: summaries start again, and the first
call to end decides: a success closes the circuit, a failure opens it for another period. Per
process: each replica learns about an outage from its own calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self, *, failures: int, open_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.open_seconds = open_seconds
        self._clock = clock
        self.consecutive_failures = 0
        self._opened_at: float | None = None

    @property
    def state(self) -> CircuitState:
        if self._opened_at is None:
            return CircuitState.CLOSED
        if self._clock() - self._opened_at < self.open_seconds:
            return CircuitState.OPEN
        return CircuitState.HALF_OPEN

    @property
    def retry_in_seconds(self) -> float:
        """How long until the circuit lets a probe through (0 when it would now)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self.open_seconds - (self._clock() - self._opened_at))

    def allow(self) -> bool:
        """Whether a summary may start now."""
        return self.state is not CircuitState.OPEN

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self._opened_at = None

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self._opened_at is not None or self.consecutive_failures >= self.failures:
            self._opened_at = self._clock()
