"""Typed errors of the swarm layer, in one place.

Every message names what is wrong and says how to fix it. `None` from a
planner helper means "does not fit"; an exception means bad input or a bug.
The worker layer's errors are defined in `worker.errors` (Ray carries them, and
worker/ imports nothing from swarm/) and re-exported here.
"""

from __future__ import annotations

from worker.errors import DeviceError, MetadataError, ModelNotFoundError, SessionError

__all__ = [
    "AlreadyExists", "CallRefused", "ConfigError", "DeviceError", "FailedPrecondition", "InvalidArgument",
    "MetadataError", "ModelFileError", "ModelNotFoundError", "NoFeasiblePlan", "NotFound", "PortInUse",
    "ResourceExhausted", "SchedulerError", "SessionError", "StoreFull", "SwarmError", "WorkerLost",
]  # fmt: skip


class SwarmError(Exception):
    """Base of every error kvswarm raises on purpose."""


class ConfigError(SwarmError, ValueError):
    """A config file or value is invalid; the message starts with the field path."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"{path}: {problem}. To fix: {fix}")


class ModelFileError(SwarmError, ValueError):
    """A GGUF file is missing, truncated or not a model kvswarm can run."""


class NoFeasiblePlan(SwarmError):
    """No assignment of agents to workers fits; the message says what would."""


class NotFound(SwarmError, LookupError):
    """A swarm, agent, group or job that does not exist."""


class AlreadyExists(SwarmError):
    """A swarm name that is already running."""


class FailedPrecondition(SwarmError):
    """The request is valid but the target is not in a state to take it (stopped swarm, finished agent)."""


class ResourceExhausted(SwarmError):
    """A job cannot be admitted: no room in the reservation, the plan or the queue; the message says what fits."""


class InvalidArgument(SwarmError, ValueError):
    """A request field is wrong; the message starts with its path."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}")


class StoreFull(ResourceExhausted):
    """The disk under the server's --out is full: nothing more can be recorded, so no new job is accepted."""


class SchedulerError(SwarmError):
    """Ray could not do what the plan needs (no node offers a resource, a worker died)."""


class WorkerLost(SchedulerError):
    """A worker actor died or stopped answering."""


class CallRefused(SchedulerError):
    """A running worker raised on one call (a turn it cannot take); the worker itself is fine."""


class PortInUse(SwarmError):
    """The server cannot listen on its address: the port is taken or not allowed."""
