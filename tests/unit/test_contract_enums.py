"""The HTTP contract's enums name what the code really uses: the memory table's CHECK
constraints, the policies' kinds and names, the breaker's states, the error codes."""

from __future__ import annotations

import re
from typing import get_args

from sqlalchemy import CheckConstraint

from app.errors import AppError
from app.main import _CODES
from app.memory.breaker import CircuitState as BreakerState
from app.memory.policies import POLICY_NAMES, recursive_summary, rolling_blocks, sliding_window, token_budget
from app.models import memory
from app.schemas import CircuitState, ErrorCode, MemoryKind, MemoryStatus, PolicyName, Role


def checked_values(column: str) -> list[str]:
    """The values the memory table's CHECK constraint allows in ``column``: ``column IN ('a', 'b')``."""
    for constraint in memory.constraints:
        if isinstance(constraint, CheckConstraint) and str(constraint.sqltext).startswith(f"{column} IN ("):
            return re.findall(r"'([^']*)'", str(constraint.sqltext))
    raise AssertionError(f"no CHECK constraint on memory.{column}")


def test_memory_statuses_and_kinds_are_the_tables() -> None:
    assert list(get_args(MemoryStatus)) == checked_values("status")
    assert list(get_args(MemoryKind)) == checked_values("kind")
    assert set(get_args(MemoryKind)) == {
        sliding_window.KIND,
        rolling_blocks.KIND,
        token_budget.COMPRESSION,
        token_budget.FOLD,
        recursive_summary.MEDIUM_TERM,
        recursive_summary.COMPACTION,
    }


def test_policy_names_and_circuit_states_are_the_codes() -> None:
    assert list(get_args(PolicyName)) == list(POLICY_NAMES)
    assert list(get_args(CircuitState)) == [state.value for state in BreakerState]
    assert list(get_args(Role)) == ["user", "assistant", "system", "tool"]


def test_every_error_code_the_app_sends_is_documented() -> None:
    errors: list[type[AppError]] = [AppError, *AppError.__subclasses__()]
    sent = {error.code for error in errors} | set(_CODES.values())
    assert sent <= set(get_args(ErrorCode))
