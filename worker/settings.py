"""Engine settings that change memory and speed: defined once (dependency-free: no compiled module).

`worker.engine.Engine`'s defaults, the planner's `EngineSettings` and a swarm config's `engine:`
section (validation and JSON Schema, from the fields' metadata) all come from this class.
NOTE: native/bindings.cpp repeats the defaults for callers of `_native.Engine` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BLOCK_TOKENS = 64  # positions per KV block a config may ask for
MAX_THREADS = 256  # compute threads per worker
MAX_BATCH_TOKENS = 1 << 14  # tokens per engine step (its scratch grows with it)


@dataclass(frozen=True)
class EngineSettings:
    """Engine options that change memory (the arguments of worker.engine.Engine of the same names)."""

    block_tokens: int = field(default=16, metadata={"doc": "positions per KV block", "min": 1, "max": MAX_BLOCK_TOKENS})
    max_batch_tokens: int = field(
        default=256, metadata={"doc": "tokens per engine step", "min": 1, "max": MAX_BATCH_TOKENS}
    )
    threads: int = field(default=2, metadata={"doc": "compute threads per worker", "min": 1, "max": MAX_THREADS})


DEFAULT_ENGINE = EngineSettings()
