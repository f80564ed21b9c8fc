"""Plain data -> typed, frozen config objects, walking the dataclasses; every error names its field path."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from swarm.config.checks import cross_check
from swarm.config.definition import LIMITS, Bytes, SwarmConfig, as_float32, config_fields, show
from swarm.config.document import parse_document
from swarm.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


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
        if int in inner and str in inner:  # `str | int`: an integer stays one, anything else must be a string
            return _convert(int if isinstance(value, int) and not isinstance(value, bool) else str, value, path)
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
    fields = {f.name: f for f in config_fields(cls)}
    for key in data:
        if key not in fields and not _recorded_per_turn(cls, key, data[key]):
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


def _recorded_per_turn(cls: Any, key: Any, value: Any) -> bool:
    """True for a per-turn field (worker.sampling.PER_TURN) holding its default: what a recorded config
    (`dataclasses.asdict` of a loaded one) carries. Any other value of it is not a config key."""
    f = next((f for f in dataclasses.fields(cls) if f.name == key and f.metadata.get("per_turn")), None)
    if f is None:
        return False
    return bool(value == f.default or (isinstance(f.default, tuple) and value == list(f.default)))


def _check_bounds(v: Any, meta: Any, path: str) -> None:
    if isinstance(v, int | float) and not isinstance(v, bool):
        seen = v
        if meta.get("float32"):  # the engine's view: 1e-300 is 0 there, 1e39 is inf
            seen = as_float32(v)
            if not math.isfinite(seen):
                raise ConfigError(
                    path,
                    f"{show(v)} is not finite in float32 (the engine's precision)",
                    f"use at most {meta.get('max', 'a finite value')}",
                )
        shown = show(v) if seen == v else f"{show(v)} (in float32, the engine's precision: {seen!r})"
        if "min" in meta and seen < meta["min"]:
            raise ConfigError(path, f"{shown} is below {meta['min']}", f"use at least {meta['min']}")
        if "exclusive_min" in meta and seen <= meta["exclusive_min"]:
            raise ConfigError(
                path, f"{shown} is not above {meta['exclusive_min']}", f"use a value above {meta['exclusive_min']}"
            )
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
                raise ConfigError(
                    f"{path}[{i}]", f"{show(item)} is not allowed", f"use one of {', '.join(meta['items'])}"
                )
            if isinstance(item, str) and len(item) > meta.get("item_max_chars", LIMITS.max_string_chars):
                limit = meta.get("item_max_chars", LIMITS.max_string_chars)
                raise ConfigError(
                    f"{path}[{i}]", f"has {len(item):,} characters, more than the limit of {limit:,}", "shorten it"
                )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


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
    cfg: SwarmConfig = _load(SwarmConfig, data, "")
    cross_check(cfg)
    return cfg


def parse_config(text: str, origin: str = "config") -> SwarmConfig:
    """Parses and validates a swarm config given as YAML text (an API request, a test)."""
    return load_data(parse_document(text, origin))
