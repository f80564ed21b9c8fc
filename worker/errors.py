"""Typed errors of the worker layer (dependency-free: no compiled module, no Ray, nothing from swarm/).

Ray carries these from a worker actor to the driver, so they live below swarm/;
`swarm.errors` re-exports them so callers find every typed error in one place.
The engine's `KvBudgetError` is defined by the compiled module (worker/engine.py).
"""

from __future__ import annotations


class ModelNotFoundError(FileNotFoundError):
    """A model path or the default model package is missing."""


class MetadataError(ValueError):
    """The GGUF tokenizer metadata is missing, malformed or unsupported."""


class SessionError(ValueError):
    """A request about a session that cannot be honoured (busy, unknown, bad tokens)."""


class DeviceError(ValueError):
    """A backend or device this host cannot provide (unknown backend, Vulkan not built, no driver, no such index)."""
