"""Jobs as OpenAI objects: chat completions (whole and as chunks) and responses (whole and as events)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from swarm.http import grammar as gr
from swarm.http import sse
from swarm.jobs import Job

POLL_S = 0.5
# The head of a tool call as the grammar writes it: {"name":"<tool>","arguments":
_CALL_HEAD = re.compile(r'\s*\{"name":("(?:[^"\\]|\\.)*"),"arguments":')
FINISH = {"stop_token": "stop", "stop_string": "stop", "max_tokens": "length", "context": "length",
          "kv_budget": "length"}  # fmt: skip


def _api(job: Job) -> dict[str, Any]:
    return job.api or {}


def finish_reason(job: Job) -> str:
    return FINISH.get(job.finish_reason, "stop")


def usage(job: Job, responses: bool = False) -> dict[str, Any]:
    prompt = job.prompt_tokens + job.cached_tokens
    out = len(job.token_ids)
    if responses:
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": job.cached_tokens},
                "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + out}  # fmt: skip
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip


def tool_call(job: Job) -> tuple[str, str] | None:
    """(name, arguments) when the finished job's text is a tool call."""
    api = _api(job)
    if api.get("mode") not in ("tool", "auto_tool") or finish_reason(job) != "stop":
        return None
    tools = [gr.Tool(n, "", {}) for n in api.get("tools", [])]
    return gr.parse_call(job.text, tools)


def failure(job: Job) -> dict[str, Any] | None:
    if job.state in ("failed", "cancelled"):
        return {"message": f"the job {job.state}: {job.error or job.finish_reason}", "type": "server_error",
                "param": None, "code": job.finish_reason or job.state}  # fmt: skip
    return None


def wait_done(job: Job) -> None:
    while not job.done:
        job.wait(len(job.token_ids), POLL_S)


# -- chat completions ------------------------------------------------------------------------------


def chat_completion(job: Job) -> dict[str, Any]:
    call = tool_call(job)
    message: dict[str, Any] = {"role": "assistant", "content": job.text, "refusal": None}
    reason = finish_reason(job)
    if call is not None:
        fn = {"name": call[0], "arguments": call[1]}
        message = {"role": "assistant", "content": None, "refusal": None,
                   "tool_calls": [{"id": f"call_{job.id}", "type": "function", "function": fn}]}  # fmt: skip
        reason = "tool_calls"
    return {"id": f"chatcmpl-{job.id}", "object": "chat.completion", "created": int(job.created),
            "model": _api(job).get("model", ""), "choices": [{"index": 0, "message": message,
            "finish_reason": reason, "logprobs": None}], "usage": usage(job)}  # fmt: skip


def chat_chunks(job: Job) -> Iterator[str]:
    """The job as Chat Completions chunks: text as content deltas, a tool call as tool_calls deltas."""
    api = _api(job)
    mode = api.get("mode", "text")
    head = {"id": f"chatcmpl-{job.id}", "object": "chat.completion.chunk", "created": int(job.created),
            "model": api.get("model", "")}  # fmt: skip

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        return sse.data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]})

    yield chunk({"role": "assistant", "content": ""})
    offset, buf, sent_args, call_name = 0, "", 0, None
    holding = mode in ("tool", "auto_tool")  # text that may be a tool call is held until it shows which
    while True:
        tokens, pieces, finished = job.wait(offset, POLL_S)
        offset += len(tokens)
        piece = "".join(pieces)
        if not holding:
            if piece:
                yield chunk({"content": piece})
        else:
            buf += piece
            m = _CALL_HEAD.match(buf)
            if call_name is None and m is not None:
                call_name = m.group(1)[1:-1]
                yield chunk({"tool_calls": [{"index": 0, "id": f"call_{job.id}", "type": "function",
                                             "function": {"name": call_name, "arguments": ""}}]})  # fmt: skip
            if call_name is not None and m is not None:
                args = buf[m.end() :]
                ready = len(args) - 1  # the last character may be the call's closing brace
                if ready > sent_args:
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[sent_args:ready]}}]})
                    sent_args = ready
            elif mode == "auto_tool" and buf.strip() and not buf.lstrip().startswith("{"):
                holding = False  # plain text: it goes out as it comes
                yield chunk({"content": buf})
        if finished:
            break
    err = failure(job)
    if err is not None:
        yield sse.data({"error": err})
        yield sse.DONE
        return
    reason = finish_reason(job)
    if holding and call_name is None and buf:
        yield chunk({"content": buf})
    elif call_name is not None and reason == "stop":
        reason = "tool_calls"
    yield chunk({}, reason)
    if api.get("include_usage"):
        yield sse.data({**head, "choices": [], "usage": usage(job)})
    yield sse.DONE


