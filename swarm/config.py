"""Swarm config: YAML -> typed, frozen objects; every error names its field path.

The dataclasses below are the single definition of the format: `load_config`
walks them to validate a file, and `json_schema()` walks them to produce the
JSON Schema shipped in configs/swarm.schema.json (for editors).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from swarm.errors import ConfigError

KV_FORMATS = ("f32", "f16", "q8_0", "q8_head", "q4_0")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


class Bytes(int):
    """A byte count: an integer, or a string with a unit ("512MiB", "16GB")."""


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class QualityFloor:
    max_kl: float | None = field(default=None, metadata=_doc("mean KL vs f32 KV at most this (nats)", min=0))
    min_top1: float | None = field(default=None, metadata=_doc("top-1 agreement with f32 KV at least this", min=0))


@dataclass(frozen=True)
class Sampling:
    temperature: float = field(default=0.0, metadata=_doc("0 is greedy", min=0))
    top_k: int = field(default=0, metadata=_doc("0 disables it", min=0))
    top_p: float = field(default=1.0, metadata=_doc("nucleus mass in (0, 1]", min=0, max=1))
    repetition_penalty: float = field(default=1.0, metadata=_doc("1 disables it", min=0))
    seed: int = field(default=0, metadata=_doc("per-agent seeds are seed + agent index", min=0))


@dataclass(frozen=True)
class AgentGroup:
    name: str = field(metadata=_doc("group name, unique in the swarm"))
    count: int = field(metadata=_doc("agents in the group", min=1))
    context: int = field(metadata=_doc("tokens each agent must be able to reach (reserved up front)", min=1))
    system_prompt: str = field(default="", metadata=_doc("shared by every agent of the group (its KV is held once)"))
    shared_prefix_tokens: int | None = field(
        default=None, metadata=_doc("override the system prompt's token count (planning without a tokenizer)", min=0)
    )
    tasks: tuple[str, ...] = field(default=(), metadata=_doc("user turns each agent works through, in order"))
    inputs_from: str | None = field(default=None, metadata=_doc("group whose outputs feed this group's turns"))
    max_new_tokens: int = field(default=128, metadata=_doc("new tokens per turn", min=1))
    sampling: Sampling = field(default_factory=Sampling, metadata=_doc("sampling for every turn"))
    min_quality: QualityFloor = field(default_factory=QualityFloor, metadata=_doc("quality floor for the KV format"))


@dataclass(frozen=True)
class Worker:
    name: str = field(metadata=_doc("worker name, unique in the swarm"))
    kind: Literal["local", "virtual", "cluster"] = field(
        default="local",
        metadata=_doc("local: this host, costs measured; virtual: a catalog device emulated here with its memory "
                      "cap; cluster: a Ray node offering resource device:<device>"),
    )  # fmt: skip
    device: str | None = field(default=None, metadata=_doc("catalog id (configs/devices.yaml); not for local"))
    memory: Bytes | None = field(default=None, metadata=_doc("memory cap for weights + scratch + KV, e.g. 2GiB"))
    calibration: Literal["full", "quick", "catalog"] = field(
        default="full", metadata=_doc("local workers: full or quick measurement; catalog: predict from bandwidth")
    )


@dataclass(frozen=True)
class Policy:
    formats: tuple[str, ...] = field(
        default=KV_FORMATS, metadata=_doc("KV formats allowed for K and for V", items=KV_FORMATS)
    )
    pairs: tuple[str, ...] = field(default=(), metadata=_doc("explicit K/V pairs such as 'q8_0/f16' (overrides)"))
    objective: Literal["throughput"] = field(default="throughput", metadata=_doc("aggregate decode tokens/s"))


@dataclass(frozen=True)
class Geometry:
    """A model described without a file (planning for models that are not here)."""

    n_layer: int = field(metadata=_doc("layers", min=1))
    n_kv_head: int = field(metadata=_doc("KV heads", min=1))
    head_dim: int = field(metadata=_doc("dimension of one head", min=1))
    weight_bytes: Bytes = field(metadata=_doc("resident weight bytes (also the per-step weight stream)"))
    n_ctx: int = field(metadata=_doc("maximum context", min=1))
    n_head: int | None = field(default=None, metadata=_doc("query heads (default 4 x KV heads)", min=1))
    n_vocab: int = field(default=32000, metadata=_doc("vocabulary size", min=1))
    name: str = field(default="model", metadata=_doc("display name"))


@dataclass(frozen=True)
class Model:
    path: str = field(default="default", metadata=_doc("'default' (SmolLM2-135M) or a GGUF path"))
    geometry: Geometry | None = field(default=None, metadata=_doc("plan for a model given by its shape instead"))


@dataclass(frozen=True)
class EngineOptions:
    block_tokens: int = field(default=16, metadata=_doc("positions per KV block", min=1, max=64))
    max_batch_tokens: int = field(default=256, metadata=_doc("tokens per engine step", min=1))
    threads: int = field(default=2, metadata=_doc("compute threads per worker", min=1))


@dataclass(frozen=True)
class SwarmConfig:
    name: str = field(metadata=_doc("swarm name"))
    agents: tuple[AgentGroup, ...] = field(metadata=_doc("agent groups", min_items=1))
    workers: tuple[Worker, ...] = field(default=(Worker(name="local"),), metadata=_doc("workers", min_items=1))
    model: Model = field(default_factory=Model, metadata=_doc("the model every worker runs"))
    policy: Policy = field(default_factory=Policy, metadata=_doc("allowed KV formats and objective"))
    engine: EngineOptions = field(default_factory=EngineOptions, metadata=_doc("engine settings"))
    output_dir: str = field(default="runs", metadata=_doc("where transcripts and the run summary go"))


# -- loading -------------------------------------------------------------------------


def parse_bytes(value: Any, path: str) -> Bytes:
    if isinstance(value, bool):
        raise ConfigError(path, f"{value!r} is not a byte count", "write an integer or a size such as 2GiB")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(path, f"{value} is not positive", "give a positive size")
        return Bytes(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if n > 0:
                return Bytes(n)
    raise ConfigError(path, f"{value!r} is not a byte count", "write an integer or a size such as 512MiB or 16GB")


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(path, f"{value!r} is not allowed", f"use one of {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {type(value).__name__}", "write a YAML list")
        return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is Bytes:
        return parse_bytes(value, path)
    if dataclasses.is_dataclass(tp):
        return _load(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(path, f"expected a number, got {value!r}", "write a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}", "write a whole number")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}", "quote the value")
        return value
    raise TypeError(f"config field type {tp} is not supported")


def _load(cls: Any, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(path or "config", f"expected a mapping, got {type(data).__name__}", "write key: value pairs")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(fields)}"
            name = str(key) if isinstance(key, str) and key.strip() and key.isprintable() else repr(key)
            raise ConfigError(_join(path, name), "is not a known key", hint)
    kwargs = {}
    for name, f in fields.items():
        p = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(p, "is missing", f"add it ({f.metadata.get('doc', name)})")
            continue
        v = _convert(hints[name], data[name], p)
        _check_bounds(v, f.metadata, p)
        kwargs[name] = v
    return cls(**kwargs)


def _check_bounds(v: Any, meta: Any, path: str) -> None:
    if isinstance(v, int | float) and not isinstance(v, bool):
        if "min" in meta and v < meta["min"]:
            raise ConfigError(path, f"{v} is below {meta['min']}", f"use at least {meta['min']}")
        if "max" in meta and v > meta["max"]:
            raise ConfigError(path, f"{v} is above {meta['max']}", f"use at most {meta['max']}")
    if isinstance(v, tuple):
        if "min_items" in meta and len(v) < meta["min_items"]:
            raise ConfigError(path, "is empty", f"give at least {meta['min_items']}")
        for i, item in enumerate(v):
            if "items" in meta and item not in meta["items"]:
                raise ConfigError(f"{path}[{i}]", f"'{item}' is not allowed", f"use one of {', '.join(meta['items'])}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load_config(source: str | Path | dict[str, Any]) -> SwarmConfig:
    """Parses and validates a swarm config (a YAML path or an already-parsed mapping)."""
    if isinstance(source, dict):
        data = source
    else:
        p = Path(source)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as e:
            raise ConfigError(str(p), f"cannot be read ({e.strerror})", "check the path") from e
        except yaml.YAMLError as e:
            raise ConfigError(str(p), f"is not valid YAML ({e})", "fix the YAML syntax") from e
    cfg = _load(SwarmConfig, data, "")
    _cross_check(cfg)
    return cfg


def parse_config(text: str, origin: str = "config") -> SwarmConfig:
    """Parses and validates a swarm config given as YAML text (an API request, a test)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(origin, f"is not valid YAML ({e})", "fix the YAML syntax") from e
    cfg = _load(SwarmConfig, data, "")
    _cross_check(cfg)
    return cfg


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _check_name(value: str, path: str) -> None:
    """Names become Ray actor and placement-group names and file names: no spaces, slashes or brackets."""
    if not NAME.fullmatch(value) or value.endswith(".prefix"):
        raise ConfigError(path, f"{value!r} is not a usable name",
                          "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit")  # fmt: skip


