"""HTTP request bodies checked once, here, into typed values (`TurnSpec`); every refusal names its field.

Messages become the runtime's {"role", "content"} dicts: a tool result is a user
message `[tool result <id>] ...`, an assistant tool call is the call's exact text
(swarm/http/grammar.py call_text), so a conversation sent back extends the
agent's history token for token.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from swarm.api.requests import Limits
from swarm.config import MAX_TEMPERATURE, as_float32
from swarm.errors import InvalidArgument, ResourceExhausted
from swarm.http import grammar as gr
from worker.sampling import MAX_SEED

MAX_TOOLS = 128  # tools in one request (each is described to the model in its prompt)
OPENAI_MAX_TEMPERATURE = min(2.0, MAX_TEMPERATURE)  # the OpenAI APIs' range; the engine takes more


@dataclass(frozen=True)
class TurnSpec:
    """One request's turn, as the runtime takes it, plus how to answer (mode)."""

    model: str
    messages: list[dict[str, str]]  # the conversation (chat) or the new input (responses with previous_response_id)
    max_tokens: int  # 0: the agent group's default
    sampling: dict[str, Any]  # temperature / top_p / seed given, and "grammar" when constrained
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    tools: list[gr.Tool] = field(default_factory=list)
    tool_choice: str = "auto"  # "auto", "none", "required" or "function:<name>"
    mode: str = "text"  # "text", "json" (schema-constrained), "tool" (a forced call), "auto_tool" (may call)
    previous_response_id: str = ""
    store: bool = True

    def api_record(self, kind: str) -> dict[str, Any]:
        """What a job records to answer this request again (swarm/jobs.py Job.api)."""
        return {"kind": kind, "model": self.model, "mode": self.mode, "store": self.store,
                "tools": [t.name for t in self.tools], "previous_response_id": self.previous_response_id,
                "include_usage": self.include_usage}  # fmt: skip


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument("body", f"is not valid JSON ({e}); send a JSON object") from e
    if not isinstance(body, dict):
        raise InvalidArgument("body", f"is a JSON {type(body).__name__}, not an object")
    return body


def _str(body: dict[str, Any], key: str, required: bool = False, default: str = "") -> str:
    v = body.get(key)
    if v is None:
        if required:
            raise InvalidArgument(key, "is required")
        return default
    if not isinstance(v, str):
        raise InvalidArgument(key, f"must be a string, not {type(v).__name__}")
    return v


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise InvalidArgument(key, f"must be true or false, not {json.dumps(v)[:40]}")
    return v


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgument(key, f"must be an integer, not {json.dumps(v)[:40]}")
    if not lo <= v <= hi:
        raise InvalidArgument(key, f"{v} is outside [{lo}, {hi}]")
    return v


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, lo, hi, open_lo in (("temperature", 0.0, OPENAI_MAX_TEMPERATURE, False), ("top_p", 0.0, 1.0, True)):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidArgument(key, f"must be a number, not {json.dumps(v)[:40]}")
        f = as_float32(float(v))
        if not (lo < f <= hi if open_lo else lo <= f <= hi):
            raise InvalidArgument(key, f"{v} is outside {'(' if open_lo else '['}{lo}, {hi}]")
        out[key] = float(v)
    seed = _int(body, "seed", -(1 << 63), 1 << 64)
    if seed is not None:
        out["seed"] = seed % (MAX_SEED + 1)  # OpenAI seeds may be negative; the engine's are uint64 below MAX_SEED
    return out


