"""cronoq's exception hierarchy: one class per stable error code.

Every error cronoq raises is a :class:`Error` with a ``code``
(``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``, ...). Branch on the class or on
``code``, never on the message. :class:`InvalidArgument` is also a
``ValueError`` and a ``TypeError``, so code that catches those for bad
arguments keeps working.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class Error(Exception):
    """A cronoq error with a stable ``code``."""

    code: str = "UNKNOWN"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class InvalidArgument(Error, ValueError, TypeError):
    """A malformed argument; nothing was changed."""

    code = "INVALID_ARGUMENT"


class Unauthenticated(Error):
    """Missing or bad credentials."""

    code = "UNAUTHENTICATED"


class PermissionDenied(Error):
    """The credentials do not allow this (a label, a pool, a role)."""

    code = "PERMISSION_DENIED"


class NotFound(Error):
    """No such task (or it finished too long ago to be remembered)."""

    code = "NOT_FOUND"


class AlreadyExists(Error):
    """Something with this id already exists."""

    code = "ALREADY_EXISTS"


class ResourceExhausted(Error):
    """A limit was reached."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """Not possible in the current state (no executor for the pool, the task already finished, ...)."""

    code = "FAILED_PRECONDITION"


class Unavailable(Error):
    """Nobody answered (no server, no connection, a timeout); try again later."""

    code = "UNAVAILABLE"


class Internal(Error):
    """A bug or an unreadable answer."""

    code = "INTERNAL"


CLASSES_BY_CODE: Dict[str, Type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        Unavailable,
        Internal,
    )
}


class PermanentError(Exception):
    """Raise from an executor or handler to fail the task at once, without retries."""
