"""Domain errors of the query service and the one table that maps them to HTTP status codes."""

from indexer.shortlist import ShortlistUnavailableError
from models.networks.preprocess import ImageTooLargeError, InvalidImageError


class ServiceError(Exception):
    """Base of the errors the service answers with a 4xx/5xx and the error's own message."""


class InvalidQueryError(ServiceError, ValueError):
    """The request is well-formed but asks for something the service cannot do (422)."""


class PayloadTooLargeError(ServiceError, ValueError):
    """The request body or the uploaded image exceeds a configured byte limit (413)."""


class UnsupportedMediaTypeError(ServiceError, ValueError):
    """The request body or upload has a content type the endpoint does not accept (415)."""


class IndexUnavailableError(ServiceError):
    """No index is loaded for the gallery the request searches (503; retry later)."""


class ItemNotFoundError(ServiceError, LookupError):
    """No item of the active gallery has this id, or its image cannot be served (404)."""


class AuthenticationError(ServiceError):
    """A required API key is missing or wrong (401)."""


class TooManyFailedAttemptsError(ServiceError):
    """Too many failed authentications from this client or with this key (429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverloadedError(ServiceError):
    """The request queue is full or the service is shutting down (503; retry later)."""


# The one status table: first matching row wins, so subclasses come before their bases.
STATUS_TABLE: tuple[tuple[type[Exception], int, str], ...] = (
    (ImageTooLargeError, 413, "image_too_large"),
    (InvalidImageError, 422, "invalid_image"),
    (PayloadTooLargeError, 413, "payload_too_large"),
    (UnsupportedMediaTypeError, 415, "unsupported_media_type"),
    (InvalidQueryError, 422, "invalid_query"),
    (ItemNotFoundError, 404, "not_found"),
    (IndexUnavailableError, 503, "index_unavailable"),
    (OverloadedError, 503, "overloaded"),
    (ShortlistUnavailableError, 503, "shortlist_unavailable"),  # Milvus unreachable
    (AuthenticationError, 401, "unauthorized"),
    (TooManyFailedAttemptsError, 429, "too_many_failed_attempts"),
)

HANDLED_ERRORS: tuple[type[Exception], ...] = tuple(row[0] for row in STATUS_TABLE)


def status_of(error: Exception) -> tuple[int, str]:
    """HTTP status and short machine-readable code for a domain error (500 if not in the table)."""
    for error_type, status, code in STATUS_TABLE:
        if isinstance(error, error_type):
            return status, code
    return 500, "internal_error"