def _stop(body: dict[str, Any], limits: Limits) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidArgument("stop", "must be a non-empty string or a list of them")
    if len(stops) > limits.max_stop_strings:
        raise InvalidArgument("stop", f"has {len(stops)} strings, more than the limit of {limits.max_stop_strings}")
    for i, s in enumerate(stops):
        if len(s) > limits.max_stop_chars:
            raise InvalidArgument(f"stop[{i}]", f"is longer than {limits.max_stop_chars} characters")
    return tuple(stops)


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts (text / input_text / output_text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                raise InvalidArgument(f"{param}[{j}]", "only text parts are supported (type text / input_text)")
            t = part.get("text")
            if not isinstance(t, str):
                raise InvalidArgument(f"{param}[{j}].text", "must be a string")
            out.append(t)
        return "".join(out)
    raise InvalidArgument(param, f"must be a string or a list of text parts, not {type(content).__name__}")


def tool_result(call_id: str, content: str) -> dict[str, str]:
    return {"role": "user", "content": f"[tool result {call_id}] {content}"}


def chat_messages(msgs: Any, limits: Limits, param: str = "messages") -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise InvalidArgument(param, "must be a non-empty list of messages")
    if len(msgs) > limits.max_messages:
        raise InvalidArgument(param, f"has {len(msgs)} messages, more than the limit of {limits.max_messages}")
    out: list[dict[str, str]] = []
    for i, m in enumerate(msgs):
        p = f"{param}[{i}]"
        if not isinstance(m, dict):
            raise InvalidArgument(p, "must be an object with role and content")
        role = m.get("role")
        if role in ("system", "developer"):
            out.append({"role": "system", "content": _text(m.get("content"), f"{p}.content")})
        elif role == "user":
            out.append({"role": "user", "content": _text(m.get("content"), f"{p}.content")})
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidArgument(f"{p}.tool_calls", "must be a list")
            texts = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                        not isinstance(fn.get("arguments"), str):  # fmt: skip
                    raise InvalidArgument(f"{p}.tool_calls[{j}].function", "needs name and arguments (strings)")
                texts.append(gr.call_text(fn["name"], fn["arguments"]))
            content = "\n".join(texts) if texts else _text(m.get("content"), f"{p}.content")
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise InvalidArgument(f"{p}.tool_call_id", "is required for a tool message (a string)")
            out.append(tool_result(call_id, _text(m.get("content"), f"{p}.content")))
        else:
            raise InvalidArgument(f"{p}.role", f"{json.dumps(role)[:40]} is not one of system, user, assistant, tool")
    _check_size(out, limits, param)
    return out


def _check_size(msgs: list[dict[str, str]], limits: Limits, param: str) -> None:
    chars = sum(len(m["content"]) for m in msgs)
    if chars > limits.max_prompt_chars:
        raise ResourceExhausted(f"{param}: {chars:,} characters, more than the limit of {limits.max_prompt_chars:,}")


def _tools(body: dict[str, Any], flat: bool) -> list[gr.Tool]:
    """Function tools: {"type": "function", "function": {...}} (chat) or {"type": "function", "name", ...} (flat)."""
    v = body.get("tools")
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_TOOLS:
        raise InvalidArgument("tools", f"must be a list of at most {MAX_TOOLS} tools")
    out: list[gr.Tool] = []
    for i, t in enumerate(v):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise InvalidArgument(f"{p}.type", "only function tools are supported (type: function)")
        fn = t if flat else t.get("function")
        fp = p if flat else f"{p}.function"
        if not isinstance(fn, dict):
            raise InvalidArgument(fp, "must be an object with name and parameters")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise InvalidArgument(f"{fp}.name", "must be a non-empty string of at most 64 characters")
        if any(x.name == name for x in out):
            raise InvalidArgument(f"{fp}.name", f"{name!r} is the name of another tool too; tool names must be unique")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        gr.check_schema(params, f"{fp}.parameters")
        desc = fn.get("description") or ""
        out.append(gr.Tool(name, desc if isinstance(desc, str) else "", params))
    return out


def _tool_choice(body: dict[str, Any], tools: list[gr.Tool], flat: bool) -> str:
    v = body.get("tool_choice")
    if v is None:
        return "auto" if tools else "none"
    if isinstance(v, str):
        if v not in ("auto", "none", "required"):
            raise InvalidArgument("tool_choice", f"{v!r} is not auto, none, required or a named function")
        choice = v
    elif isinstance(v, dict) and v.get("type") == "function":
        name = v.get("name") if flat else (v.get("function") or {}).get("name")
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise InvalidArgument("tool_choice", f"names {json.dumps(name)[:80]}, which is not in tools")
        choice = f"function:{name}"
    else:
        raise InvalidArgument("tool_choice", "must be auto, none, required or {type: function, ...}")
    if choice != "none" and not tools:
        raise InvalidArgument("tool_choice", f"is {choice!r} but no tools are given")
    return choice


def _format(fmt: Any, param: str) -> dict[str, Any] | None:
    """A response format's JSON Schema: None for text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidArgument(param, "must be an object with a type")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema", fmt)  # chat nests it; responses' text.format is flat
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidArgument(f"{param}.json_schema.schema", "is required")
        return gr.check_schema(spec["schema"], f"{param}.json_schema.schema")
    raise InvalidArgument(f"{param}.type", f"{json.dumps(kind)[:40]} is not text, json_object or json_schema")


def _constrain(schema: dict[str, Any] | None, tools: list[gr.Tool], choice: str,
               param: str) -> tuple[str, str | None, list[gr.Tool]]:  # fmt: skip
    """(mode, grammar, tools the model is told about)."""
    if choice == "none":
        tools = []
    if choice.startswith("function:"):
        forced = [t for t in tools if t.name == choice.removeprefix("function:")]
        return "tool", gr.tool_grammar(forced, "tool_choice"), forced
    if choice == "required":
        return "tool", gr.tool_grammar(tools, "tools"), tools
    if schema is not None:
        return "json", gr.schema_grammar(schema, param), tools
    return ("auto_tool" if tools else "text"), None, tools


def _with_prompts(msgs: list[dict[str, str]], tools: list[gr.Tool], schema: dict[str, Any] | None,
                  mode: str) -> list[dict[str, str]]:  # fmt: skip
    """Adds the tool list (and a JSON Schema) as a system message after the leading system messages."""
    notes = []
    if tools:
        notes.append(gr.tools_prompt(tools))
    if schema is not None and mode == "json":
        notes.append("Reply with JSON only, valid against this JSON Schema: " + json.dumps(schema))
    if not notes:
        return msgs
    n = 0
    while n < len(msgs) and msgs[n]["role"] == "system":
        n += 1
    return msgs[:n] + [{"role": "system", "content": "\n\n".join(notes)}] + msgs[n:]


def chat_request(body: dict[str, Any], limits: Limits) -> TurnSpec:
    model = _str(body, "model", required=True)
    msgs = chat_messages(body.get("messages"), limits)
    mt = _int(body, "max_completion_tokens", 1, 1 << 20)
    mt = _int(body, "max_tokens", 1, 1 << 20) if mt is None else mt
    n = _int(body, "n", 1, 1)
    del n  # only n=1 is served
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise InvalidArgument("stream_options", "must be an object")
    tools = _tools(body, flat=False)
    choice = _tool_choice(body, tools, flat=False)
    schema = _format(body.get("response_format"), "response_format")
    mode, grammar, told = _constrain(schema, tools, choice, "response_format")
    sampling = _sampling(body)
    if grammar is not None:
        sampling["grammar"] = grammar
    return TurnSpec(model=model, messages=_with_prompts(msgs, told, schema, mode), max_tokens=mt or 0,
                    sampling=sampling, stop=_stop(body, limits), stream=_bool(body, "stream", False),
                    include_usage=bool((opts or {}).get("include_usage")), tools=tools, tool_choice=choice,
                    mode=mode, store=_bool(body, "store", True))  # fmt: skip


def response_input(v: Any, limits: Limits) -> list[dict[str, str]]:
    """Responses `input`: a string, or a list of message / function_call / function_call_output items."""
    if isinstance(v, str):
        if not v:
            raise InvalidArgument("input", "is empty")
        return [{"role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise InvalidArgument("input", "must be a string or a non-empty list of input items")
    out: list[dict[str, str]] = []
    for i, item in enumerate(v):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(p, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidArgument(f"{p}.role", f"{json.dumps(role)[:40]} is not user, system or assistant")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text(item.get("content"), f"{p}.content")})  # fmt: skip
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments")
            if not isinstance(name, str) or not isinstance(args, str):
                raise InvalidArgument(p, "a function_call needs name and arguments (strings)")
            out.append({"role": "assistant", "content": gr.call_text(name, args)})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise InvalidArgument(p, "a function_call_output needs call_id and output (strings)")
            out.append(tool_result(call_id, output))
        else:
            raise InvalidArgument(f"{p}.type", f"{json.dumps(kind)[:40]} is not message, function_call or "
                                  "function_call_output")  # fmt: skip
    if len(out) > limits.max_messages:
        raise InvalidArgument("input", f"has {len(out)} items, more than the limit of {limits.max_messages}")
    _check_size(out, limits, "input")
    return out


def responses_request(body: dict[str, Any], limits: Limits) -> TurnSpec:
    model = _str(body, "model", required=True)
    msgs = response_input(body.get("input"), limits)
    prev = _str(body, "previous_response_id")
    instructions = _str(body, "instructions")
    if instructions and not prev:  # with previous_response_id the session already holds its instructions
        msgs = [{"role": "system", "content": instructions}, *msgs]
    tools = _tools(body, flat=True)
    choice = _tool_choice(body, tools, flat=True)
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise InvalidArgument("text", "must be an object")
    schema = _format((text or {}).get("format"), "text.format")
    mode, grammar, told = _constrain(schema, tools, choice, "text.format")
    sampling = _sampling(body)
    if grammar is not None:
        sampling["grammar"] = grammar
    if not prev:
        msgs = _with_prompts(msgs, told, schema, mode)
    return TurnSpec(model=model, messages=msgs, max_tokens=_int(body, "max_output_tokens", 1, 1 << 20) or 0,
                    sampling=sampling, stream=_bool(body, "stream", False), tools=tools, tool_choice=choice,
                    mode=mode, previous_response_id=prev, store=_bool(body, "store", True))  # fmt: skip
