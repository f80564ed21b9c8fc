"""The swarm config's dataclasses: the one definition of the format (their metadata drives checks and schema).

`agents[].sampling` is worker.sampling.Sampling and `engine` is worker.settings.EngineSettings: the
engine's own classes, whose fields carry the same metadata (doc and bounds).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Literal

from swarm.planner import DEFAULT_QUALITY_FLOOR
from worker.formats import KV_FORMATS
from worker.sampling import Sampling
from worker.settings import MAX_BATCH_TOKENS, MAX_THREADS, EngineSettings


class Bytes(int):
    """A byte count: an integer, or a string with a unit ("512MiB", "16GB")."""


# -- limits: what one swarm config may hold (a document from a client is untrusted input) ------------


@dataclass(frozen=True)
class ConfigLimits:
    """Every count and size a config may reach; past one, loading raises ConfigError saying which."""

    # The document: YAML text, and what it would become once its aliases are expanded (checked while
    # composing, before any value is built, so `*a` repeated 1,500 times costs nothing to refuse).
    max_document_bytes: int = 1 << 20  # 1 MiB of YAML: a swarm of every limit below fits with room to spare
    max_depth: int = 32  # nesting, after aliases (a valid config nests 4 levels: agents[0].sampling.seed)
    max_nodes: int = 100_000  # scalars, lists and mappings, after aliases
    max_expanded_chars: int = 4 << 20  # scalar text after aliases: what a 4 MiB request without aliases holds
    # The swarm.
    max_agents: int = 4096  # agents in one swarm, all groups together (the scale test runs 2,000)
    max_agents_per_group: int = 4096
    max_groups: int = 256
    max_workers: int = 256
    max_tasks: int = 1024  # configured turns per group
    max_text_chars: int = 256 << 10  # one system prompt or task (the API's limit on one job's messages)
    max_string_chars: int = 4096  # any other string (names are also held to 63 characters below)
    max_items: int = 1024  # any other list
    max_context: int = 1 << 21  # tokens (2M: more than any model's context; the model's own is checked too)
    max_bytes: int = 1 << 50  # a byte count (1 PiB: more than any device's memory)
    max_threads: int = MAX_THREADS  # compute threads per worker
    max_batch_tokens: int = MAX_BATCH_TOKENS  # tokens per engine step (its scratch grows with it)


LIMITS = ConfigLimits()


def as_float32(v: float) -> float:
    """v as the engine sees it (a C++ float): rounded, tiny values flushed to 0, huge ones to inf."""
    try:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)


def show(value: Any, limit: int = 64) -> str:
    """repr of client input, cut to a bounded prefix (an error message never echoes more)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def config_fields(cls: Any) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of a config dataclass a config may set: all but those the runtime sets per turn."""
    return tuple(f for f in dataclasses.fields(cls) if not f.metadata.get("per_turn"))


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class QualityFloor:
    max_kl: float | None = field(default=None, metadata=_doc("mean KL vs f32 KV at most this (nats)", min=0))
    min_top1: float | None = field(
        default=None, metadata=_doc("top-1 agreement with f32 KV at least this", min=0, max=1)
    )


@dataclass(frozen=True)
class AgentGroup:
    name: str = field(metadata=_doc("group name, unique in the swarm"))
    count: int = field(metadata=_doc("agents in the group", min=1, max=LIMITS.max_agents_per_group))
    context: int = field(
        metadata=_doc("tokens each agent must be able to reach (reserved up front)", min=1, max=LIMITS.max_context)
    )
    system_prompt: str = field(
        default="",
        metadata=_doc("shared by every agent of the group (its KV is held once)", max_chars=LIMITS.max_text_chars),
    )
    shared_prefix_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "override the system prompt's token count (planning without a tokenizer)", min=0, max=LIMITS.max_context
        ),
    )
    tasks: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "user turns each agent works through, in order",
            max_items=LIMITS.max_tasks,
            item_max_chars=LIMITS.max_text_chars,
        ),
    )
    inputs_from: str | None = field(default=None, metadata=_doc("group whose outputs feed this group's turns"))
    max_new_tokens: int = field(default=128, metadata=_doc("new tokens per turn", min=1, max=LIMITS.max_context))
    sampling: Sampling = field(default_factory=Sampling, metadata=_doc("sampling for every turn"))
    min_quality: QualityFloor = field(default_factory=QualityFloor, metadata=_doc("quality floor for the KV format"))


@dataclass(frozen=True)
class Worker:
    name: str = field(metadata=_doc("worker name, unique in the swarm"))
    kind: Literal["local", "virtual", "cluster"] = field(
        default="local",
        metadata=_doc(
            "local: this host, costs measured; virtual: a catalog device emulated here with its memory "
            "cap; cluster: a Ray node offering resource device:<device>"
        ),
    )
    device: str | int | None = field(
        default=None,
        metadata=_doc(
            "virtual / cluster: a catalog id (configs/devices.yaml); local with backend vulkan: the Vulkan device "
            "index `swarm devices` lists (default 0)",
            min=0,
        ),
    )
    backend: Literal["cpu", "vulkan"] = field(
        default="cpu",
        metadata=_doc(
            "local / cluster: where the engine runs: cpu, or vulkan (a GPU through Vulkan; the module must be built "
            "with it: `swarm devices`)"
        ),
    )
    memory: Bytes | None = field(default=None, metadata=_doc("memory cap for weights + scratch + KV, e.g. 2GiB"))
    calibration: Literal["full", "quick", "catalog"] = field(
        default="full", metadata=_doc("local workers: full or quick measurement; catalog: predict from bandwidth")
    )
    calibration_file: str | None = field(
        default=None,
        metadata=_doc(
            "local workers: plan with a recorded calibration (the JSON of `swarm calibrate --json`, or a "
            "calibration cache file) instead of measuring"
        ),
    )

    @property
    def vulkan_index(self) -> int:
        """backend vulkan: the Vulkan device the engine runs on (a local worker's `device`, default 0)."""
        return self.device if isinstance(self.device, int) else 0

    @property
    def device_label(self) -> str:
        """The catalog id (virtual, cluster), "vulkan:<index>" (a local GPU worker) or "local"."""
        if isinstance(self.device, str):
            return self.device
        return f"vulkan:{self.vulkan_index}" if self.backend == "vulkan" else "local"


@dataclass(frozen=True)
class Policy:
    formats: tuple[str, ...] = field(
        default=KV_FORMATS, metadata=_doc("KV formats allowed for K and for V", items=KV_FORMATS)
    )
    pairs: tuple[str, ...] = field(default=(), metadata=_doc("explicit K/V pairs such as 'q8_0/f16' (overrides)"))
    objective: Literal["throughput"] = field(default="throughput", metadata=_doc("aggregate decode tokens/s"))
    quality_floor: QualityFloor = field(
        default_factory=lambda: QualityFloor(DEFAULT_QUALITY_FLOOR.max_kl, DEFAULT_QUALITY_FLOOR.min_top1),
        metadata=_doc(
            "formats measured below it are used only when no better format fits (docs/PLANNER.md); "
            "set both bounds to null to plan for throughput alone"
        ),
    )


@dataclass(frozen=True)
class Geometry:
    """A model described without a file (planning for models that are not here)."""

    n_layer: int = field(metadata=_doc("layers", min=1, max=1024))
    n_kv_head: int = field(metadata=_doc("KV heads", min=1, max=1024))
    head_dim: int = field(metadata=_doc("dimension of one head", min=1, max=4096))
    weight_bytes: Bytes = field(metadata=_doc("resident weight bytes (also the per-step weight stream)"))
    n_ctx: int = field(metadata=_doc("maximum context", min=1, max=LIMITS.max_context))
    n_head: int | None = field(default=None, metadata=_doc("query heads (default 4 x KV heads)", min=1, max=4096))
    n_vocab: int = field(default=32000, metadata=_doc("vocabulary size", min=1, max=1 << 24))
    name: str = field(default="model", metadata=_doc("display name"))


@dataclass(frozen=True)
class Model:
    path: str = field(
        default="default", metadata=_doc("'default' (SmolLM2-135M), a name `swarm models` lists, or a GGUF path")
    )
    geometry: Geometry | None = field(default=None, metadata=_doc("plan for a model given by its shape instead"))


EngineOptions = EngineSettings  # the config's `engine:` section is the engine's settings

PARK_DISK_BYTES = 2 << 30  # a worker's default disk budget for parked sessions: 2 GiB (a few thousand contexts)


@dataclass(frozen=True)
class Lifecycle:
    """What a worker does with an agent's KV between its turns (docs/ARCHITECTURE.md, "Session lifecycle")."""

    policy: Literal["measured", "drop"] = field(
        default="measured",
        metadata=_doc(
            "measured: keep, park (host RAM or disk) or drop an idle session's KV, whichever its measured costs "
            "and expected pause favour; drop: free it when space is needed and re-prefill the next turn"
        ),
    )
    park_dir: str | None = field(
        default=None, metadata=_doc("where parked sessions go (default: $KVSWARM_CACHE/park/<swarm>/<worker>)")
    )
    park_disk_bytes: Bytes = field(
        default=Bytes(PARK_DISK_BYTES),
        metadata=_doc("disk budget per worker for parked sessions; the oldest are dropped first (e.g. 2GiB)"),
    )
    park_ram_bytes: Bytes | None = field(
        default=None, metadata=_doc("host memory per worker for parked sessions (default: a share of what is free)")
    )


@dataclass(frozen=True)
class SwarmConfig:
    name: str = field(metadata=_doc("swarm name"))
    agents: tuple[AgentGroup, ...] = field(metadata=_doc("agent groups", min_items=1, max_items=LIMITS.max_groups))
    workers: tuple[Worker, ...] = field(
        default=(Worker(name="local"),), metadata=_doc("workers", min_items=1, max_items=LIMITS.max_workers)
    )
    model: Model = field(default_factory=Model, metadata=_doc("the model every worker runs"))
    policy: Policy = field(default_factory=Policy, metadata=_doc("allowed KV formats and objective"))
    engine: EngineOptions = field(default_factory=EngineOptions, metadata=_doc("engine settings"))
    lifecycle: Lifecycle = field(
        default_factory=Lifecycle, metadata=_doc("idle sessions' KV: kept, parked, shipped on moves, or dropped")
    )
    output_dir: str = field(default="runs", metadata=_doc("where transcripts and the run summary go"))
