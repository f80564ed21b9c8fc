"""Swarm config: YAML -> typed, frozen objects; every error names its field path.

The dataclasses below are the single definition of the format: `load_config`
walks them to validate a file, and `json_schema()` walks them to produce the
JSON Schema shipped in configs/swarm.schema.json (for editors).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import struct
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from swarm.errors import ConfigError
from swarm.planner import DEFAULT_QUALITY_FLOOR

KV_FORMATS = ("f32", "f16", "q8_0", "q8_head", "q4_0")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


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
    max_threads: int = 256  # compute threads per worker
    max_batch_tokens: int = 1 << 14  # tokens per engine step (its scratch grows with it)


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


# Sampling bounds, as the native engine checks them (native/engine.cpp check_sampling) on the float32 value,
# narrowed where a wider value means nothing: one home, used for configs here and for requests by the server.
MAX_TEMPERATURE = 100.0  # hotter is uniform noise
MAX_TOP_K = 1 << 20  # more than any vocabulary
MIN_REPETITION_PENALTY = 1e-3  # native needs > 0; below this a seen token's logit is scaled past float32's range
MAX_REPETITION_PENALTY = 10.0
MAX_SEED = (1 << 63) - 1  # seeds are seed + agent index + 7919 x turn, and must stay a uint64


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class QualityFloor:
    max_kl: float | None = field(default=None, metadata=_doc("mean KL vs f32 KV at most this (nats)", min=0))
    min_top1: float | None = field(default=None, metadata=_doc("top-1 agreement with f32 KV at least this", min=0))


@dataclass(frozen=True)
class Sampling:
    temperature: float = field(default=0.0, metadata=_doc("0 is greedy", min=0, max=MAX_TEMPERATURE, float32=True))
    top_k: int = field(default=0, metadata=_doc("0 disables it", min=0, max=MAX_TOP_K))
    top_p: float = field(default=1.0, metadata=_doc("nucleus mass in (0, 1]", exclusive_min=0, max=1, float32=True))
    repetition_penalty: float = field(
        default=1.0,
        metadata=_doc("1 disables it", min=MIN_REPETITION_PENALTY, max=MAX_REPETITION_PENALTY, float32=True),
    )
    seed: int = field(default=0, metadata=_doc("per-agent seeds are seed + agent index", min=0, max=MAX_SEED))


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
        metadata=_doc("override the system prompt's token count (planning without a tokenizer)", min=0,
                      max=LIMITS.max_context),
    )  # fmt: skip
    tasks: tuple[str, ...] = field(
        default=(),
        metadata=_doc("user turns each agent works through, in order", max_items=LIMITS.max_tasks,
                      item_max_chars=LIMITS.max_text_chars),
    )  # fmt: skip
    inputs_from: str | None = field(default=None, metadata=_doc("group whose outputs feed this group's turns"))
    max_new_tokens: int = field(default=128, metadata=_doc("new tokens per turn", min=1, max=LIMITS.max_context))
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
    calibration_file: str | None = field(
        default=None,
        metadata=_doc("local workers: plan with a recorded calibration (the JSON of `swarm calibrate --json`, or a "
                      "calibration cache file) instead of measuring"),
    )  # fmt: skip


@dataclass(frozen=True)
class Policy:
    formats: tuple[str, ...] = field(
        default=KV_FORMATS, metadata=_doc("KV formats allowed for K and for V", items=KV_FORMATS)
    )
    pairs: tuple[str, ...] = field(default=(), metadata=_doc("explicit K/V pairs such as 'q8_0/f16' (overrides)"))
    objective: Literal["throughput"] = field(default="throughput", metadata=_doc("aggregate decode tokens/s"))
    quality_floor: QualityFloor = field(
        default_factory=lambda: QualityFloor(DEFAULT_QUALITY_FLOOR.max_kl, DEFAULT_QUALITY_FLOOR.min_top1),
        metadata=_doc("formats measured below it are used only when no better format fits (docs/PLANNER.md); "
                      "set both bounds to null to plan for throughput alone"),
    )  # fmt: skip


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
    path: str = field(default="default", metadata=_doc("'default' (SmolLM2-135M) or a GGUF path"))
    geometry: Geometry | None = field(default=None, metadata=_doc("plan for a model given by its shape instead"))


@dataclass(frozen=True)
class EngineOptions:
    block_tokens: int = field(default=16, metadata=_doc("positions per KV block", min=1, max=64))
    max_batch_tokens: int = field(
        default=256, metadata=_doc("tokens per engine step", min=1, max=LIMITS.max_batch_tokens)
    )
    threads: int = field(default=2, metadata=_doc("compute threads per worker", min=1, max=LIMITS.max_threads))


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
    output_dir: str = field(default="runs", metadata=_doc("where transcripts and the run summary go"))


# -- loading -------------------------------------------------------------------------


def parse_bytes(value: Any, path: str) -> Bytes:
    if isinstance(value, bool):
        raise ConfigError(path, f"{value!r} is not a byte count", "write an integer or a size such as 2GiB")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(path, f"{show(value)} is not positive", "give a positive size")
        if value > LIMITS.max_bytes:
            raise ConfigError(path, f"{show(value)} bytes is more than the limit", f"use at most {LIMITS.max_bytes:,}")
        return Bytes(value)
    if isinstance(value, str) and len(value) <= 64:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if n > LIMITS.max_bytes:
                raise ConfigError(path, f"{show(value)} is more than the limit", f"use at most {LIMITS.max_bytes:,}")
            if n >= 1:
                return Bytes(int(n))
    raise ConfigError(path, f"{show(value)} is not a byte count", "write an integer or a size such as 512MiB or 16GB")


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path)
    if origin is Literal:
        if not isinstance(value, str) or value not in args:
            raise ConfigError(path, f"{show(value)} is not allowed", f"use one of {', '.join(map(str, args))}")
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
            raise ConfigError(path, f"expected a number, got {show(value)}", "write a number")
        try:
            v = float(value)
        except OverflowError:
            v = math.inf
        if not math.isfinite(v):
            raise ConfigError(path, f"{show(value)} is not a finite number", "write a finite number")
        return v
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {show(value)}", "write a whole number")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {show(value)}", "quote the value")
        return value
    raise TypeError(f"config field type {tp} is not supported")


def _load(cls: Any, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(path or "config", f"expected a mapping, got {type(data).__name__}", "write key: value pairs")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key)[:64], fields, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(fields)}"
            ok = isinstance(key, str) and key.strip() and key.isprintable() and len(key) <= 64
            raise ConfigError(_join(path, key if ok else show(key)), "is not a known key", hint)
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
        seen = v
        if meta.get("float32"):  # the engine's view: 1e-300 is 0 there, 1e39 is inf
            seen = as_float32(v)
            if not math.isfinite(seen):
                raise ConfigError(path, f"{show(v)} is not finite in float32 (the engine's precision)",
                                  f"use at most {meta.get('max', 'a finite value')}")  # fmt: skip
        shown = show(v) if seen == v else f"{show(v)} (in float32, the engine's precision: {seen!r})"
        if "min" in meta and seen < meta["min"]:
            raise ConfigError(path, f"{shown} is below {meta['min']}", f"use at least {meta['min']}")
        if "exclusive_min" in meta and seen <= meta["exclusive_min"]:
            raise ConfigError(path, f"{shown} is not above {meta['exclusive_min']}",
                              f"use a value above {meta['exclusive_min']}")  # fmt: skip
        if "max" in meta and seen > meta["max"]:
            raise ConfigError(path, f"{shown} is above {meta['max']}", f"use at most {meta['max']}")
    if isinstance(v, str) and len(v) > meta.get("max_chars", LIMITS.max_string_chars):
        limit = meta.get("max_chars", LIMITS.max_string_chars)
        raise ConfigError(path, f"has {len(v):,} characters, more than the limit of {limit:,}", "shorten it")
    if isinstance(v, tuple):
        if "min_items" in meta and len(v) < meta["min_items"]:
            raise ConfigError(path, "is empty", f"give at least {meta['min_items']}")
        limit = meta.get("max_items", LIMITS.max_items)
        if len(v) > limit:
            raise ConfigError(path, f"has {len(v):,} items, more than the limit of {limit:,}", "give fewer")
        for i, item in enumerate(v):
            if "items" in meta and item not in meta["items"]:
                raise ConfigError(f"{path}[{i}]", f"{show(item)} is not allowed",
                                  f"use one of {', '.join(meta['items'])}")  # fmt: skip
            if isinstance(item, str) and len(item) > meta.get("item_max_chars", LIMITS.max_string_chars):
                limit = meta.get("item_max_chars", LIMITS.max_string_chars)
                raise ConfigError(f"{path}[{i}]", f"has {len(item):,} characters, more than the limit of {limit:,}",
                                  "shorten it")  # fmt: skip


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _DocumentTooBig(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document past LIMITS while composing it, before any value is built.

    Each composed node's size after alias expansion is derived from its children's (an alias reuses its
    anchor's numbers), so a billion-laughs document is refused in time linear in its text.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # {id(node): (nodes, scalar characters, depth)} after alias expansion; a node is in it once composed
        self._size: dict[int, tuple[int, int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            target = self.anchors.get(anchor)
            if target is not None and id(target) not in self._size:
                raise _DocumentTooBig(f"alias *{show(anchor, 32)} refers to a node that contains it (a cycle)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > LIMITS.max_depth:
            raise _DocumentTooBig(f"nests deeper than {LIMITS.max_depth} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode):
            size = (1, len(node.value), 1)
        else:
            kids = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value
            sizes = [self._size[id(k)] for k in kids]
            size = (1 + sum(n for n, _, _ in sizes), sum(c for _, c, _ in sizes), 1 + max((d for *_, d in sizes),
                    default=0))  # fmt: skip
        self._size[id(node)] = size
        n, chars, depth = size
        if depth > LIMITS.max_depth:
            raise _DocumentTooBig(f"nests deeper than {LIMITS.max_depth} levels once its aliases are expanded")
        if n > LIMITS.max_nodes:
            raise _DocumentTooBig(f"has more than {LIMITS.max_nodes:,} values once its aliases are expanded")
        if chars > LIMITS.max_expanded_chars:
            raise _DocumentTooBig(f"holds more than {LIMITS.max_expanded_chars:,} characters of text once its "
                                  "aliases are expanded")  # fmt: skip
        return node


def parse_document(text: str, origin: str = "config") -> Any:
    """YAML text -> plain data, within LIMITS (size, depth, alias expansion); ConfigError otherwise.

    The text is always the document itself: a document that is a string is a string, never a path.
    """
    if not isinstance(text, str):
        raise ConfigError(origin, f"expected YAML text, got {type(text).__name__}", "send the document as text")
    if len(text.encode("utf-8", "surrogatepass")) > LIMITS.max_document_bytes:
        raise ConfigError(origin, f"is more than {LIMITS.max_document_bytes:,} bytes",
                          "shorten it (use agent groups with count rather than listing agents)")  # fmt: skip
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader checks the characters here
        return loader.get_single_data()
    except _DocumentTooBig as e:
        raise ConfigError(origin, str(e), "write the values out with fewer aliases and less nesting") from e
    except yaml.YAMLError as e:
        raise ConfigError(origin, f"is not valid YAML ({show(str(e), 300)})", "fix the YAML syntax") from e
    except (ValueError, OverflowError, TypeError, RecursionError) as e:  # int('9' x 5000), 2001-13-45
        raise ConfigError(origin, f"holds a value YAML cannot build ({show(str(e), 200)})", "quote it") from e
    finally:
        if loader is not None:
            loader.dispose()


def load_config(source: str | Path | dict[str, Any]) -> SwarmConfig:
    """Parses and validates a swarm config: a YAML file's path (the CLI), or an already-parsed mapping.

    Text from a client goes through parse_config, never here: a string is a path.
    """
    if isinstance(source, dict):
        data = source
    else:
        p = Path(source)
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
            raise ConfigError(str(p), f"cannot be read ({why})", "check the path") from e
        data = parse_document(text, str(p))
    return load_data(data)


def load_data(data: Any) -> SwarmConfig:
    """Validates parsed config data (a mapping); ConfigError names the field path."""
    cfg = _load(SwarmConfig, data, "")
    _cross_check(cfg)
    return cfg


def parse_config(text: str, origin: str = "config") -> SwarmConfig:
    """Parses and validates a swarm config given as YAML text (an API request, a test)."""
    return load_data(parse_document(text, origin))


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _check_name(value: str, path: str) -> None:
    """Names become Ray actor and placement-group names and file names: no spaces, slashes or brackets."""
    if not NAME.fullmatch(value) or value.endswith(".prefix"):
        raise ConfigError(path, f"{show(value)} is not a usable name",
                          "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit")  # fmt: skip


def _cross_check(cfg: SwarmConfig) -> None:
    from swarm.devices import load_catalog

    _check_name(cfg.name, "name")
    for i, g in enumerate(cfg.agents):
        _check_name(g.name, f"agents[{i}].name")
    for i, w in enumerate(cfg.workers):
        _check_name(w.name, f"workers[{i}].name")

    total = sum(g.count for g in cfg.agents)
    if total > LIMITS.max_agents:
        raise ConfigError("agents", f"has {total:,} agents in all, more than the limit of {LIMITS.max_agents:,}",
                          "use fewer or smaller groups, or split the work over several swarms")  # fmt: skip
    for key in ("formats", "pairs"):
        values = getattr(cfg.policy, key)
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ConfigError(f"policy.{key}[{i}]", f"{show(v)} repeats", "list each once")
    names = [g.name for g in cfg.agents]
    for i, g in enumerate(cfg.agents):
        if g.name in names[:i]:
            raise ConfigError(f"agents[{i}].name", f"'{g.name}' repeats", "give every group a unique name")
        if g.inputs_from is not None and g.inputs_from not in names:
            raise ConfigError(f"agents[{i}].inputs_from", f"{show(g.inputs_from)} is not a group",
                              f"use one of {', '.join(names[:16])}")  # fmt: skip
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
                close = difflib.get_close_matches(w.device[:64], catalog, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(catalog)}"
                raise ConfigError(f"{p}.device", f"{show(w.device)} is not in configs/devices.yaml", hint)
            if w.memory is not None and w.memory > catalog[w.device].usable_bytes:
                raise ConfigError(
                    f"{p}.memory",
                    f"{w.memory:,} bytes is more than {w.device}'s usable {catalog[w.device].usable_bytes:,}",
                    "lower the cap or pick a bigger device",
                )
    for i, pair in enumerate(cfg.policy.pairs):
        parts = pair.split("/")
        if len(parts) != 2 or any(x not in KV_FORMATS for x in parts):
            raise ConfigError(f"policy.pairs[{i}]", f"{show(pair)} is not K/V",
                              f"write e.g. q8_0/f16 from {KV_FORMATS}")  # fmt: skip


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
        item = _schema(args[0], {"max_chars": meta["item_max_chars"]} if "item_max_chars" in meta else None)
        if "items" in meta:
            item = {"enum": list(meta["items"])}
        out = {"type": "array", "items": item}
        if "min_items" in meta:
            out["minItems"] = meta["min_items"]
        out["maxItems"] = meta.get("max_items", LIMITS.max_items)
    elif tp is Bytes:
        size = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"
        out = {"anyOf": [{"type": "integer", "exclusiveMinimum": 0, "maximum": LIMITS.max_bytes},
                         {"type": "string", "pattern": size, "maxLength": 64}]}  # fmt: skip
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
        if "exclusive_min" in meta:
            out["exclusiveMinimum"] = meta["exclusive_min"]
        if "max" in meta:
            out["maximum"] = meta["max"]
        if tp is str:
            out["maxLength"] = meta.get("max_chars", LIMITS.max_string_chars)
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
