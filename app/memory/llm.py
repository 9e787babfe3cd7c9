"""The model behind summaries: any server that speaks OpenAI's Chat Completions (OpenAI, Azure
gateways, Ollama, vLLM). Which prompt to send is the policy's business; with no model
configured the service uses each policy's offline fallback instead."""

from __future__ import annotations

import asyncio
import re
from contextvars import ContextVar
from typing import Any

import openai
import orjson
from openai import AsyncOpenAI

from app import metrics
from app.memory.types import Prompt, SummaryJob

# Sent with every request: which summary it is for, in a form tests and gateways can read
# without parsing the prompt. Providers ignore unknown headers.
JOB_HEADER = "X-Memory-Job"

# The default bound of a whole call, retries included (MEMORY_LLM_CALL_TIMEOUT_SECONDS).
DEFAULT_CALL_TIMEOUT_SECONDS = 180.0


class EmptySummaryError(RuntimeError):
    """The model answered with no text; the memory row is marked failed rather than kept empty."""


class LLMCallTimeoutError(RuntimeError):
    """The whole call (every attempt, every backoff) ran past MEMORY_LLM_CALL_TIMEOUT_SECONDS: an
    upstream that trickles its answer never trips the per-read timeout."""


# Statuses with which a server refuses the request itself (malformed, too large, unprocessable):
# the same request would be refused again. Any other failure (no answer, 429, 5xx, 401/403/404
# of a misconfigured key or model) says the model is unavailable, not that this summary cannot
# be made.
REJECTED_STATUSES = frozenset({400, 413, 422})


