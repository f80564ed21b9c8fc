"""Structured output and tool calls as llguidance grammars, validated at the API boundary.

Why llguidance (not xgrammar): it has no torch dependency (xgrammar's Python
package requires torch; llguidance ships one Rust extension with numpy
helpers), it compiles JSON Schema directly (Earley parser over a lexer, so
`anyOf`, `$ref`, bounded strings and numbers work without a pushdown
pre-compilation per schema), and it computes a token mask for a 49k vocabulary
in well under a millisecond, so per-token masks between the engine's steps are
cheap (bench/http_load.py measures it). The worker runs the matcher
(worker/grammar.py); this module only builds and checks grammar text.

Output shapes the grammars force (compact JSON, keys in the order given):
- response_format json_schema / json_object: the JSON value itself;
- a tool call: `{"name":"<tool>","arguments":<the tool's parameters>}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance

from swarm.errors import InvalidArgument

# Compact JSON: no free whitespace, so the model cannot fill max_tokens with blanks.
_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema


def _compile(schema: dict[str, Any], param: str) -> str:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidArgument(param, f"is not a valid JSON Schema: {e}") from e
    err = llguidance.LLMatcher.validate_grammar(grammar)
    if err:
        raise InvalidArgument(param, f"is not a valid JSON Schema (or uses a feature llguidance lacks): {err}")
    return grammar


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """A JSON Schema object, checked against the metaschema (jsonschema, when installed) and by llguidance."""
    if not isinstance(schema, dict):
        raise InvalidArgument(param, f"must be a JSON Schema object, not {type(schema).__name__}")
    try:
        import jsonschema  # type: ignore[import-untyped]  # (a dependency of ray, always installed)
    except ImportError:  # pragma: no cover - a runtime install without the test extras: llguidance checks alone
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise InvalidArgument(param, f"is not a valid JSON Schema: {e.message}") from e
    _compile(schema, param)
    return schema


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists properties and says nothing
    about others (OpenAI's strict mode). Every value it allows, the original allows; without it a small model
    tends to invent keys until max_tokens runs out."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k not in ("const", "enum", "default", "examples") else v for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def schema_grammar(schema: dict[str, Any], param: str, strict: bool = True) -> str:
    return _compile(closed(schema) if strict else schema, param)


def tool_call_schema(tools: list[Tool]) -> dict[str, Any]:
    """One call of any of `tools`: {"name": const, "arguments": its parameters}."""
    options = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": closed(t.parameters)},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]  # fmt: skip
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_grammar(tools: list[Tool], param: str) -> str:
    return _compile(tool_call_schema(tools), param)


def tools_prompt(tools: list[Tool]) -> str:
    """The system message that tells the model about the tools and the call format."""
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                  ensure_ascii=False) for t in tools)  # fmt: skip
    return ("You can call these tools:\n" + listed + '\nTo call one, reply with only {"name": <tool name>, '
            '"arguments": <arguments object>}. Otherwise reply normally.')  # fmt: skip


def call_text(name: str, arguments: str) -> str:
    """The assistant text of a tool call, exactly as the grammar makes it (the history stays a prefix)."""
    return '{"name":' + json.dumps(name, ensure_ascii=False) + ',"arguments":' + arguments + "}"


def parse_call(text: str, tools: list[Tool]) -> tuple[str, str] | None:
    """(name, arguments JSON text) when `text` is one call of a known tool, else None."""
    s = text.strip()
    if not s.startswith("{"):
        return None
    try:
        v = json.loads(s)
    except ValueError:
        return None
    if not isinstance(v, dict) or set(v) != {"name", "arguments"} or not isinstance(v["arguments"], dict):
        return None
    if v["name"] not in {t.name for t in tools}:
        return None
    head = '{"name":' + json.dumps(v["name"], ensure_ascii=False) + ',"arguments":'
    if s.startswith(head) and s.endswith("}"):
        return v["name"], s[len(head) : -1]  # the generated text, unchanged
    return v["name"], json.dumps(v["arguments"], ensure_ascii=False, separators=(",", ":"))
