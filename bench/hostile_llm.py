"""The fake OpenAI-compatible LLM of bench/fake_llm.py, plus what the hostile suite needs: a
conversation whose summaries keep failing. The service's prompt does not name the conversation,
so the poisoned conversation is recognised by a marker its messages carry: any request whose
body contains ``POISON_MARKER`` gets an HTTP 500 (an OpenAI-style error body). ``POST /_control``
also takes ``{"fail_all_seconds": s}``: every request fails for the next s seconds.

``python -m bench.hostile_llm --port N --latency 0.2``; ``GET /_hostile`` returns the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench import fake_llm

POISON_MARKER = "HOSTILE-POISON-7f3a9c"


class Counts:
    def __init__(self) -> None:
        self.poisoned = 0
        self.failed_all = 0
        self.fail_until = 0.0


COUNTS = Counts()


def _error(status: int, message: str) -> Response:
    body = {"error": {"message": message, "type": "server_error", "code": None}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def chat_completions(request: Request) -> Response:
    raw = await request.body()  # cached: fake_llm reads it again
    if POISON_MARKER.encode() in raw:
        COUNTS.poisoned += 1
        # As slow as a real answer, so a poisoned summary holds its slot as long as any other.
        if fake_llm.STATE.latency > 0:
            await asyncio.sleep(fake_llm.STATE.latency)
        return _error(500, "the model failed on this conversation (hostile suite)")
    if time.monotonic() < COUNTS.fail_until:
        COUNTS.failed_all += 1
        return _error(500, "the model is down (hostile suite)")
    return await fake_llm.chat_completions(request)


async def control(request: Request) -> Response:
    data = orjson.loads(await request.body() or b"{}")
    if "fail_all_seconds" in data:
        COUNTS.fail_until = time.monotonic() + float(data["fail_all_seconds"])
    return await fake_llm.control(request)


async def hostile_counts(_request: Request) -> Response:
    status = fake_llm._status()
    status.update({"poisoned": COUNTS.poisoned, "failed_all": COUNTS.failed_all})
    return Response(orjson.dumps(status), media_type="application/json")


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/_control", control, methods=["POST"]),
        Route("/_captured", fake_llm.captured, methods=["GET"]),
        Route("/_hostile", hostile_counts, methods=["GET"]),
        Route("/healthz", fake_llm.healthz, methods=["GET"]),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_llm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    fake_llm.STATE.latency = args.latency
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