# -- responses ---------------------------------------------------------------------------------------


def _output(job: Job) -> list[dict[str, Any]]:
    call = tool_call(job)
    if call is not None:
        return [{"type": "function_call", "id": f"fc_{job.id}", "call_id": f"call_{job.id}", "name": call[0],
                 "arguments": call[1], "status": "completed"}]  # fmt: skip
    return [{"type": "message", "id": f"msg_{job.id}", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": job.text, "annotations": []}]}]  # fmt: skip


def response(job: Job) -> dict[str, Any]:
    api = _api(job)
    status, incomplete = "in_progress", None
    if job.done:
        status = "completed"
        if failure(job):
            status = "failed"
        elif finish_reason(job) == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {"id": f"resp_{job.id}", "object": "response", "created_at": int(job.created), "status": status,
            "model": api.get("model", ""), "output": _output(job) if job.done and not failure(job) else [],
            "previous_response_id": api.get("previous_response_id") or None, "error": failure(job),
            "incomplete_details": incomplete, "usage": usage(job, responses=True) if job.done else None,
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": [], "store": api.get("store", True),
            "metadata": {}, "instructions": None, "text": {"format": {"type": "text"}},
            "truncation": "disabled"}  # fmt: skip


def response_events(job: Job) -> Iterator[str]:
    """The Responses streaming events: created, in_progress, the output item with its deltas, completed."""
    seq = iter(range(1 << 62))

    def ev(kind: str, **obj: Any) -> str:
        return sse.event(kind, {"sequence_number": next(seq), **obj})

    yield ev("response.created", response=response(job) | {"status": "in_progress", "usage": None})
    yield ev("response.in_progress", response=response(job) | {"status": "in_progress", "usage": None})
    mode = _api(job).get("mode", "text")
    item_id = f"msg_{job.id}"
    live = mode in ("text", "json")
    if live:
        yield ev("response.output_item.added", output_index=0, item={"type": "message", "id": item_id,
                 "status": "in_progress", "role": "assistant", "content": []})  # fmt: skip
        yield ev("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                 part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
    offset = 0
    while True:
        tokens, pieces, finished = job.wait(offset, POLL_S)
        offset += len(tokens)
        piece = "".join(pieces)
        if live and piece:
            yield ev("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece)
        if finished:
            break
    body = response(job)
    if failure(job):
        yield ev("response.failed", response=body)
        return
    item = body["output"][0]
    if item["type"] == "message":
        part = item["content"][0]
        if not live:
            yield ev("response.output_item.added", output_index=0, item={**item, "status": "in_progress",
                     "content": []})  # fmt: skip
            yield ev("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                     part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
            yield ev("response.output_text.delta", item_id=item_id, output_index=0, content_index=0,
                     delta=part["text"])  # fmt: skip
        yield ev("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=part["text"])
        yield ev("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part)
    else:
        yield ev("response.output_item.added", output_index=0, item={**item, "arguments": "",
                 "status": "in_progress"})  # fmt: skip
        yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=0,
                 delta=item["arguments"])  # fmt: skip
        yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                 arguments=item["arguments"])  # fmt: skip
    yield ev("response.output_item.done", output_index=0, item=item)
    yield ev("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
