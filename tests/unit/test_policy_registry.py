"""The registry: names to policies, deployment defaults, stored configurations."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.memory.policies import POLICY_NAMES, build_policy, load_policy, parse_config, policy_dump, resolve
from app.memory.policies.rolling_blocks import RollingBlocksPolicy
from app.memory.policies.sliding_window import SlidingWindowPolicy
from app.memory.types import ContextSpec

DEFAULTS = {"sliding_window": {"window_size": 20, "summarize_after_seq": 9, "catch_up_on_completion": True}}


def test_names() -> None:
    assert POLICY_NAMES == ("sliding_window", "rolling_blocks", "token_budget", "recursive_summary")


def test_a_name_alone_takes_every_default() -> None:
    assert policy_dump(resolve(parse_config("sliding_window"), DEFAULTS)) == {
        "name": "sliding_window",
        "window_size": 20,
        "summarize_after_seq": 9,
        "summarize_every": 1,
        "catch_up_on_completion": True,
    }
    assert policy_dump(resolve(parse_config("rolling_blocks"), DEFAULTS)) == {
        "name": "rolling_blocks",
        "window": 21,
        "max_summaries": 3,
    }


def test_given_parameters_win_over_deployment_defaults() -> None:
    config = resolve(parse_config({"name": "sliding_window", "window_size": 6}), DEFAULTS)
    assert policy_dump(config)["window_size"] == 6
    assert policy_dump(config)["summarize_after_seq"] == 9


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("summary_of_everything", "does not match any of the expected tags"),
        ({"name": "token_budget", "compression_ratio": 0}, "token_budget.compression_ratio"),
        ({"name": "rolling_blocks", "window": 0}, "rolling_blocks.window"),
        ({"name": "rolling_blocks", "windw": 3}, "rolling_blocks.windw"),
        ({"window": 3}, "Unable to extract tag"),
        # No coercion: a parameter of the wrong type is refused, not converted.
        ({"name": "rolling_blocks", "window": "3"}, "rolling_blocks.window"),
        ({"name": "rolling_blocks", "window": True}, "rolling_blocks.window"),
        ({"name": "rolling_blocks", "window": 3.0}, "rolling_blocks.window"),
        (
            {"name": "sliding_window", "catch_up_on_completion": "yes"},
            "sliding_window.catch_up_on_completion",
        ),
        ({"name": "sliding_window", "catch_up_on_completion": 1}, "sliding_window.catch_up_on_completion"),
    ],
)
def test_bad_configs_name_the_field(value: object, fragment: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_config(value)
    located = [".".join(str(p) for p in e["loc"]) + " " + e["msg"] for e in raised.value.errors()]
    assert any(fragment in line for line in located), located


def test_policies_from_configs_and_stored_json() -> None:
    assert isinstance(build_policy(parse_config("sliding_window")), SlidingWindowPolicy)
    blocks = load_policy({"name": "rolling_blocks", "window": 5, "max_summaries": 2})
    assert isinstance(blocks, RollingBlocksPolicy)
    assert blocks.context == ContextSpec(summaries=2, recent_rounds=5)
    assert load_policy({"max_summaries": 2, "window": 5, "name": "rolling_blocks"}) is blocks  # cached
