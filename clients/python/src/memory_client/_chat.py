"""Chat Completions messages (what the service stores and ``format=openai`` returns) as plain
text, for the adapters."""

from __future__ import annotations

import json
from typing import Any


def text_of(content: Any) -> str:
    """A message's content as text: a string as is, the text parts of a content-part array
    joined, any other JSON as compact JSON (the service stores any JSON value as content)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return json.dumps(content, separators=(",", ":"), ensure_ascii=False)