def _cross_check(cfg: SwarmConfig) -> None:
    from swarm.devices import load_catalog

    _check_name(cfg.name, "name")
    for i, g in enumerate(cfg.agents):
        _check_name(g.name, f"agents[{i}].name")
    for i, w in enumerate(cfg.workers):
        _check_name(w.name, f"workers[{i}].name")

    names = [g.name for g in cfg.agents]
    for i, g in enumerate(cfg.agents):
        if g.name in names[:i]:
            raise ConfigError(f"agents[{i}].name", f"'{g.name}' repeats", "give every group a unique name")
        if g.inputs_from is not None and g.inputs_from not in names:
            raise ConfigError(f"agents[{i}].inputs_from", f"'{g.inputs_from}' is not a group", f"use one of {names}")
        if g.inputs_from == g.name:
            raise ConfigError(f"agents[{i}].inputs_from", "names the group itself", "feed from another group")
    feeds = {g.name: g.inputs_from for g in cfg.agents}
    for i, g in enumerate(cfg.agents):
        seen, cur = [g.name], g.inputs_from
        while cur is not None:
            if cur in seen:
                raise ConfigError(
                    f"agents[{i}].inputs_from", f"makes a cycle ({' <- '.join(seen + [cur])})",
                    "let at least one group in the chain work from its own tasks",
                )  # fmt: skip
            seen.append(cur)
            cur = feeds.get(cur)
    catalog = load_catalog()
    wnames = [w.name for w in cfg.workers]
    for i, w in enumerate(cfg.workers):
        p = f"workers[{i}]"
        if w.name in wnames[:i]:
            raise ConfigError(f"{p}.name", f"'{w.name}' repeats", "give every worker a unique name")
        if w.kind == "local" and w.device is not None:
            raise ConfigError(f"{p}.device", "is set on a local worker", "drop it, or use kind: virtual")
        if w.kind != "local":
            if w.device is None:
                raise ConfigError(f"{p}.device", "is missing", f"name a catalog device: {', '.join(catalog)}")
            if w.device not in catalog:
                close = difflib.get_close_matches(w.device, catalog, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(catalog)}"
                raise ConfigError(f"{p}.device", f"'{w.device}' is not in configs/devices.yaml", hint)
            if w.memory is not None and w.memory > catalog[w.device].usable_bytes:
                raise ConfigError(
                    f"{p}.memory",
                    f"{w.memory:,} bytes is more than {w.device}'s usable {catalog[w.device].usable_bytes:,}",
                    "lower the cap or pick a bigger device",
                )
    for i, pair in enumerate(cfg.policy.pairs):
        parts = pair.split("/")
        if len(parts) != 2 or any(x not in KV_FORMATS for x in parts):
            raise ConfigError(f"policy.pairs[{i}]", f"'{pair}' is not K/V", f"write e.g. q8_0/f16 from {KV_FORMATS}")


