"""The OpenAPI document: what FastAPI derives from the routes, plus what it cannot see: the API
keys (checked by app.edge, not by a dependency) as a security scheme, and what any path may
answer. Response docs live in app.api.responses, examples in app.api.examples."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app import schemas
from app.edge import OPEN_PATHS

DESCRIPTION = """\
Rounds in, bounded context out: summaries made by a memory policy per conversation (sliding \
window, rolling blocks), with a gap fallback.

**Errors** are JSON `{"detail": ..., "code": ...}`, one `code` per status; each operation lists \
the ones it can answer. Whatever the path, a method it does not serve is a 405 \
(`method_not_allowed`) whose `Allow` header lists the ones it does, an unknown path a 404 \
(`not_found`, a trailing slash is not redirected), and a request that is not HTTP a 400 (the \
connection is then closed). Every response carries `X-Request-ID`: the request's own (1-128 \
printable characters) or a new one.
"""

TAGS = [
    {"name": "conversations", "description": "Rounds in: conversations, their policy and messages."},
    {"name": "context", "description": "Context out: what an agent reads, and the memories behind it."},
    {"name": "ops", "description": "Seed 004's operational queries, retries and the runner's load."},
    {"name": "events", "description": "A conversation's events as Server-Sent Events, resumable."},
    {"name": "webhooks", "description": "A tenant's events POSTed, signed, to its endpoints."},
    {"name": "health", "description": "Liveness and readiness; never need an API key."},
]

# How EdgeMiddleware accepts a key (app.edge.authenticate): either header.
SECURITY_SCHEMES = {
    "apiKey": {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "A key of MEMORY_API_KEYS; it selects the tenant.",
    },
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "The same key, as `Authorization: Bearer <key>`.",
    },
}


def operation_id(route: APIRoute) -> str:
    """The handler's name (`append_messages`, `get_context`): FastAPI's default appends the path
    and method (`append_messages_conversations__conversation_id__messages_post`)."""
    return route.name


def install(app: FastAPI, *, api_keys: bool) -> None:
    """Make ``app.openapi()`` add the security scheme when keys are on (the health checks stay
    open) and list each operation's responses by status."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _complete(generate(), api_keys=api_keys)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# The models whose JSON schemas are the document's components, by name.
MODELS = {
    name: model
    for name, model in vars(schemas).items()
    if isinstance(model, type) and issubclass(model, BaseModel)
}


def _complete(schema: dict[str, Any], *, api_keys: bool) -> dict[str, Any]:
    _restore_examples(schema)
    if api_keys:
        schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        schema["security"] = [{name: []} for name in SECURITY_SCHEMES]
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            operation["responses"] = dict(sorted(operation["responses"].items()))
            if api_keys and path in OPEN_PATHS:
                operation["security"] = []
    return schema


def _restore_examples(schema: dict[str, Any]) -> None:
    """FastAPI drops every null from the document (it encodes it with exclude_none), the ones of
    examples too, which then lack required fields: put the models' own examples back."""
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        model = MODELS.get(name)
        extra = model.model_config.get("json_schema_extra") if model is not None else None
        if isinstance(extra, dict) and "examples" in component:
            component["examples"] = extra["examples"]