class LLMRequestError(RuntimeError):
    """The model's server refused or failed the request. The message (which ends up in
    memory.error and in logs) is the error's class, HTTP status, machine-readable type/code and
    the server's own message, unless that quotes the request: some gateways put the offending
    content (message text) in their error messages. ``timed_out``: an attempt's read or connect
    timed out (after its retries). ``rejected``: the server refused this request as such
    (REJECTED_STATUSES)."""

    def __init__(self, message: str, *, timed_out: bool = False, rejected: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.rejected = rejected


# Error types and codes worth keeping (``rate_limit_exceeded``, ``context_length_exceeded``).
_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# A server message sharing this many characters in a row with the request quotes it.
_QUOTE_CHARS = 12
_MAX_MESSAGE_CHARS = 300


def _quotes(message: str, request_text: str) -> bool:
    return any(message[i : i + _QUOTE_CHARS] in request_text for i in range(len(message) - _QUOTE_CHARS + 1))


def describe_api_error(exc: openai.APIError, request_text: str) -> str:
    """``RateLimitError (HTTP 429, code rate_limit_exceeded): Rate limit reached for ...``. The
    server's message is left out when it quotes ``request_text`` (the content sent) or is not a
    string; errors with no response carry the client's own fixed message
    (``APITimeoutError: Request timed out.``)."""
    if isinstance(exc, openai.APIStatusError):
        parts = [f"HTTP {exc.status_code}"]
        for label, value in (("type", exc.type), ("code", exc.code)):
            if isinstance(value, str) and _TOKEN.fullmatch(value):
                parts.append(f"{label} {value}")
        error = exc.body if isinstance(exc.body, dict) else {}
        message = error.get("message")
        text = f"{type(exc).__name__} ({', '.join(parts)})"
        if not isinstance(message, str) or not message.strip():
            return text
        message = " ".join(message.split())[:_MAX_MESSAGE_CHARS]
        if _quotes(message, request_text):
            return f"{text}: (the server's message quotes the request; withheld)"
        return f"{text}: {message}"
    if isinstance(exc, openai.APIConnectionError):  # timeouts included; fixed messages
        return f"{type(exc).__name__}: {exc.message}"
    return type(exc).__name__


def storable(text: str) -> str:
    """The model's text as PostgreSQL can store it: no NUL characters, and an unpaired surrogate
    (a bad ``\\ud800`` escape in the JSON) replaced by U+FFFD, instead of a failed summary."""
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


# The HTTP attempts of the call in progress in this task (each summary is a task of its own).
_attempts: ContextVar[list[int] | None] = ContextVar("llm_attempts", default=None)


class _CountingOpenAI(AsyncOpenAI):
    """The openai client, counting the HTTP attempts of each call (its retries are its own)
    through the hook it offers subclasses for every request it builds."""

    async def _prepare_request(self, request: Any) -> None:
        await super()._prepare_request(request)
        attempts = _attempts.get()
        if attempts is not None:
            attempts[0] += 1


def _count_usage(completion: Any) -> None:
    usage = getattr(completion, "usage", None)
    for direction, field in (("input", "prompt_tokens"), ("output", "completion_tokens")):
        tokens = getattr(usage, field, None)
        if isinstance(tokens, int) and tokens > 0:
            metrics.LLM_TOKENS.labels(direction).inc(tokens)


class ChatModel:
    """Chat Completions with a plain-text answer. Retries (timeouts, 429, 5xx) use the openai
    client's own exponential backoff with jitter, which honours Retry-After. ``timeout_seconds``
    bounds each attempt's connect and each read; ``call_timeout_seconds`` the whole call."""

    name = "openai"

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str | None,
        timeout_seconds: float,
        max_retries: int,
        call_timeout_seconds: float = DEFAULT_CALL_TIMEOUT_SECONDS,
    ) -> None:
        self._client = _CountingOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
            # The SDK's aiohttp transport: at 64 calls in flight it cost ~3 ms of CPU per call
            # where the default httpx one cost ~5 ms (whose pool looks at every connection on
            # each request), and a worker's CPU is what bounds its summaries per second.
            http_client=openai.DefaultAioHttpClient(),
        )
        self._model = model
        self.call_timeout_seconds = call_timeout_seconds

    async def summarize(self, prompt: Prompt, job: SummaryJob) -> str:
        """The model's summary; counts the call by outcome, its retries and its tokens."""
        attempts = [0]
        token = _attempts.set(attempts)
        outcome: str | None = "error"
        try:
            text = await self._summarize(prompt, job)
            outcome = "ok"
            return text
        except asyncio.CancelledError:
            outcome = None  # shutting down: no outcome
            raise
        except EmptySummaryError:
            outcome = "empty"
            raise
        except LLMCallTimeoutError:
            outcome = "timeout"
            raise
        except LLMRequestError as exc:
            outcome = "timeout" if exc.timed_out else "error"
            raise
        finally:
            _attempts.reset(token)
            if outcome is not None:
                metrics.LLM_CALLS.labels(outcome).inc()
            if attempts[0] > 1:
                metrics.LLM_RETRIES.inc(attempts[0] - 1)

    async def _summarize(self, prompt: Prompt, job: SummaryJob) -> str:
        marker = {
            "memory_id": job.memory_id,
            "conversation_id": job.conversation_id,
            "kind": job.kind,
            "start_sequence": job.start_sequence,
            "end_sequence": job.end_sequence,
        }
        deadline = asyncio.timeout(self.call_timeout_seconds)
        try:
            async with deadline:
                completion = await self._client.chat.completions.create(
                    model=self._model,
                    messages=[
                        {"role": "system", "content": prompt.system},
                        {"role": "user", "content": prompt.user},
                    ],
                    temperature=0.2,
                    extra_headers={JOB_HEADER: orjson.dumps(marker).decode()},
                )
        except TimeoutError:
            if not deadline.expired():
                raise
            raise LLMCallTimeoutError(f"LLM call exceeded {self.call_timeout_seconds:g} s") from None
        except openai.APIError as exc:
            # `from None`: a logged traceback would print the original, message included.
            raise LLMRequestError(
                describe_api_error(exc, prompt.user),
                timed_out=isinstance(exc, openai.APITimeoutError),
                rejected=isinstance(exc, openai.APIStatusError) and exc.status_code in REJECTED_STATUSES,
            ) from None
        _count_usage(completion)
        text = (completion.choices[0].message.content or "").strip() if completion.choices else ""
        if not text:
            raise EmptySummaryError("the model returned an empty summary")
        return storable(text)[: job.max_chars]

    async def aclose(self) -> None:
        await self._client.close()
