"""Errors the service layer raises; the API maps them to HTTP statuses."""


class ServiceError(Exception):
    """Base class; `str(error)` is a message meant for a person."""


class NotFound(ServiceError):
    """The object does not exist or the caller may not see it (404, never 403); also an object a
    request names (a queue, a team, a priority class) that does not exist."""


class Invalid(ServiceError):
    """The request breaks a rule about itself (422). Every such rule is stated in the OpenAPI (a
    pattern, a range, an `if`/`then`, or under `x-rules`), so a request the schema allows never gets
    one; what depends on the platform's state is `NotFound` or `Conflict`."""


# What a 401 says when a token was presented but is not (or no longer) one: never which.
UNKNOWN_TOKEN = "unknown or revoked API token"


class Unauthenticated(ServiceError):
    """The API token is missing, unknown or revoked (401)."""


class Conflict(ServiceError):
    """The request conflicts with current state (409): a name taken, an object in use, a limit
    below the stored guarantee, a gang no pool of the fleet could ever hold."""


class LostLeadership(ServiceError):
    """The scheduler's epoch is no longer current: it must stop writing."""


class DuplicateKey(Conflict):
    """A unique key (e.g. an idempotency key) was taken by a concurrent request."""


class StoreUnavailable(Exception):
    """The database cannot be reached or is busy right now; nothing was written, retry later.

    Not a `ServiceError`: it says nothing about the request, so no consumer may turn it into a
    rejection or a dead letter, and the API answers 503 with `Retry-After`."""


class TransactionConflict(StoreUnavailable):
    """The database aborted the transaction to settle a conflict with a concurrent one (`cause`:
    `deadlock`, or `serialization` for a serialization failure): nothing was written, and the same
    transaction run again is expected to succeed. Writers retry it at once (`service/retries.py`)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause
