"""What a failed call raises."""

from __future__ import annotations

from typing import Any

import httpx


class MemoryServiceError(Exception):
    """The service answered with an error status.

    ``code`` is the service's machine-readable code (one per status: ``not_found``, ``conflict``,
    ``invalid_request``, ...; ``http_error`` when the body carried none, as in a proxy's page),
    ``detail`` what went wrong (a string, or for ``invalid_request`` the list of
    ``{"loc", "msg", "type"}`` naming each bad field), ``status_code`` the HTTP status."""

    def __init__(
        self, *, status_code: int, code: str, detail: Any, request_id: str | None, body: Any
    ) -> None:
        super().__init__(f"{status_code} {code}: {detail}")
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.request_id = request_id
        self.body = body

    @classmethod
    def from_response(cls, response: httpx.Response) -> MemoryServiceError:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            code, detail = body["code"], body.get("detail")
        else:
            code, detail = "http_error", body
        kind = _BY_STATUS.get(response.status_code, cls)
        return kind(
            status_code=response.status_code,
            code=code,
            detail=detail,
            request_id=response.headers.get("x-request-id"),
            body=body,
        )


class NotFoundError(MemoryServiceError):
    """404: an unknown conversation or memory (another tenant's too)."""


class ConflictError(MemoryServiceError):
    """409: an id taken, an Idempotency-Key reused with another body, a summary that cannot start
    now, or a context that cannot be rendered for a provider yet."""


class InvalidRequestError(MemoryServiceError):
    """422: ``detail`` lists each bad field."""


class AuthenticationError(MemoryServiceError):
    """401 (no key, or an unknown one) or 403 (a tenant's key on the admin endpoints)."""


class UnavailableError(MemoryServiceError):
    """503: the database is unavailable (retried first: see ``max_retries``)."""


_BY_STATUS: dict[int, type[MemoryServiceError]] = {
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidRequestError,
    503: UnavailableError,
}
