"""The model behind summaries: any server that speaks OpenAI's Chat Completions (OpenAI, Azure
gateways, Ollama, vLLM). Which prompt to send is the policy's business; with no model
configured the service uses each policy's offline fallback instead."""

from __future__ import annotations

import orjson
from openai import AsyncOpenAI

from app.memory.types import Prompt, SummaryJob

# Sent with every request: which summary it is for, in a form tests and gateways can read
# without parsing the prompt. Providers ignore unknown headers.
JOB_HEADER = "X-Memory-Job"


class EmptySummaryError(RuntimeError):
    """The model answered with no text; the memory row is marked failed rather than kept empty."""


class ChatModel:
    """Chat Completions with a plain-text answer. Retries (timeouts, 429, 5xx) use the openai
    client's own exponential backoff with jitter, which honours Retry-After."""

    name = "openai"

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str | None,
        timeout_seconds: float,
        max_retries: int,
    ) -> None:
        self._client = AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_seconds, max_retries=max_retries
        )
        self._model = model

    async def summarize(self, prompt: Prompt, job: SummaryJob) -> str:
        marker = {
            "memory_id": job.memory_id,
            "conversation_id": job.conversation_id,
            "kind": job.kind,
            "start_sequence": job.start_sequence,
            "end_sequence": job.end_sequence,
        }
        completion = await self._client.chat.completions.create(
            model=self._model,
            messages=[
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
            temperature=0.2,
            extra_headers={JOB_HEADER: orjson.dumps(marker).decode()},
        )
        text = (completion.choices[0].message.content or "").strip() if completion.choices else ""
        if not text:
            raise EmptySummaryError("the model returned an empty summary")
        return text[: job.max_chars]

    async def aclose(self) -> None:
        await self._client.close()
