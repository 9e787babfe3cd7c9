"""What an agent reads at the start of a round."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from app.api import examples
from app.api.deps import ConversationIdPath, ServiceDep, SettingsDep, TenantDep
from app.api.responses import errors
from app.memory import formats
from app.memory.policies import renderer
from app.schemas import AnthropicContextOut, ContextOut, MemoriesOut, OpenAIContextOut

router = APIRouter(tags=["context"])

# The README's walk-through context in every format, rendered by the code that renders contexts.
_RENDERER = renderer(str(examples.CONTEXT["policy"]))
_EXAMPLES: dict[str, dict[str, Any]] = {
    "application/json": {
        "json": examples.CONTEXT,
        "openai": formats.to_openai(examples.CONTEXT),
        "anthropic": formats.to_anthropic(examples.CONTEXT),
    },
    "text/plain": {"text": _RENDERER.render_text(examples.CONTEXT)},
    "text/markdown": {"markdown": _RENDERER.render_markdown(examples.CONTEXT)},
}
_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The context in the asked format: JSON for json, openai and anthropic; "
        "text for text and markdown.",
        "content": {
            media: {
                **({} if media == "application/json" else {"schema": {"type": "string"}}),
                "examples": {f"format={name}": {"value": value} for name, value in values.items()},
            }
            for media, values in _EXAMPLES.items()
        },
    }
}


@router.get(
    "/conversations/{conversation_id}/context",
    response_model=ContextOut | OpenAIContextOut | AnthropicContextOut,
    responses=_OK
    | errors(
        (
            409,
            "The context cannot be sent to that provider as it stands (tool calls still waiting for "
            "their results).",
            "the context cannot be rendered for openai: tool call(s) call_1 have no result yet: the "
            "provider needs each call's result after it, so post the results (the next round starts "
            "with them) and read again",
        ),
        422,
        503,
    ),
)
async def get_context(
    conversation_id: ConversationIdPath,
    service: ServiceDep,
    settings: SettingsDep,
    tenant: TenantDep,
    format: Annotated[
        Literal["json", "text", "markdown", "openai", "anthropic"],
        Query(
            description="`json` (this shape); `text` or `markdown`: the policy's rendering for a "
            "prompt; `openai`: `{messages}` for Chat Completions; `anthropic`: `{system, messages}` "
            "for the Messages API. Every form carries X-Context-Tokens and X-Context-Truncated."
        ),
    ] = "json",
    max_tokens: Annotated[
        int | None,
        Query(
            ge=1,
            le=10_000_000,
            description="Fit the context into this many tokens: the oldest raw rounds go first (whole "
            "rounds and tool exchanges), never the newest; `truncated` and `omitted_messages` say so.",
        ),
    ] = None,
    context_window: Annotated[
        int | None,
        Query(ge=1, le=100_000_000, description="A model's window: adds the share of it the context uses."),
    ] = None,
    wait_for_pending: Annotated[
        float | None,
        Query(
            ge=0,
            allow_inf_nan=False,
            le=3600,
            description="Seconds (capped by MEMORY_CONTEXT_MAX_WAIT_SECONDS): when a summary is processing "
            "(or due, waiting for a runner), wait until it completes or fails, or this time passes, then "
            "answer. `waited` and `pending` "
            "(and the X-Context-Waited / X-Context-Pending headers) say what happened.",
        ),
    ] = None,
) -> Response:
    """The summaries the conversation's policy shows plus every message after them. While a
    newer summary is processing, the previous ones with more raw messages: never blocked, never
    missing a message. A conversation never written to reads as an empty context."""
    # PostgreSQL builds the JSON (the hot read path); the response model documents its shape.
    body, context = await service.get_context(
        tenant_id=tenant,
        conversation_id=conversation_id,
        format=format,
        max_tokens=max_tokens,
        context_window=context_window,
        wait_for_pending=None
        if wait_for_pending is None
        else min(wait_for_pending, settings.MEMORY_CONTEXT_MAX_WAIT_SECONDS),
    )
    headers = {
        "X-Context-Tokens": str(context["tokens"]["total"]),
        "X-Context-Truncated": "true" if context["truncated"] else "false",
    }
    if wait_for_pending is not None:
        headers["X-Context-Waited"] = "true" if context["waited"] else "false"
        headers["X-Context-Pending"] = "true" if context["pending"] else "false"
    media = {"text": "text/plain; charset=utf-8", "markdown": "text/markdown; charset=utf-8"}
    return Response(content=body, media_type=media.get(format, "application/json"), headers=headers)


@router.get(
    "/conversations/{conversation_id}/memories", response_model=MemoriesOut, responses=errors(404, 422, 503)
)
async def list_memories(
    conversation_id: ConversationIdPath, service: ServiceDep, tenant: TenantDep
) -> dict[str, Any]:
    """The version chain: every memory of the conversation, newest window first."""
    memories = await service.list_memories(tenant_id=tenant, conversation_id=conversation_id)
    return {"conversation_id": conversation_id, "memories": memories}
