"""The one table from typed errors (swarm/errors.py) to gRPC status codes, and how a handler aborts with one."""

from __future__ import annotations

import logging

import grpc

from swarm.errors import (
    AlreadyExists,
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    ModelFileError,
    NoFeasiblePlan,
    NotFound,
    ResourceExhausted,
    SchedulerError,
    SwarmError,
)

log = logging.getLogger("swarm.server")
MAX_ERROR_CHARS = 2000  # an error's text: the field path, the problem, the fix, and a short prefix of the input

# The first entry an error is an instance of wins: subclasses before their bases.
CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelFileError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NoFeasiblePlan, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (SchedulerError, grpc.StatusCode.UNAVAILABLE),
    (SwarmError, grpc.StatusCode.FAILED_PRECONDITION),
]


def code(e: BaseException) -> grpc.StatusCode:
    """The one table: a typed error's code; anything else is a bug, reported as INTERNAL (never UNKNOWN)."""
    return next((c for t, c in CODES if isinstance(e, t)), grpc.StatusCode.INTERNAL)


def details(e: BaseException) -> str:
    text = str(e) if isinstance(e, SwarmError) else f"internal error ({type(e).__name__}); the server log has it"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 30] + f"... ({len(text):,} characters)"


def abort(context: grpc.ServicerContext, e: Exception) -> None:
    if not isinstance(e, SwarmError) and context.code() is not None:
        raise e  # context.abort() already ran (it raises a bare Exception): keep its status
    if not isinstance(e, SwarmError):
        log.error("handler failed: %s: %s", type(e).__name__, str(e)[:MAX_ERROR_CHARS], exc_info=e)
    context.abort(code(e), details(e))