# -- JSON Schema -------------------------------------------------------------------------


def _schema(tp: Any, meta: Any = None) -> dict[str, Any]:
    meta = meta or {}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    out: dict[str, Any]
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        out = {"anyOf": [_schema(inner[0], meta), {"type": "null"}]}
    elif origin is Literal:
        out = {"enum": list(args)}
    elif origin is tuple:
        item = _schema(args[0])
        if "items" in meta:
            item = {"enum": list(meta["items"])}
        out = {"type": "array", "items": item}
        if "min_items" in meta:
            out["minItems"] = meta["min_items"]
    elif tp is Bytes:
        size = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"
        out = {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string", "pattern": size}]}
    elif dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props = {f.name: _schema(hints[f.name], f.metadata) for f in dataclasses.fields(tp)}
        required = [
            f.name
            for f in dataclasses.fields(tp)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        out = {"type": "object", "properties": props, "additionalProperties": False}
        if required:
            out["required"] = required
    else:
        out = {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}[tp]}
        if "min" in meta:
            out["minimum"] = meta["min"]
        if "max" in meta:
            out["maximum"] = meta["max"]
    if "doc" in meta:
        out["description"] = meta["doc"]
    return out


def json_schema() -> dict[str, Any]:
    s = _schema(SwarmConfig)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "kvswarm swarm config", **s}


def schema_path() -> Path:
    return Path(__file__).resolve().parent.parent / "configs" / "swarm.schema.json"


if __name__ == "__main__":  # python -m swarm.config: regenerate configs/swarm.schema.json
    import json

    schema_path().write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {schema_path()}")
