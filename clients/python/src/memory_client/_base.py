"""Settings both clients share."""

from __future__ import annotations

import os

from memory_client._version import __version__

DEFAULT_URL = "http://127.0.0.1:8000"


def base_url(url: str | None) -> str:
    """``url``, else ``MEMORY_SERVICE_URL``, else the service's default address."""
    return url or os.environ.get("MEMORY_SERVICE_URL") or DEFAULT_URL


def headers(api_key: str | None) -> dict[str, str]:
    """``api_key``, else ``MEMORY_SERVICE_API_KEY``: a tenant's key (or the admin key), sent as
    a bearer token."""
    key = api_key if api_key is not None else os.environ.get("MEMORY_SERVICE_API_KEY")
    sent = {"User-Agent": f"memory-service-client/{__version__}"}
    if key:
        sent["Authorization"] = f"Bearer {key}"
    return sent
