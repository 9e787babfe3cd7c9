"""One error base class; the app turns it into a JSON body ``{"detail": ..., "code": ...}``."""

from __future__ import annotations

from typing import ClassVar


class AppError(Exception):
    status_code = 400
    code = "bad_request"
    # Response headers the status calls for.
    headers: ClassVar[dict[str, str] | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def detail(self) -> object:
        """The body's ``detail``."""
        return self.message


class NotFound(AppError):
    status_code = 404
    code = "not_found"


class Conflict(AppError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(AppError):
    status_code = 413
    code = "payload_too_large"


class Unauthorized(AppError):
    status_code = 401
    code = "unauthorized"
    headers: ClassVar[dict[str, str] | None] = {"WWW-Authenticate": "Bearer"}


class Invalid(AppError):
    """A well-formed request that contradicts what the conversation holds (a tool result naming
    no earlier call, say): a 422 shaped like a validation error, naming the field."""

    status_code = 422
    code = "invalid_request"

    def __init__(self, message: str, *, loc: list[str | int]) -> None:
        super().__init__(message)
        self.loc = loc

    @property
    def detail(self) -> object:
        return [{"loc": self.loc, "msg": self.message, "type": "value_error"}]


class TooManyStreams(AppError):
    """Every event stream this process allows is open (MEMORY_EVENTS_MAX_STREAMS). Streams close
    as their clients leave: a few seconds is a fair wait (a retry may reach another replica)."""

    status_code = 429
    code = "too_many_requests"
    headers: ClassVar[dict[str, str] | None] = {"Retry-After": "5"}
