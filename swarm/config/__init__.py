"""Swarm config: YAML -> typed, frozen objects; every error names its field path.

The dataclasses (swarm/config/definition.py, with the engine's own Sampling and EngineSettings) are
the single definition of the format: `load_config` walks them to validate a file (load.py, with the
YAML limits in document.py and the checks across fields in checks.py), and `json_schema()` walks
them to produce the JSON Schema shipped in configs/swarm.schema.json (schema.py; regenerate it with
`python -m swarm.config`).
"""

from swarm.config.checks import NAME
from swarm.config.definition import (
    LIMITS,
    AgentGroup,
    Bytes,
    ConfigLimits,
    EngineOptions,
    Geometry,
    Lifecycle,
    Model,
    Policy,
    QualityFloor,
    SwarmConfig,
    Worker,
    as_float32,
    config_fields,
    show,
)
from swarm.config.document import parse_document
from swarm.config.load import load_config, load_data, parse_bytes, parse_config
from swarm.config.schema import json_schema, schema_path
from worker.formats import KV_FORMATS
from worker.sampling import (
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    Sampling,
)

__all__ = [
    "KV_FORMATS",
    "LIMITS",
    "MAX_REPETITION_PENALTY",
    "MAX_SEED",
    "MAX_TEMPERATURE",
    "MAX_TOP_K",
    "MIN_REPETITION_PENALTY",
    "NAME",
    "AgentGroup",
    "Bytes",
    "ConfigLimits",
    "EngineOptions",
    "Geometry",
    "Lifecycle",
    "Model",
    "Policy",
    "QualityFloor",
    "Sampling",
    "SwarmConfig",
    "Worker",
    "as_float32",
    "config_fields",
    "json_schema",
    "load_config",
    "load_data",
    "parse_bytes",
    "parse_config",
    "parse_document",
    "schema_path",
    "show",
]
