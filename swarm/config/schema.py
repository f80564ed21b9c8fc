"""The JSON Schema of a swarm config (configs/swarm.schema.json, for editors), walked from the dataclasses."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

from swarm.config.definition import LIMITS, Bytes, SwarmConfig, config_fields


def _schema(tp: Any, meta: Any = None) -> dict[str, Any]:
    meta = meta or {}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    out: dict[str, Any]
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        out = {"anyOf": [*(_schema(a, meta) for a in inner[: 2 if {int, str} <= set(inner) else 1]), {"type": "null"}]}
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
        out = {
            "anyOf": [
                {"type": "integer", "exclusiveMinimum": 0, "maximum": LIMITS.max_bytes},
                {"type": "string", "pattern": size, "maxLength": 64},
            ]
        }
    elif dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props = {f.name: _schema(hints[f.name], f.metadata) for f in config_fields(tp)}
        required = [
            f.name
            for f in config_fields(tp)
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
    return Path(__file__).resolve().parents[2] / "configs" / "swarm.schema.json"
