"""Request-level failures both edges translate (HTTP status / gRPC code)."""

from __future__ import annotations


class InputError(ValueError):
    """The request is well-formed but breaks a server limit or names something unknown (400 / INVALID_ARGUMENT)."""


class Overloaded(Exception):
    """Admission control refused the request (429 + Retry-After / RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(Exception):
    """The request's deadline passed before it finished (504 / DEADLINE_EXCEEDED)."""
