"""Which session serves an HTTP request, and submitting it as a durable job.

Model names (GET /v1/models):
- `<base>` (e.g. `default`): the model a running swarm serves; each request is a one-off agent;
- `<swarm>/<agent>`: that agent's session. A conversation that extends the agent's history (its
  configured system prompt first, unless the request starts with it) prefills only the new messages; any other
  conversation runs on a one-off agent of the same swarm, recomputed (cached_tokens 0);
- `<swarm>/<group>`: the idle agent of the group whose history the conversation extends (the longest),
  else a one-off agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm.api.hub import Hub
from swarm.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, SwarmError
from swarm.http.schemas import TurnSpec
from swarm.jobs import Job
from swarm.launch import SwarmRun
from worker.models import served_models

JOB_PREFIX = {"chat": "chatcmpl-", "response": "resp_"}


class Starting(SwarmError):
    """The swarm a request names is still starting (HTTP 503)."""


def base_model_id(hub: Hub, run: SwarmRun) -> str:
    path = Path(run.cfg.model.path)
    for name, p in served_models(hub.models_dir).items():
        if Path(p) == path or str(p) == str(path):
            return name
    return path.name


def model_ids(hub: Hub) -> list[str]:
    """Base models, then `<swarm>/<agent>` and `<swarm>/<group>` of every running swarm."""
    base: list[str] = []
    named: list[str] = []
    for run in list(hub.swarms.values()):
        if run.state not in ("running", "starting"):
            continue
        b = base_model_id(hub, run)
        if b not in base:
            base.append(b)
        with run.lock:
            agents = [a for a in run.agents.values() if not a.oneoff]
        groups = sorted({a.group.name for a in agents})
        named += [f"{run.cfg.name}/{g}" for g in groups]
        named += [f"{run.cfg.name}/{a.name}" for a in agents if a.name not in groups]
    return base + named


def _live(run: SwarmRun) -> SwarmRun:
    if run.state == "starting":
        raise Starting(f"swarm {run.cfg.name!r} is still starting; retry in a few seconds")
    if run.state != "running":
        raise NotFound(f"swarm {run.cfg.name!r} is {run.state}; launch it again to use its models")
    return run


def _resolve(hub: Hub, model: str) -> tuple[SwarmRun, list[str] | None]:
    """(the swarm, the agents that may serve it); None: a one-off agent (the base model)."""
    swarm, sep, name = model.partition("/")
    if sep:
        run = hub.swarms.get(swarm)
        if run is None:
            raise NotFound(f"model {model!r}: no swarm {swarm!r} (GET /v1/models lists the models)")
        _live(run)
        with run.lock:
            if name in run.agents and not run.agents[name].oneoff:
                return run, [name]
            group = [a.name for a in run.agents.values() if a.group.name == name and not a.oneoff]
        if not group:
            raise NotFound(f"model {model!r}: swarm {swarm!r} has no agent or group {name!r} (GET /v1/models)")
        return run, group
    runs = [r for r in list(hub.swarms.values()) if base_model_id(hub, r) == model]
    for r in runs:
        if r.state == "running":
            return r, None
    if runs:
        _live(runs[0])
    raise NotFound(f"model {model!r} is not served (GET /v1/models lists the models)")


def _lead(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    return messages[:n]


def _with_system(a: Any, msgs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation as the agent holds it: its configured system prompt first (unless the client sent it)."""
    lead = _lead(a.messages)
    return msgs if msgs[: len(lead)] == lead else lead + msgs


def _submit(run: SwarmRun, spec: TurnSpec, kind: str, **target: Any) -> Job:
    jobs = run.submit_job(messages=target.pop("messages"), max_tokens=spec.max_tokens, sampling=spec.sampling,
                          stop=spec.stop, api=spec.api_record(kind), **target)  # fmt: skip
    return jobs[0]


def submit(hub: Hub, spec: TurnSpec, kind: str) -> Job:
    """Submits the request as a job on the session that serves it (recorded before this returns)."""
    if spec.previous_response_id:
        return _continue(hub, spec, kind)
    run, names = _resolve(hub, spec.model)
    msgs = spec.messages
    if msgs[-1]["role"] == "assistant":
        raise InvalidArgument("messages", "the last message is the assistant's; end with a user or tool message")
    with run.lock:  # chosen and queued at once: two requests never pick the same idle agent
        if names is not None:
            best, best_len, system = None, -1, None
            for name in names:
                a = run.agents[name]
                system = system or _lead(a.messages)
                full = _with_system(a, msgs)
                n = len(a.messages)
                if a.finished or a.turn is not None or a.jobs or len(full) <= n or full[:n] != a.messages:
                    continue
                if n > best_len:
                    best, best_len = a, n
            if best is not None:
                full = _with_system(best, msgs)
                return _submit(run, spec, kind, agent=best.name, messages=full[best_len:])
            if len(names) == 1 and (run.agents[names[0]].turn is not None or run.agents[names[0]].jobs):
                a = run.agents[names[0]]
                raise ResourceExhausted(
                    f"agent {a.name} is busy with a turn; wait for it to end, or send the request to its group "
                    f"({run.cfg.name}/{a.group.name}) or the base model"
                )
            lead = system or []
            msgs = msgs if msgs[: len(lead)] == lead else lead + msgs
        return _submit(run, spec, kind, new_agent=True, messages=msgs)


def _continue(hub: Hub, spec: TurnSpec, kind: str) -> Job:
    """Responses with previous_response_id: the next turn of the session that made it."""
    prev_id = spec.previous_response_id
    try:
        run, prev = hub.job(prev_id.removeprefix(JOB_PREFIX["response"]))
    except NotFound as e:
        raise NotFound(f"no response {prev_id!r}") from e
    if prev.api is None or prev.api.get("kind") != "response" or not prev.api.get("store", True):
        raise NotFound(f"no stored response {prev_id!r} (one made with store: false cannot be continued)")
    if run is None:
        raise NotFound(f"response {prev_id!r}: its swarm {prev.swarm!r} is no longer running")
    _live(run)
    if not prev.done:
        raise FailedPrecondition(f"response {prev_id!r} is still {prev.state}; wait for it to complete")
    with run.lock:
        a = run.agents.get(prev.agent)
        if a is None:
            raise NotFound(f"response {prev_id!r}: its agent {prev.agent!r} is gone")
        last = next((e.get("job") for e in reversed(a.log)), None)
        if last != prev.id or a.turn is not None or a.jobs:
            raise InvalidArgument("previous_response_id", f"agent {a.name} has taken other turns since {prev_id}; "
                                  "continue from its latest response")  # fmt: skip
        if a.oneoff:  # a one-off agent's KV is gone with it: the conversation so far runs on a new one
            return _submit(run, spec, kind, new_agent=True, messages=list(a.messages) + spec.messages)
        return _submit(run, spec, kind, agent=a.name, messages=spec.messages)


def find(hub: Hub, kind: str, public_id: str) -> Job:
    """A finished or running HTTP job by its public id (chatcmpl-... / resp_...); NotFound otherwise."""
    prefix = JOB_PREFIX[kind]
    what = "chat completion" if kind == "chat" else "response"
    if not public_id.startswith(prefix):
        raise NotFound(f"no {what} {public_id!r} (its id starts with {prefix})")
    try:
        _, job = hub.job(public_id[len(prefix) :])
    except NotFound as e:
        raise NotFound(f"no {what} {public_id!r}") from e
    if job.api is None or job.api.get("kind") != kind or not job.api.get("store", True):
        raise NotFound(f"no stored {what} {public_id!r}")
    return job
