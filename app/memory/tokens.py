"""Token counts of messages, for the configured model's encoding, offline.

tiktoken would download an encoding's file on first use; the files of the two encodings current
OpenAI chat models use ship in app/memory/encodings (see its README), so counting works with no
internet. A model whose encoding is one of those is counted exactly; any other model (an older
OpenAI encoding, or a model tiktoken does not know, such as a local one) is counted with
o200k_base as an approximation, and the counter says so (``exact``).

A message's count follows OpenAI's documented accounting for chat models: 3 tokens of framing,
plus its role and content, plus its name and 1; for an assistant's tool calls, each call's
function name and arguments plus 3. Content that is an array of parts counts its text parts'
text and any other part as compact JSON; JSON content counts as compact JSON.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.model import encoding_name_for_model

BUNDLED = frozenset({"o200k_base", "cl100k_base"})
FALLBACK = "o200k_base"
_FOLDER = Path(__file__).parent / "encodings"
_LOADING = threading.Lock()

# Per message, and per tool call (OpenAI's accounting for gpt-4-class and later chat models).
MESSAGE_OVERHEAD = 3
TOOL_CALL_OVERHEAD = 3


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """Counts tokens with ``encoding``; ``exact`` when that is the model's own encoding."""

    model: str
    encoding_name: str
    exact: bool
    _encoding: tiktoken.Encoding

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message (role, content, name, tool calls), as posted."""
        total = MESSAGE_OVERHEAD + self.count(str(message.get("role") or ""))
        total += self.content(message.get("content"))
        if message.get("name"):
            total += self.count(str(message["name"])) + 1
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += TOOL_CALL_OVERHEAD + self.count(str(function.get("name") or ""))
            total += self.count(str(function.get("arguments") or ""))
        return total

    def content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count(content)
        if isinstance(content, list):
            return sum(
                self.count(part["text"])
                if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                else self.count(_compact(part))
                for part in content
            )
        return self.count(_compact(content))


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encoding_for(model: str) -> tuple[str, bool]:
    """The encoding a model's messages are counted with, and whether it is the model's own."""
    try:
        name = encoding_name_for_model(model)
    except KeyError:
        return FALLBACK, False
    return (name, True) if name in BUNDLED else (FALLBACK, False)


@lru_cache(maxsize=16)
def counter_for(model: str) -> TokenCounter:
    name, exact = encoding_for(model)
    return TokenCounter(model=model, encoding_name=name, exact=exact, _encoding=_load(name))


def _load(name: str) -> tiktoken.Encoding:
    """Build a bundled encoding from this package's files: tiktoken reads its cache folder from
    the environment when it loads one, so the folder is pointed here while it does (and the
    file's SHA-256 is checked against tiktoken's own)."""
    with _LOADING:
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(_FOLDER)
        try:
            return tiktoken.get_encoding(name)
        finally:
            if previous is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
