"""How a sequence picks its next tokens: the one `Sampling` (dependency-free: no compiled module).

A swarm config's `agents[].sampling` and the engine's per-turn sampling are this class. Its fields'
metadata is what swarm/config walks to validate a config and write its JSON Schema: `doc` and the
bounds below. Fields marked `PER_TURN` are set by the runtime for each turn, never by a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Sampling bounds, as the native engine checks them (native/engine.cpp check_sampling) on the float32 value,
# narrowed where a wider value means nothing: one home, used for configs and for requests by the server.
MAX_TEMPERATURE = 100.0  # hotter is uniform noise
MAX_TOP_K = 1 << 20  # more than any vocabulary
MIN_REPETITION_PENALTY = 1e-3  # native needs > 0; below this a seen token's logit is scaled past float32's range
MAX_REPETITION_PENALTY = 10.0
MAX_SEED = (1 << 63) - 1  # seeds are seed + agent index + 7919 x turn, and must stay a uint64

# Metadata of a field the runtime sets per turn: not a config key, not in the JSON Schema.
PER_TURN: dict[str, Any] = {"per_turn": True}


@dataclass(frozen=True)
class Sampling:
    """How a sequence picks its next token. temperature 0 is greedy."""

    temperature: float = field(
        default=0.0, metadata={"doc": "0 is greedy", "min": 0, "max": MAX_TEMPERATURE, "float32": True}
    )
    top_k: int = field(default=0, metadata={"doc": "0 disables it", "min": 0, "max": MAX_TOP_K})
    top_p: float = field(
        default=1.0, metadata={"doc": "nucleus mass in (0, 1]", "exclusive_min": 0, "max": 1, "float32": True}
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata={
            "doc": "1 disables it",
            "min": MIN_REPETITION_PENALTY,
            "max": MAX_REPETITION_PENALTY,
            "float32": True,
        },
    )
    seed: int = field(default=0, metadata={"doc": "per-agent seeds are seed + agent index", "min": 0, "max": MAX_SEED})
    repeat_last_n: int = field(default=64, metadata=PER_TURN)  # tokens the repetition penalty looks back over
    max_new_tokens: int = field(default=-1, metadata=PER_TURN)  # per turn; -1: until a stop token or the context ends
    stop_tokens: tuple[int, ...] = field(default=(), metadata=PER_TURN)
