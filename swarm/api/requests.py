"""Requests at the boundary: each is checked once, here, into a typed value a swarm can take as it is.

Every refusal is an `InvalidArgument` (or `ResourceExhausted` for size) that
names the field and says what to send instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarm.config import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    SwarmConfig,
    as_float32,
    load_data,
    parse_document,
    show,
)
from swarm.errors import InvalidArgument, ResourceExhausted
from swarm.jobs import TERMINAL, Job
from swarm.v1 import swarm_pb2 as pb

ROLES = ("system", "user", "assistant")
DEFAULT_LIST_JOBS = 100  # ListJobs.limit 0


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 4 << 20  # one request or response
    max_prompt_chars: int = 256 << 10  # all messages of one job together
    max_messages: int = 256
    max_streams_per_client: int = 256  # StreamJob + WatchPlacement at once, per token identity (swarm/auth.py)
    max_jobs_per_request: int = 1024  # a group submission
    max_stop_strings: int = 32  # per job (the matcher's automaton holds at most 32 x 512 characters)
    max_stop_chars: int = 512  # one stop string
    max_name_chars: int = 128  # a swarm, agent or group name, a job id, a job state (names are 63 at most)
    max_key_chars: int = 256  # an idempotency key
    max_deadline_s: float = 30 * 86400  # a job's deadline_s: 30 days
    max_list_jobs: int = 1000  # ListJobs.limit (a response also stops short of max_message_bytes)


# Top-level string fields of requests that name things: bounded before any handler looks them up or echoes them.
NAME_FIELDS = ("swarm", "agent", "group", "job_id", "state")


def check_names(request: Any, limits: Limits) -> None:
    for name in NAME_FIELDS:
        v = getattr(request, name, "")
        if isinstance(v, str) and len(v) > limits.max_name_chars:
            raise InvalidArgument(name, f"{show(v)} is longer than {limits.max_name_chars} characters (no such "
                                  "name can exist)")  # fmt: skip


def messages(msgs: Any, limits: Limits, path: str = "messages") -> list[dict[str, str]]:
    if not msgs:
        raise InvalidArgument(path, "is empty; send at least one message")
    if len(msgs) > limits.max_messages:
        raise InvalidArgument(path, f"has {len(msgs)} messages, more than the limit of {limits.max_messages}")
    out, chars = [], 0
    for i, m in enumerate(msgs):
        if m.role not in ROLES:
            raise InvalidArgument(f"{path}[{i}].role", f"{show(m.role)} is not one of {', '.join(ROLES)}")
        chars += len(m.content)
        out.append({"role": m.role, "content": m.content})
    if chars > limits.max_prompt_chars:
        raise ResourceExhausted(f"{path}: {chars:,} characters, more than the limit of {limits.max_prompt_chars:,}")
    if out[-1]["role"] == "assistant":
        raise InvalidArgument(f"{path}[{len(out) - 1}].role", "the last message must not be the assistant's")
    return out


# (field, lowest, highest, lowest excluded) as the engine checks them, on the float32 value it gets
_SAMPLING_BOUNDS = (("temperature", 0.0, MAX_TEMPERATURE, False), ("top_p", 0.0, 1.0, True),
                    ("repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY, False))  # fmt: skip


def sampling_pb(s: Any, path: str) -> dict[str, Any]:
    """A Sampling message as the engine will get it (top_p and repetition_penalty 0: off), range-checked."""
    values = {"temperature": s.temperature, "top_p": s.top_p or 1.0, "repetition_penalty": s.repetition_penalty or 1.0}
    for name, lo, hi, open_lo in _SAMPLING_BOUNDS:
        v = values[name]
        seen = as_float32(v)
        shown = f"{v!r}" if seen == v else f"{v!r} (in float32, the engine's precision: {seen!r})"
        if not (lo < seen <= hi if open_lo else lo <= seen <= hi):  # NaN fails both
            interval = f"({lo}, {hi}]" if open_lo else f"[{lo}, {hi}]"
            off = " (or 0: off)" if name != "temperature" else ""
            raise InvalidArgument(f"{path}.{name}", f"{shown} is outside {interval}{off}")
    if not 0 <= s.top_k <= MAX_TOP_K:
        raise InvalidArgument(f"{path}.top_k", f"{s.top_k} is outside [0, {MAX_TOP_K}]")
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": values["top_p"],
            "repetition_penalty": values["repetition_penalty"], "seed": s.seed}  # fmt: skip


def sampling(req: Any) -> dict[str, Any] | None:
    return sampling_pb(req.sampling, "sampling") if req.HasField("sampling") else None


# -- swarm configs ---------------------------------------------------------------------------


def config_from_request(
    req: Any, served_model: Callable[[SwarmConfig, dict[str, Any]], SwarmConfig]
) -> tuple[SwarmConfig, dict[str, Any]]:
    """The request's swarm config, validated: config_yaml is always a document (never a path), and
    model.path names only a model this server serves (`served_model`, the hub's check)."""
    if isinstance(req, pb.PlanSwarmRequest) or req.WhichOneof("source") == "config_yaml":
        text = req.config_yaml
        if not text.strip():
            raise InvalidArgument("config_yaml", "is empty; send a swarm config (configs/swarm.schema.json)")
        doc = parse_document(text, "config_yaml")
        if not isinstance(doc, dict):
            raise InvalidArgument("config_yaml", f"is a YAML {type(doc).__name__}, not a mapping; send a swarm "
                                  "config document (configs/swarm.schema.json), never a path")  # fmt: skip
        return served_model(load_data(doc), doc), doc
    if req.WhichOneof("source") != "spec":
        raise InvalidArgument("source", "send config_yaml or spec")
    sp = req.spec
    data: dict[str, Any] = {"name": sp.name, "agents": [], "workers": []}
    if sp.model_path:
        data["model"] = {"path": sp.model_path}
    for i, g in enumerate(sp.agents):
        d: dict[str, Any] = {"name": g.name, "count": g.count, "context": g.context}
        if g.system_prompt:
            d["system_prompt"] = g.system_prompt
        if g.tasks:
            d["tasks"] = list(g.tasks)
        if g.inputs_from:
            d["inputs_from"] = g.inputs_from
        if g.max_new_tokens:
            d["max_new_tokens"] = g.max_new_tokens
        if g.HasField("sampling"):
            d["sampling"] = sampling_pb(g.sampling, f"spec.agents[{i}].sampling")
        data["agents"].append(d)
    for w in sp.workers:
        d = {"name": w.name, "kind": w.kind or "local"}
        for key in ("device", "memory", "calibration"):
            if getattr(w, key):
                d[key] = getattr(w, key)
        data["workers"].append(d)
    if not data["workers"]:
        del data["workers"]
    if sp.kv_formats:
        data["policy"] = {"formats": list(sp.kv_formats)}
    if sp.threads:
        data["engine"] = {"threads": sp.threads}
    return served_model(load_data(data), data), data


# -- jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitRequest:
    """A SubmitJob request, validated: what a swarm's `submit_job` takes."""

    swarm: str
    target: str  # "agent", "group" or "new_agent"
    agent: str | None  # set when target is "agent"
    group: str | None  # set when target is "group"
    messages: list[dict[str, str]]
    max_tokens: int  # 0: the group's default
    sampling: dict[str, Any] | None  # None: the group's sampling
    stop: tuple[str, ...]
    idempotency_key: str  # "": none
    deadline_s: float  # 0: the call's deadline

    @staticmethod
    def parse(req: Any, limits: Limits, n_ctx_of: Callable[[str], int]) -> SubmitRequest:
        """Checks every field once; `n_ctx_of(swarm)` is the swarm's context (NotFound for no such swarm)."""
        if not req.swarm:
            raise InvalidArgument("swarm", "is empty; name a running swarm (ListSwarms)")
        target = req.WhichOneof("target")
        if target is None:
            raise InvalidArgument("target", "set agent, group or new_agent")
        if req.max_tokens < 0:
            raise InvalidArgument("max_tokens", f"{req.max_tokens} is negative; send 0 for the group's default")
        n_ctx = n_ctx_of(req.swarm)
        if req.max_tokens > n_ctx:
            raise InvalidArgument("max_tokens", f"{req.max_tokens:,} is more than the model's context {n_ctx:,}")
        if not 0 <= req.deadline_s <= limits.max_deadline_s:  # NaN fails too
            raise InvalidArgument("deadline_s", f"{req.deadline_s!r} is outside [0, {limits.max_deadline_s:.0f}] "
                                  "seconds (0: the call's deadline)")  # fmt: skip
        if len(req.stop) > limits.max_stop_strings:
            raise InvalidArgument("stop", f"has {len(req.stop):,} stop strings, more than the limit of "
                                  f"{limits.max_stop_strings}")  # fmt: skip
        for i, s in enumerate(req.stop):
            if not s:
                raise InvalidArgument(f"stop[{i}]", "is empty")
            if len(s) > limits.max_stop_chars:
                raise InvalidArgument(f"stop[{i}]", f"has {len(s):,} characters, more than the limit of "
                                      f"{limits.max_stop_chars}")  # fmt: skip
        key = req.idempotency_key
        if len(key) > limits.max_key_chars:
            raise InvalidArgument("idempotency_key", f"has {len(key):,} characters, more than the limit of "
                                  f"{limits.max_key_chars}")  # fmt: skip
        return SubmitRequest(swarm=req.swarm, target=target, agent=req.agent if target == "agent" else None,
                             group=req.group if target == "group" else None, messages=messages(req.messages, limits),
                             max_tokens=req.max_tokens, sampling=sampling(req), stop=tuple(req.stop),
                             idempotency_key=key, deadline_s=req.deadline_s)  # fmt: skip

    def same_as(self, jobs: list[Job]) -> bool:
        """Whether a SubmitJob reusing a key asks for what the key's jobs were made from (they are recorded,
        so this holds across a restart too). max_tokens 0 and the deadline are not compared (a retry may let
        them default or count its deadline from now)."""
        if not jobs:
            return False
        j = jobs[0]
        if j.swarm != self.swarm or any(x.messages != self.messages or x.sampling != self.sampling or
                                        tuple(x.stop) != self.stop for x in jobs):  # fmt: skip
            return False
        if self.max_tokens and any(x.max_tokens != self.max_tokens for x in jobs):
            return False
        if self.target == "agent":
            return len(jobs) == 1 and j.agent == self.agent
        if self.target == "group":
            return all(x.agent.rsplit("-", 1)[0] == self.group for x in jobs)
        return len(jobs) == 1 and j.agent.startswith("job")  # a one-off agent's name: job<k>-0


@dataclass(frozen=True)
class ListJobsQuery:
    """A ListJobs request, validated."""

    swarm: str  # "": every swarm
    state: str  # "": every state
    limit: int  # at most this many, newest first

    @staticmethod
    def parse(req: Any, limits: Limits) -> ListJobsQuery:
        if not 0 <= req.limit <= limits.max_list_jobs:
            raise InvalidArgument("limit", f"{req.limit} is outside [0, {limits.max_list_jobs}] (0: "
                                  f"{DEFAULT_LIST_JOBS})")  # fmt: skip
        if req.state not in ("", "queued", "running", *TERMINAL):
            raise InvalidArgument("state", f"{show(req.state)} is not a job state (queued, running, "
                                  f"{', '.join(TERMINAL)}, or empty for all)")  # fmt: skip
        return ListJobsQuery(swarm=req.swarm, state=req.state, limit=req.limit or DEFAULT_LIST_JOBS)

    def matches(self, job: Job) -> bool:
        return self.swarm in ("", job.swarm) and self.state in ("", job.state)
