"""The policy registry: the one place where policy names are looked up.

A conversation's policy is stored as its resolved configuration (``{"name": ..., <every
parameter>}``); :func:`load_policy` turns that back into a policy object. Deployment defaults
(``MEMORY_POLICY`` and the sliding window's ``MEMORY_ROLLING_WINDOW_SIZE`` /
``MEMORY_SUMMARIZE_AFTER_SEQ``) fill the parameters a client leaves out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, TypeAdapter

from app.memory.policies.base import MemoryPolicy, policy_dump
from app.memory.policies.recursive_summary import RecursiveSummaryConfig, RecursiveSummaryPolicy
from app.memory.policies.rolling_blocks import RollingBlocksConfig, RollingBlocksPolicy
from app.memory.policies.sliding_window import SlidingWindowConfig, SlidingWindowPolicy
from app.memory.policies.token_budget import TokenBudgetConfig, TokenBudgetPolicy

AnyConfig = SlidingWindowConfig | RollingBlocksConfig | TokenBudgetConfig | RecursiveSummaryConfig
PolicyConfig = Annotated[AnyConfig, Field(discriminator="name")]

_BUILDERS: dict[type[BaseModel], Callable[[Any], MemoryPolicy]] = {
    SlidingWindowConfig: SlidingWindowPolicy,
    RollingBlocksConfig: RollingBlocksPolicy,
    TokenBudgetConfig: TokenBudgetPolicy,
    RecursiveSummaryConfig: RecursiveSummaryPolicy,
}
POLICY_NAMES: tuple[str, ...] = tuple(c.model_fields["name"].default for c in _BUILDERS)

_ADAPTER: TypeAdapter[AnyConfig] = TypeAdapter(PolicyConfig)

# Deployment defaults of each policy's parameters, by policy name.
ParameterDefaults = Mapping[str, Mapping[str, Any]]


def parse_config(value: object) -> AnyConfig:
    """A policy config from a name or a ``{"name": ..., ...}`` mapping; raises ValidationError."""
    if isinstance(value, str):
        value = {"name": value}
    return _ADAPTER.validate_python(value)


def resolve(config: AnyConfig, defaults: ParameterDefaults) -> AnyConfig:
    """``config`` with the parameters its author left out taken from the deployment defaults."""
    given = config.model_dump(include=config.model_fields_set)
    merged = {**defaults.get(config.name, {}), **given, "name": config.name}
    return _ADAPTER.validate_python(merged)


def build_policy(config: AnyConfig) -> MemoryPolicy:
    return _BUILDERS[type(config)](config)


def renderer(name: str) -> MemoryPolicy:
    """A policy of this name, for what needs no parameters (rendering a context)."""
    config = next(c for c in _BUILDERS if c.model_fields["name"].default == name)
    return _BUILDERS[config](config())


@functools.lru_cache(maxsize=1024)
def _load(serialized: bytes) -> MemoryPolicy:
    return build_policy(_ADAPTER.validate_json(serialized))


def load_policy(stored: Mapping[str, Any]) -> MemoryPolicy:
    """The policy object of a conversation's stored configuration (cached: the same few
    configurations come back on every round)."""
    return _load(orjson.dumps(stored, option=orjson.OPT_SORT_KEYS))


__all__ = [
    "POLICY_NAMES",
    "MemoryPolicy",
    "ParameterDefaults",
    "PolicyConfig",
    "build_policy",
    "load_policy",
    "parse_config",
    "policy_dump",
    "renderer",
    "resolve",
]
