"""A real HTTP server speaking the OpenAI Chat Completions API, for tests and benchmarks.

The service's real ``openai`` client talks to it over loopback. A test can hold calls (they wait
until released), fail them with a status code (and Retry-After, and an error message of its
choice), let them answer at once, or make them trickle: headers at once, then the body a byte at a
time (``trickle_seconds`` apart), as a wedged upstream does; no per-read timeout ever fires.
It answers any prompt: what a call is for comes from the service's ``X-Memory-Job`` header (the
memory row, its kind and range), never from the prompt's prose, and each answer names the range
it was asked for, so tests can check what the service sent.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.memory.llm import JOB_HEADER

_SEQ = re.compile(r'<message seq="(\d+)"')
_PREVIOUS = re.compile(r"<previous_summary[^>]*>\n(.*?)\n</previous_summary>", re.S)


@dataclass
class Call:
    """One chat-completions request the server received."""

    body: dict[str, Any]
    job: dict[str, Any]
    released: threading.Event = field(default_factory=threading.Event)
    status: int = 200
    retry_after: str | None = None
    answer: str | None = None
    error_message: str | None = None

    @property
    def system(self) -> str:
        return str(self.body["messages"][0]["content"])

    @property
    def user(self) -> str:
        return str(self.body["messages"][-1]["content"])

    @property
    def window(self) -> tuple[int, int]:
        """The (start, end) sequences of the memory row the call is for."""
        return int(self.job["start_sequence"]), int(self.job["end_sequence"])

    @property
    def memory_id(self) -> int:
        return int(self.job["memory_id"])

    @property
    def message_sequences(self) -> list[int]:
        return [int(s) for s in _SEQ.findall(self.user)]


@dataclass
class _Failure:
    status: int
    retry_after: str | None
    message: str | None = None


class FakeLLM:
    def __init__(self, latency_seconds: float = 0.0) -> None:
        self.latency_seconds = latency_seconds
        # Seconds between the bytes of each reply's body (0: all at once). Trickling replies stop
        # (the connection is closed) on reset() or stop().
        self.trickle_seconds = 0.0
        self._trickle_abort = threading.Event()
        self.calls: list[Call] = []
        # Requests to the Anthropic Messages endpoint (answered at once with a canned message).
        self.anthropic_requests: list[dict[str, Any]] = []
        self.hold = False
        # Assistant messages (tool calls too) that the next calls without a memory job answer, in
        # order: an agent's turns, for the adapters' tests.
        self.agent_replies: list[dict[str, Any]] = []
        # With growth > 0, a model that writes long summaries: each answer is the previous
        # summary of the prompt plus ``growth`` words (a compaction's answer: ``growth`` words).
        self.growth = 0
        self._failures: list[_Failure] = []
        self._cond = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.endswith("/v1/messages"):  # Anthropic's Messages API, for examples
                    fake.anthropic_requests.append(body)
                    self._reply(200, _anthropic_message(body.get("model", "fake"), "A fake Claude answer."))
                    return
                if not self.path.endswith("/chat/completions"):
                    self._reply(404, {"error": {"message": "not found"}})
                    return
                call = fake._register(body, json.loads(self.headers.get(JOB_HEADER, "{}")))
                call.released.wait(timeout=120)
                if fake.latency_seconds:
                    time.sleep(fake.latency_seconds)
                if call.status != 200:
                    headers = {"retry-after": call.retry_after} if call.retry_after else {}
                    self._reply(
                        call.status,
                        {
                            "error": {
                                "message": call.error_message or f"injected {call.status}",
                                "type": "fake",
                            }
                        },
                        headers,
                    )
                    return
                if not call.job and fake.agent_replies:
                    reply = fake.agent_replies.pop(0)
                    self._reply(200, _completion(body.get("model", "fake"), "", _tokens(body), reply))
                    return
                text = call.answer
                if text is None:
                    start, end = call.job.get("start_sequence", "?"), call.job.get("end_sequence", "?")
                    text = f"Summary of messages #{start}-#{end}."
                    if fake.growth:
                        text = _grown(call, text, fake.growth)
                self._reply(200, _completion(body.get("model", "fake"), text, _tokens(body)))

            def _reply(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                interval, abort = fake.trickle_seconds, fake._trickle_abort
                if not interval:
                    self.wfile.write(data)
                    return
                try:
                    for i in range(len(data)):
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        if abort.wait(interval):
                            break
                except OSError:  # the client gave up and closed the connection
                    pass
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release_all()
        self._trickle_abort.set()
        self._server.shutdown()
        self._server.server_close()

    def reset(self) -> None:
        with self._cond:
            self.growth = 0
            self.release_all()
            self.calls.clear()
            self.anthropic_requests.clear()
            self.agent_replies.clear()
            self._failures.clear()
            self.hold = False
            self.latency_seconds = 0.0
            self.trickle_seconds = 0.0
            self._trickle_abort.set()  # ends replies still trickling; new ones get a new event
            self._trickle_abort = threading.Event()

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        retry_after: str | None = None,
        message: str | None = None,
    ) -> None:
        """The next ``count`` calls answer ``status`` (after being released, if held), with
        ``message`` as the error's message (default ``injected <status>``)."""
        with self._cond:
            self._failures.extend(_Failure(status, retry_after, message) for _ in range(count))

    def _register(self, body: dict[str, Any], job: dict[str, Any]) -> Call:
        with self._cond:
            call = Call(body=body, job=job)
            if self._failures:
                failure = self._failures.pop(0)
                call.status, call.retry_after = failure.status, failure.retry_after
                call.error_message = failure.message
            if not self.hold:
                call.released.set()
            self.calls.append(call)
            self._cond.notify_all()
            return call

    def wait_for_calls(self, count: int, timeout: float = 10.0) -> list[Call]:
        """Block until at least ``count`` calls have arrived (run it in a thread from async code)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls) >= count, timeout=timeout):
                raise TimeoutError(f"expected {count} LLM calls, got {len(self.calls)}")
            return list(self.calls)

    def release(self, index: int = -1, *, answer: str | None = None, status: int = 200) -> Call:
        with self._cond:
            call = self.calls[index]
            call.answer = answer
            if status != 200:
                call.status = status
            call.released.set()
            return call

    def release_all(self) -> None:
        for call in self.calls:
            call.released.set()


def _grown(call: Call, text: str, growth: int) -> str:
    """A long summary: the prompt's previous summary (none for a compaction) plus ``growth``
    words of filler."""
    previous = _PREVIOUS.search(call.user)
    kept = previous.group(1) if previous and call.job.get("kind") != "compaction" else ""
    return " ".join(p for p in (kept, text, " ".join(["detail"] * growth)) if p)


def _anthropic_message(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _tokens(body: dict[str, Any]) -> int:
    """The prompt's size in "tokens": a character count over 4, as a usage report needs one."""
    return sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4


def _completion(
    model: str, text: str, prompt_tokens: int = 0, message: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A chat completion answering ``text``, or ``message`` (an assistant message, tool calls and
    all) when given."""
    message = message or {"role": "assistant", "content": text}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(text) // 4,
            "total_tokens": prompt_tokens + len(text) // 4,
        },
    }
