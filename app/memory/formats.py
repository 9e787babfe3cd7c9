"""Provider-ready renderings of a context (pure): what an agent sends to its model as is.

Each takes the context as the context read returns it (JSON, see CONTEXT_SQL) and either
returns a payload valid for the provider or raises :class:`Unrenderable` (a 409 naming why);
each checks its own output against the provider's rules before returning it.

- OpenAI Chat Completions: the summaries as one leading system message saying which messages
  they cover, then the raw messages exactly as posted (optional fields that were not posted
  left out), tool calls and results intact.
- Anthropic Messages: ``system`` holds the summaries and every system message (none mid-history);
  ``messages`` strictly alternate user/assistant from a user message, consecutive messages of a
  side merged into one (content kept, in order), tool calls as ``tool_use`` blocks and results as
  ``tool_result`` blocks with their ids, each result in the user message right after its call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# Anthropic's Messages API needs a user message first: when history starts with the assistant
# (its earlier turns are in the summaries), this stands in front of it.
# The user turn that opens an Anthropic history starting with the assistant: it points at the
# system prompt only when there is one.
CONTINUED = "(The conversation so far is summarized in the system prompt.)"
RESUMED = "(The conversation continues from here.)"


class Unrenderable(ValueError):
    """The context cannot be sent to this provider as it stands (the 409's message)."""


def _summary_text(context: Mapping[str, Any]) -> str | None:
    """The system text: the user's cross-conversation summary (a conversation of a user), then
    the conversation's summaries, oldest first."""
    parts = []
    user = context.get("user_summary")
    if user:
        parts += ["What is known about the user from their earlier conversations:", user["text"]]
    summaries = list(reversed(context["summaries"]))  # oldest first
    if summaries:
        first, last = summaries[0]["start_sequence"], summaries[-1]["end_sequence"]
        parts.append(
            f"Summary of the conversation so far (messages #{first}-#{last}, older than the ones below):"
        )
        parts += [s["text"] for s in summaries]
    return "\n\n".join(parts) or None


def _open_calls(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Call ids made in these messages that have no result in them."""
    made = [call["id"] for m in messages for call in m.get("tool_calls") or ()]
    answered = {m["tool_call_id"] for m in messages if m.get("tool_call_id")}
    return [call for call in made if call not in answered]


def _refuse_open_calls(messages: Sequence[Mapping[str, Any]]) -> None:
    waiting = _open_calls(messages)
    if waiting:
        raise Unrenderable(
            f"tool call(s) {', '.join(waiting)} have no result yet: the provider needs each call's "
            "result after it, so post the results (the next round starts with them) and read again"
        )


# ---- OpenAI Chat Completions -----------------------------------------------------------------

_OPENAI_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def to_openai(context: Mapping[str, Any]) -> dict[str, Any]:
    raw = context["messages"]
    _refuse_open_calls(raw)
    out: list[dict[str, Any]] = []
    summary = _summary_text(context)
    if summary is not None:
        out.append({"role": "system", "content": summary})
    for message in raw:
        item = {key: message[key] for key in _OPENAI_FIELDS if message.get(key) is not None}
        if message["content"] is None:
            item["content"] = None  # an assistant message that only calls tools
        elif not isinstance(message["content"], str | list):
            item["content"] = json.dumps(message["content"], ensure_ascii=False)  # JSON content as text
        out.append(item)
    check_openai(out)
    return {"messages": out}


def check_openai(messages: Sequence[Mapping[str, Any]]) -> None:
    """Chat Completions' rules: known roles; each assistant's tool calls followed by one tool
    message per call before any other message; no tool message without its call."""
    waiting: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise Unrenderable(f"message {index} has role {role!r}")
        if role == "tool":
            if message.get("tool_call_id") not in waiting:
                raise Unrenderable(f"message {index} answers a tool call that is not waiting for it")
            waiting.discard(message["tool_call_id"])
            continue
        if waiting:
            raise Unrenderable(f"message {index} comes before the results of {sorted(waiting)}")
        waiting = {call["id"] for call in message.get("tool_calls") or ()}
    if waiting:
        raise Unrenderable(f"tool calls {sorted(waiting)} have no result")


# ---- Anthropic Messages ----------------------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Anthropic content blocks of a message's content (nothing dropped: what has no block of its
    own becomes text)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    if isinstance(content, list):
        blocks: list[dict[str, Any]] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                if part["text"].strip():
                    blocks.append({"type": "text", "text": part["text"]})
            elif isinstance(part, Mapping) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url")
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
            else:
                blocks.append({"type": "text", "text": json.dumps(part, ensure_ascii=False)})
        return blocks
    return [{"type": "text", "text": json.dumps(content, ensure_ascii=False)}]


def _text_of(content: Any) -> str:
    return "\n".join(b["text"] for b in _blocks(content) if b["type"] == "text")


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except ValueError:
        arguments = {"arguments": function["arguments"]}
    if not isinstance(arguments, dict):  # tool_use input is an object
        arguments = {"value": arguments}
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def to_anthropic(context: Mapping[str, Any]) -> dict[str, Any]:
    raw = context["messages"]
    _refuse_open_calls(raw)
    system_parts = [text for text in [_summary_text(context)] if text]
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for message in raw:
        role = message["role"]
        if role in ("system", "developer"):
            text = _text_of(message["content"])
            if text:
                source = f" ({message['source']})" if message.get("source") else ""
                system_parts.append(
                    f"[{message.get('type') or 'message'}{source} #{message['sequence']}]\n{text}"
                )
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": _text_of(message["content"]),
            }
            add("user", [result])
        elif role == "assistant":
            add(
                "assistant",
                _blocks(message["content"]) + [_tool_use(c) for c in message.get("tool_calls") or ()],
            )
        else:
            add("user", _blocks(message["content"]))
    if turns and turns[0]["role"] != "user":
        opening = CONTINUED if system_parts else RESUMED
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": opening}]})
    for turn in turns:  # tool results open their user message, as the API requires
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    payload: dict[str, Any] = {"messages": turns}
    if system_parts:
        payload["system"] = "\n\n".join(system_parts)
    check_anthropic(payload)
    return payload


def check_anthropic(payload: Mapping[str, Any]) -> None:
    """The Messages API's rules: the first message from the user, roles strictly alternating, no
    empty content (no messages at all is fine: everything is in the summaries, and the agent
    adds its own turn), every tool_use answered by a tool_result in the next user
    message, and no tool_result without its tool_use in the message before."""
    turns = payload["messages"]
    for index, turn in enumerate(turns):
        expected = "user" if index % 2 == 0 else "assistant"
        if turn["role"] != expected:
            raise Unrenderable(f"message {index} is from the {turn['role']}, where the {expected} speaks")
        if not turn["content"]:
            raise Unrenderable(f"message {index} is empty")
        results = {b["tool_use_id"] for b in turn["content"] if b["type"] == "tool_result"}
        before = turns[index - 1]["content"] if index > 0 else []
        uses = {b["id"] for b in before if b["type"] == "tool_use"}
        if results - uses:
            raise Unrenderable(
                f"message {index} has tool results without their calls: {sorted(results - uses)}"
            )
        if turn["role"] == "user" and uses - results:
            raise Unrenderable(f"message {index} lacks the results of {sorted(uses - results)}")
