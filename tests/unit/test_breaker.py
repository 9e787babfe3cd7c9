"""The model's circuit breaker, on a fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.memory.breaker import CircuitBreaker, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state(breaker: CircuitBreaker) -> CircuitState:
    """Read through a call: mypy would otherwise keep a narrowed property across the calls
    that change it."""
    return breaker.state


def test_opens_after_consecutive_failures_then_lets_a_probe_decide() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, open_seconds=30, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    assert state(breaker) is CircuitState.CLOSED
    breaker.record_failure()
    assert state(breaker) is CircuitState.OPEN and not breaker.allow()
    assert breaker.retry_in_seconds == 30
    clock.now = 29.9
    assert not breaker.allow()
    clock.now = 30.0
    assert state(breaker) is CircuitState.HALF_OPEN
    assert breaker.allow()  # half-open: summaries start again
    breaker.record_failure()  # the first to end failed: open again for a full period
    assert state(breaker) is CircuitState.OPEN and breaker.retry_in_seconds == 30
    clock.now = 60.0
    assert breaker.allow()
    breaker.record_success()
    assert state(breaker) is CircuitState.CLOSED and breaker.consecutive_failures == 0
    assert breaker.allow() and breaker.allow()


def test_a_success_resets_the_count() -> None:
    breaker = CircuitBreaker(failures=2, open_seconds=1, clock=Clock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert state(breaker) is CircuitState.CLOSED


@given(st.lists(st.booleans(), max_size=50), st.integers(min_value=1, max_value=5))
def test_never_open_with_fewer_consecutive_failures_than_the_threshold(
    outcomes: list[bool], failures: int
) -> None:
    breaker = CircuitBreaker(failures=failures, open_seconds=10, clock=Clock())
    streak = 0
    for ok in outcomes:
        if ok:
            breaker.record_success()
            streak = 0
        else:
            breaker.record_failure()
            streak += 1
        assert (state(breaker) is CircuitState.OPEN) == (streak >= failures)
