"""Errors the service layer raises; the API maps them to HTTP statuses."""


class ServiceError(Exception):
    """Base class; `str(error)` is a message meant for a person."""


class NotFound(ServiceError):
    """The object does not exist or the caller may not see it (404, never 403)."""


class Invalid(ServiceError):
    """The request is well-formed but cannot be accepted (422)."""


class Unauthenticated(ServiceError):
    """The API token is missing, unknown or revoked (401)."""


class Conflict(ServiceError):
    """The request conflicts with current state (409)."""


class LostLeadership(ServiceError):
    """The scheduler's epoch is no longer current: it must stop writing."""


class DuplicateKey(Conflict):
    """A unique key (e.g. an idempotency key) was taken by a concurrent request."""


class StoreUnavailable(Exception):
    """The database cannot be reached or is busy right now; nothing was written, retry later.

    Not a `ServiceError`: it says nothing about the request, so no consumer may turn it into a
    rejection or a dead letter, and the API answers 503 with `Retry-After`."""
