"""A fake OpenAI-compatible LLM: a real HTTP server speaking Chat Completions, run as its own
process (``python -m bench.fake_llm --port N --latency 0.5``).

``POST /v1/chat/completions`` waits ``latency`` seconds, then answers with a summary written the
way a well-behaved model would follow the service's prompt: one line per message of the window
(``#seq role: first sentence``), lines that left the window dropped, cut to the prompt's
character budget (newest lines kept). It does not import the service's code.

Control endpoints for the harness: ``POST /_control`` with ``{"latency": s, "capture": bool,
"reset": bool}``; ``GET /_captured`` returns the request count and, when capture is on, every
request body received; ``GET /healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import time
import uuid
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.memory.policies.base import keep_newest

_WINDOW = re.compile(r"from message #(\d+) to #(\d+)")
_BUDGET = re.compile(r"at most (\d+) characters")
_PREVIOUS = re.compile(r"<previous_summary[^>]*>\n?(.*?)\n?</previous_summary>", re.S)
_MESSAGE = re.compile(r'<message seq="(\d+)"(?: round="\d+")? role="(\w+)">(.*?)</message>', re.S)
_LINE = re.compile(r"^#(\d+) ")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


class State:
    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.capture = False
        self.captured: list[dict[str, Any]] = []
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0


STATE = State(0.0)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def fake_summary(messages: list[dict[str, Any]]) -> str:
    system = next((str(m.get("content", "")) for m in messages if m.get("role") == "system"), "")
    user = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
    window = _WINDOW.search(system)
    budget_match = _BUDGET.search(system)
    window_start = int(window.group(1)) if window else 0
    budget = int(budget_match.group(1)) if budget_match else 4000
    lines: list[str] = []
    previous = _PREVIOUS.search(user)
    if previous:
        for line in html.unescape(previous.group(1)).splitlines():
            match = _LINE.match(line)
            if match and int(match.group(1)) >= window_start:
                lines.append(line)
    found = False
    for seq, role, content in _MESSAGE.findall(user):
        found = True
        if int(seq) >= window_start:
            flat = " ".join(html.unescape(content).split())
            first = _SENTENCE_END.split(flat, maxsplit=1)[0][:160]
            lines.append(f"#{seq} {role}: {first}")
    if not found and not lines:
        # Not the prompt format we know: still answer with a bounded, non-empty summary.
        return ("Summary: " + " ".join(user.split()))[: min(budget, 1000)] or "Summary: (empty)"
    return keep_newest(lines, budget) or "Summary: (empty window)"


async def chat_completions(request: Request) -> Response:
    raw = await request.body()
    body = orjson.loads(raw)
    STATE.requests += 1
    if STATE.capture:
        STATE.captured.append(body)
    STATE.in_flight += 1
    STATE.max_in_flight = max(STATE.max_in_flight, STATE.in_flight)
    try:
        if STATE.latency > 0:
            await asyncio.sleep(STATE.latency)
        text = fake_summary(body.get("messages", []))
    finally:
        STATE.in_flight -= 1
    prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    return _json(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": len(text) // 4,
                "total_tokens": prompt_chars // 4 + len(text) // 4,
            },
        }
    )


async def control(request: Request) -> Response:
    data = orjson.loads(await request.body() or b"{}")
    if "latency" in data:
        STATE.latency = float(data["latency"])
    if "capture" in data:
        STATE.capture = bool(data["capture"])
    if data.get("reset"):
        STATE.captured = []
        STATE.requests = 0
        STATE.max_in_flight = STATE.in_flight
    return _json(_status())


def _status() -> dict[str, Any]:
    return {
        "latency": STATE.latency,
        "capture": STATE.capture,
        "requests": STATE.requests,
        "in_flight": STATE.in_flight,
        "max_in_flight": STATE.max_in_flight,
    }


async def captured(_request: Request) -> Response:
    return _json({**_status(), "bodies": STATE.captured})


async def healthz(_request: Request) -> Response:
    return _json({"status": "ok"})


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/_control", control, methods=["POST"]),
        Route("/_captured", captured, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fake_llm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    STATE.latency = args.latency
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
