"""gRPC server for swarm.v1.SwarmService (protos/swarm/v1/swarm.proto).

One server holds one Ray connection and any number of swarms, each a
`SwarmRun` in serve mode (its agents work through their tasks, then wait for
jobs). Handlers validate every field before it reaches a swarm, and map the
swarm layer's typed errors onto status codes. Nothing a client sends is
unpickled or executed: requests are protobuf messages and YAML parsed with
`yaml.safe_load`.

Security: binds 127.0.0.1 unless told otherwise; every call but health
checking needs `authorization: Bearer <token>` unless auth is disabled, with
a role that allows the method, and is admitted against limits per token
identity with a reserve for health checks and admin tokens (swarm/auth.py);
TLS when a certificate and key are given; limits on message size and prompt size.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from swarm import auth, scheduler
from swarm.config import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    SwarmConfig,
    as_float32,
    load_config,
    load_data,
    parse_document,
    show,
)
from swarm.errors import (
    AlreadyExists,
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    ModelFileError,
    NoFeasiblePlan,
    NotFound,
    ResourceExhausted,
    SwarmError,
)
from swarm.jobs import TERMINAL, Job
from swarm.launch import SwarmRun
from swarm.planning import plan_config, plan_inputs
from swarm.store import Store
from swarm.v1 import swarm_pb2 as pb
from swarm.v1 import swarm_pb2_grpc as pb_grpc
from worker.models import served_models

log = logging.getLogger(__name__)
SERVICE = pb.DESCRIPTOR.services_by_name["SwarmService"].full_name
ROLES = ("system", "user", "assistant")


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


# -- errors -> status codes ------------------------------------------------------------------

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelFileError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NoFeasiblePlan, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (scheduler.SchedulerError, grpc.StatusCode.UNAVAILABLE),
    (SwarmError, grpc.StatusCode.FAILED_PRECONDITION),
]


MAX_ERROR_CHARS = 2000  # an error's text: the field path, the problem, the fix, and a short prefix of the input


def _code(e: BaseException) -> grpc.StatusCode:
    """The one table: a typed error's code; anything else is a bug, reported as INTERNAL (never UNKNOWN)."""
    return next((c for t, c in _CODES if isinstance(e, t)), grpc.StatusCode.INTERNAL)


def _details(e: BaseException) -> str:
    text = str(e) if isinstance(e, SwarmError) else f"internal error ({type(e).__name__}); the server log has it"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 30] + f"... ({len(text):,} characters)"


def _abort(context: grpc.ServicerContext, e: Exception) -> None:
    if not isinstance(e, SwarmError) and context.code() is not None:
        raise e  # context.abort() already ran (it raises a bare Exception): keep its status
    if not isinstance(e, SwarmError):
        log.error("handler failed: %s: %s", type(e).__name__, str(e)[:MAX_ERROR_CHARS], exc_info=e)
    context.abort(_code(e), _details(e))


# Top-level string fields of requests that name things: bounded before any handler looks them up or echoes them.
_NAME_FIELDS = ("swarm", "agent", "group", "job_id", "state")


def _check_names(request: Any, limits: Limits) -> None:
    for name in _NAME_FIELDS:
        v = getattr(request, name, "")
        if isinstance(v, str) and len(v) > limits.max_name_chars:
            raise InvalidArgument(name, f"{show(v)} is longer than {limits.max_name_chars} characters (no such "
                                  "name can exist)")  # fmt: skip


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            _check_names(request, self.limits)
            return fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure gets a defined code (_code)
            _abort(context, e)

    return wrapper


def _streaming(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            _check_names(request, self.limits)
            yield from fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure gets a defined code (_code)
            _abort(context, e)

    return wrapper


# -- the hub: swarms and jobs ------------------------------------------------------------------


@dataclass
class Hub:
    """Every swarm this server runs, on one Ray connection, recorded in one store."""

    conn: scheduler.Connection
    out_root: Path
    store: Store
    echo: Callable[[str], None] = print
    calibrate: Callable[[Path, str, int], dict] | None = None
    swarms: dict[str, SwarmRun] = field(default_factory=dict)
    archive: dict[str, Job] = field(default_factory=dict)  # jobs of swarms no longer running
    idempotency: dict[str, list[str]] = field(default_factory=dict)  # key -> job ids
    lock: threading.RLock = field(default_factory=threading.RLock)
    models_dir: Path | None = None  # GGUF files a client may name (by path under it), besides the default model
    on_swarm_state: Callable[[SwarmRun], None] | None = None  # a swarm's health may have changed

    def served_model(self, cfg: SwarmConfig, data: dict[str, Any]) -> SwarmConfig:
        """A client's config with model.path made the served file it names; INVALID_ARGUMENT for any other path.

        The refusal reads the same whether or not the path exists: only the served list is looked at.
        `data` (what is recorded) gets the file's path too, so a restarted server resumes the same model.
        """
        for i, w in enumerate(cfg.workers):
            if w.calibration_file:  # a server path: a client may not make the server read one
                raise InvalidArgument(
                    f"workers[{i}].calibration_file",
                    "is not accepted over the API; calibrate on the server (calibration: quick or full) or plan "
                    "with calibration: catalog",
                )
        if cfg.model.geometry is not None:
            return cfg
        served = served_models(self.models_dir)
        path = served.get(cfg.model.path)
        if path is None and cfg.model.path in {str(p) for p in served.values()}:
            path = Path(cfg.model.path)
        if path is None:
            names = ", ".join(list(served)[:16]) or "none (the default model is not installed)"
            where = "the *.gguf files under --models-dir, by their path under it" if self.models_dir else \
                "start the server with --models-dir to offer more"  # fmt: skip
            raise InvalidArgument("model.path", f"{show(cfg.model.path)} is not a model this server offers; use one "
                                  f"of: {names} ({where})")  # fmt: skip
        model = {**(data.get("model") or {}), "path": str(path)}
        data["model"] = model
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(path)))

    def recover(self) -> list[str]:
        """Relaunches the swarms a previous server left running, with their agents and jobs; their names."""
        back = []
        for rec in self.store.swarms():
            jobs = self.store.jobs(rec["name"])
            for j in jobs:
                if j["idempotency_key"]:
                    self.idempotency.setdefault(j["idempotency_key"], []).append(j["id"])
            if rec["state"] not in ("starting", "running"):
                for j in jobs:
                    self.archive[j["id"]] = Job.restore(j)
                continue
            try:
                cfg = load_config(rec["config"])
                run = self._make(cfg)
                run.restore(self.store.agents(cfg.name), jobs)
                self.swarms[cfg.name] = run
                run.start()
                back.append(cfg.name)
            except Exception as e:  # noqa: BLE001 - the swarm is reported failed, its jobs too
                why = f"could not resume after a restart: {type(e).__name__}: {e}"
                self.store.set_swarm_state(rec["name"], "failed", why)
                for j in jobs:
                    job = Job.restore(j)
                    if not job.done:
                        job.finish("failed", "error", why)
                        self.store.commit(self.store.job_statements({job.id: (job.state, job.result())}, {}))
                    self.archive[job.id] = job
                self.swarms.pop(rec["name"], None)
        return back

    def _make(self, cfg: SwarmConfig) -> SwarmRun:
        inputs = plan_inputs(cfg, calibrate=self.calibrate)
        out = self.out_root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = SwarmRun(cfg, inputs, scheduler.Scheduler(cfg.name, self.conn), out, echo=self.echo, live=False,
                       serve=True, store=self.store)  # fmt: skip
        run.on_state = lambda r: self.on_swarm_state(r) if self.on_swarm_state else None
        return run

    def launch(self, cfg: SwarmConfig, data: dict[str, Any]) -> SwarmRun:
        with self.lock:
            old = self.swarms.get(cfg.name)
            if old is not None and old.state in ("starting", "running"):
                raise AlreadyExists(f"swarm {cfg.name!r} is already running; stop it first or pick another name")
            run = self._make(cfg)
            self.swarms[cfg.name] = run
        try:
            self.store.forget_swarm(cfg.name)
            self.store.put_swarm(cfg.name, data, "running", run.started)
            run.start()
        except BaseException as e:
            run.sched.shutdown()
            self.store.set_swarm_state(cfg.name, "failed", f"{type(e).__name__}: {e}")
            with self.lock:
                self.swarms.pop(cfg.name, None)
            raise
        return run

    def swarm(self, name: str) -> SwarmRun:
        run = self.swarms.get(name)
        if run is None:
            raise NotFound(f"no swarm {show(name)} (running: {', '.join(list(self.swarms)[:16]) or 'none'})")
        return run

    def stop(self, name: str) -> SwarmRun:
        run = self.swarm(name)
        if run.state in ("stopped", "failed"):
            return run
        run.stop()
        run.sched.shutdown()
        self.store.set_swarm_state(name, run.state, run.error)
        return run

    def job(self, job_id: str) -> tuple[SwarmRun | None, Job]:
        for run in list(self.swarms.values()):
            job = run.jobs.get(job_id)
            if job is not None:
                return run, job
        if job_id in self.archive:
            return None, self.archive[job_id]
        raise NotFound(f"no job {show(job_id)}")

    def shutdown(self) -> None:
        """A clean stop: swarms stop, their jobs end as cancelled (recorded)."""
        for name in list(self.swarms):
            run = self.swarms[name]
            if run.state in ("starting", "running"):
                run.stop("the server shut down")
                self.store.set_swarm_state(name, "stopped", "the server shut down")
            run.sched.shutdown()
        self.store.close()

    def crash(self) -> None:
        """Drills: stops every swarm loop and worker as a killed server process would, recording nothing."""
        for run in self.swarms.values():
            run._stop.set()
            if run._thread is not None:
                run._thread.join(timeout=60)
            run.sched.shutdown()
        self.store.close()


# -- request checking --------------------------------------------------------------------------


def _messages(msgs: Any, limits: Limits, path: str = "messages") -> list[dict[str, str]]:
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


def _sampling_pb(s: Any, path: str) -> dict[str, Any]:
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


def _sampling(req: Any) -> dict[str, Any] | None:
    return _sampling_pb(req.sampling, "sampling") if req.HasField("sampling") else None


def _config_from_request(req: Any, hub: Hub) -> tuple[SwarmConfig, dict[str, Any]]:
    """The request's swarm config, validated: config_yaml is always a document (never a path), and
    model.path names only a model this server serves."""
    if isinstance(req, pb.PlanSwarmRequest) or req.WhichOneof("source") == "config_yaml":
        text = req.config_yaml
        if not text.strip():
            raise InvalidArgument("config_yaml", "is empty; send a swarm config (configs/swarm.schema.json)")
        data = parse_document(text, "config_yaml")
        if not isinstance(data, dict):
            raise InvalidArgument("config_yaml", f"is a YAML {type(data).__name__}, not a mapping; send a swarm "
                                  "config document (configs/swarm.schema.json), never a path")  # fmt: skip
        return hub.served_model(load_data(data), data), data
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
            d["sampling"] = _sampling_pb(g.sampling, f"spec.agents[{i}].sampling")
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
    return hub.served_model(load_data(data), data), data


def _same_submission(req: Any, target: str, messages: list[dict[str, str]], sampling: dict[str, Any] | None,
                     jobs: list[Job]) -> bool:  # fmt: skip
    """Whether a SubmitJob reusing a key asks for what the key's jobs were made from (they are recorded,
    so this holds across a restart too). max_tokens 0 and the deadline are not compared (a retry may let
    them default or count its deadline from now)."""
    if not jobs:
        return False
    j = jobs[0]
    if j.swarm != req.swarm or any(x.messages != messages or x.sampling != sampling or list(x.stop) != list(req.stop)
                                   for x in jobs):  # fmt: skip
        return False
    if req.max_tokens and any(x.max_tokens != req.max_tokens for x in jobs):
        return False
    if target == "agent":
        return len(jobs) == 1 and j.agent == req.agent
    if target == "group":
        return all(x.agent.rsplit("-", 1)[0] == req.group for x in jobs)
    return len(jobs) == 1 and j.agent.startswith("job")  # a one-off agent's name: job<k>-0


def _job_pb(job: Job) -> pb.Job:
    return pb.Job(**job.snapshot())


def _info_pb(info: dict[str, Any]) -> pb.SwarmInfo:
    return pb.SwarmInfo(**info)


def _placement_pb(p: dict[str, Any]) -> pb.Placement:
    return pb.Placement(swarm=p["swarm"], generation=p["generation"],
                        workers=[pb.WorkerPlacement(**w) for w in p["workers"]])  # fmt: skip


# -- the service ----------------------------------------------------------------------------------


class Servicer(pb_grpc.SwarmServiceServicer):
    POLL_S = 0.5

    def __init__(self, hub: Hub, limits: Limits) -> None:
        self.hub, self.limits = hub, limits

    # -- swarms ---------------------------------------------------------------------------------
    @_unary
    def PlanSwarm(self, request: pb.PlanSwarmRequest, context: grpc.ServicerContext) -> pb.PlanSwarmResponse:
        cfg, _ = _config_from_request(request, self.hub)
        plan, _ = plan_config(cfg, calibrate=self.hub.calibrate)
        return pb.PlanSwarmResponse(plan_json=plan.to_json(), table=str(plan), explanation=plan.explain(),
                                    predicted_tokens_per_s=plan.tokens_per_s)  # fmt: skip

    @_unary
    def LaunchSwarm(self, request: pb.LaunchSwarmRequest, context: grpc.ServicerContext) -> pb.LaunchSwarmResponse:
        cfg, data = _config_from_request(request, self.hub)
        if cfg.model.geometry is not None:
            raise InvalidArgument("model.geometry", "describes a model with no weights: it can be planned "
                                  "(PlanSwarm), not launched; give model.path")  # fmt: skip
        run = self.hub.launch(cfg, data)
        return pb.LaunchSwarmResponse(swarm=_info_pb(run.info()), plan_json=run.plan.to_json() if run.plan else "")

    @_unary
    def StopSwarm(self, request: pb.StopSwarmRequest, context: grpc.ServicerContext) -> pb.StopSwarmResponse:
        if not request.swarm:
            raise InvalidArgument("swarm", "is empty; name the swarm to stop")
        return pb.StopSwarmResponse(swarm=_info_pb(self.hub.stop(request.swarm).info()))

    @_unary
    def ListSwarms(self, request: pb.ListSwarmsRequest, context: grpc.ServicerContext) -> pb.ListSwarmsResponse:
        return pb.ListSwarmsResponse(swarms=[_info_pb(r.info()) for r in list(self.hub.swarms.values())])

    # -- jobs -----------------------------------------------------------------------------------
    @_unary
    def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        if not request.swarm:
            raise InvalidArgument("swarm", "is empty; name a running swarm (ListSwarms)")
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument("target", "set agent, group or new_agent")
        if request.max_tokens < 0:
            raise InvalidArgument("max_tokens", f"{request.max_tokens} is negative; send 0 for the group's default")
        run = self.hub.swarm(request.swarm)
        n_ctx = run.inputs.geometry.n_ctx
        if request.max_tokens > n_ctx:
            raise InvalidArgument("max_tokens", f"{request.max_tokens:,} is more than the model's context {n_ctx:,}")
        lim = self.limits
        if not 0 <= request.deadline_s <= lim.max_deadline_s:  # NaN fails too
            raise InvalidArgument("deadline_s", f"{request.deadline_s!r} is outside [0, {lim.max_deadline_s:.0f}] "
                                  "seconds (0: the call's deadline)")  # fmt: skip
        if len(request.stop) > lim.max_stop_strings:
            raise InvalidArgument("stop", f"has {len(request.stop):,} stop strings, more than the limit of "
                                  f"{lim.max_stop_strings}")  # fmt: skip
        for i, s in enumerate(request.stop):
            if not s:
                raise InvalidArgument(f"stop[{i}]", "is empty")
            if len(s) > lim.max_stop_chars:
                raise InvalidArgument(f"stop[{i}]", f"has {len(s):,} characters, more than the limit of "
                                      f"{lim.max_stop_chars}")  # fmt: skip
        key = request.idempotency_key
        if len(key) > lim.max_key_chars:
            raise InvalidArgument("idempotency_key", f"has {len(key):,} characters, more than the limit of "
                                  f"{lim.max_key_chars}")  # fmt: skip
        messages = _messages(request.messages, lim)
        sampling = _sampling(request)
        with self.hub.lock:
            if key and key in self.hub.idempotency:  # a retry: the first submission's jobs, if it is the same body
                first = [self.hub.job(j)[1] for j in self.hub.idempotency[key]]
                if not _same_submission(request, target, messages, sampling, first):
                    raise AlreadyExists(f"idempotency_key {show(key)} was used for a different request (jobs "
                                        f"{', '.join(j.id for j in first[:4])}); resend that request unchanged to "
                                        "get its jobs, or use a new key")  # fmt: skip
                return pb.SubmitJobResponse(jobs=[_job_pb(j) for j in first])
            remaining = context.time_remaining()
            if request.deadline_s > 0:
                deadline = time.time() + request.deadline_s
            elif remaining is not None and remaining < 1e6:
                deadline = time.time() + remaining  # the call's deadline carries over to its jobs
            else:
                deadline = None
            jobs = run.submit_job(
                agent=request.agent if target == "agent" else None,
                group=request.group if target == "group" else None,
                new_agent=target == "new_agent",
                messages=messages, max_tokens=request.max_tokens, sampling=sampling, stop=tuple(request.stop),
                idempotency_key=key, deadline=deadline,
            )  # fmt: skip
            if key:
                self.hub.idempotency[key] = [j.id for j in jobs]
        return pb.SubmitJobResponse(jobs=[_job_pb(j) for j in jobs])

    @_streaming
    def StreamJob(self, request: pb.StreamJobRequest, context: grpc.ServicerContext) -> Iterator[pb.JobEvent]:
        run, job = self.hub.job(request.job_id)
        if request.offset < 0 or request.offset > len(job.token_ids):
            raise InvalidArgument("offset", f"{request.offset} is outside 0..{len(job.token_ids)} (tokens so far)")
        if request.cancel_job_on_disconnect and run is not None:
            context.add_callback(lambda: None if job.done else run.cancel_job(job.id, "client_cancelled"))
        offset = request.offset
        while context.is_active():
            tokens, pieces, finished = job.wait(offset, self.POLL_S)
            if tokens or finished:
                ev = pb.JobEvent(offset=offset, token_ids=tokens, pieces=pieces, done=finished)
                if finished:
                    ev.job.CopyFrom(_job_pb(job))
                yield ev
                offset += len(tokens)
                if finished:
                    return

    @_unary
    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        return _job_pb(self.hub.job(request.job_id)[1])

    @_unary
    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsResponse:
        if not 0 <= request.limit <= self.limits.max_list_jobs:
            raise InvalidArgument("limit", f"{request.limit} is outside [0, {self.limits.max_list_jobs}] (0: 100)")
        if request.state not in ("", "queued", "running", *TERMINAL):
            raise InvalidArgument("state", f"{show(request.state)} is not a job state (queued, running, "
                                  f"{', '.join(TERMINAL)}, or empty for all)")  # fmt: skip
        if request.swarm:
            self.hub.swarm(request.swarm)
        jobs = [j for r in list(self.hub.swarms.values()) for j in list(r.jobs.values())]
        jobs += list(self.hub.archive.values())
        jobs = [j for j in jobs if request.swarm in ("", j.swarm) and request.state in ("", j.state)]
        jobs.sort(key=lambda j: j.created, reverse=True)
        out, size = [], 0
        for j in jobs[: request.limit or 100]:  # newest first, as many as fit in one response
            p = _job_pb(j)
            size += p.ByteSize() + 8
            if size > self.limits.max_message_bytes - (64 << 10):
                break
            out.append(p)
        return pb.ListJobsResponse(jobs=out)

    @_unary
    def CancelJob(self, request: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        run, job = self.hub.job(request.job_id)
        return _job_pb(run.cancel_job(job.id) if run is not None else job)

    # -- placement ------------------------------------------------------------------------------
    @_unary
    def GetPlacement(self, request: pb.GetPlacementRequest, context: grpc.ServicerContext) -> pb.Placement:
        return _placement_pb(self.hub.swarm(request.swarm).placement())

    @_streaming
    def WatchPlacement(self, request: pb.GetPlacementRequest, context: grpc.ServicerContext) -> Iterator[pb.Placement]:
        run = self.hub.swarm(request.swarm)
        last, last_sent = None, 0.0
        while context.is_active():
            p = run.placement()
            shape = json.dumps([p["generation"], [{k: v for k, v in w.items() if k not in
                               ("measured_tokens_per_s", "kv_bytes_used", "kv_bytes_reserved", "queue_depth")}
                               for w in p["workers"]]], sort_keys=True)  # fmt: skip
            now = time.monotonic()
            if shape != last or now - last_sent > 5.0:  # a change, or a heartbeat with fresh numbers
                yield _placement_pb(p)
                last, last_sent = shape, now
            if run.state in ("stopped", "failed"):
                return
            time.sleep(self.POLL_S)


# -- parsing requests safely -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Unparsable:
    """A request body that is not the method's message (bad wire format, invalid UTF-8 in a string)."""

    type_name: str
    error: str


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as e:  # noqa: BLE001 - DecodeError and friends: answered INVALID_ARGUMENT below
            return _Unparsable(cls.DESCRIPTOR.full_name, str(e) or type(e).__name__)

    return parse


def _refuse(req: _Unparsable, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  f"the request is not a valid {req.type_name} ({req.error}); strings must be UTF-8")  # fmt: skip


def _handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The service's method handlers with parsers that turn a malformed body into INVALID_ARGUMENT."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["SwarmService"].methods:
        req_cls, resp_cls = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        fn = getattr(servicer, m.name)
        if m.server_streaming:

            def stream(request: Any, context: grpc.ServicerContext, fn: Any = fn) -> Iterator[Any]:
                if isinstance(request, _Unparsable):
                    _refuse(request, context)
                yield from fn(request, context)

            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=_parser(req_cls), response_serializer=resp_cls.SerializeToString
            )
        else:

            def unary(request: Any, context: grpc.ServicerContext, fn: Any = fn) -> Any:
                if isinstance(request, _Unparsable):
                    _refuse(request, context)
                return fn(request, context)

            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=_parser(req_cls), response_serializer=resp_cls.SerializeToString
            )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


# -- the server --------------------------------------------------------------------------------------


@dataclass
class Server:
    server: grpc.Server
    hub: Hub
    port: int
    host: str
    token: str | None
    health: health.HealthServicer

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: float = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait(grace + 5)
        self.hub.shutdown()


def swarm_health_name(swarm: str) -> str:
    """The gRPC health service of one swarm: SERVING while it runs and records, NOT_SERVING otherwise."""
    return f"kvswarm.swarm/{swarm}"


def serve(
    *,
    conn: scheduler.Connection,
    host: str = "127.0.0.1",
    port: int = 50051,
    token: str | None,
    tls: tuple[bytes, bytes] | None = None,
    out_root: Path = Path("runs"),
    limits: Limits = Limits(),
    max_workers: int = 512,
    echo: Callable[[str], None] = print,
    calibrate: Callable[[Path, str, int], dict] | None = None,
    store_path: Path | None = None,
    tokens_file: Path | None = None,
    models_dir: Path | None = None,
) -> Server:
    """Starts the server (token None: auth disabled, for local development only).

    `token` is the default (admin) token; `tokens_file` holds the tokens made by
    `swarm token create`, re-read when it changes. `max_workers` calls are
    admitted at once, shared out per token identity (swarm/auth.py).

    A client's model.path may name only the default model or a *.gguf file under `models_dir`.

    Swarms and jobs are recorded in `store_path` (default <out_root>/kvswarm.db);
    swarms a previous server left running there are resumed before it listens.
    """
    hub = Hub(conn=conn, out_root=out_root, store=Store(store_path or out_root / "kvswarm.db"), echo=echo,
              calibrate=calibrate, models_dir=Path(models_dir) if models_dir else None)  # fmt: skip
    hub.recover()
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes)]  # fmt: skip
    admission = auth.Admission(slots=max_workers, streams_per_identity=limits.max_streams_per_client)
    tokens = auth.Tokens(token, tokens_file, echo=echo) if token else None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=admission.threads, thread_name_prefix="grpc"),
                         interceptors=[auth.Gate(tokens, auth.Limiter(admission))], options=options,
                         maximum_concurrent_rpcs=admission.threads)  # fmt: skip
    server.add_generic_rpc_handlers((_handlers(Servicer(hub, limits)),))
    h = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(h, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, grpc.ssl_server_credentials([(tls[1], tls[0])])) if tls else \
        server.add_insecure_port(address)  # fmt: skip
    if bound == 0:
        raise scheduler.SchedulerError(f"cannot listen on {address}: the port is taken or not allowed")
    server.start()
    for name in ("", SERVICE):
        h.set(name, health_pb2.HealthCheckResponse.SERVING)
    hub.on_swarm_state = lambda run: h.set(swarm_health_name(run.cfg.name), health_pb2.HealthCheckResponse.SERVING
                                           if run.healthy else health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip
    for run in list(hub.swarms.values()):
        hub.on_swarm_state(run)
    return Server(server=server, hub=hub, port=bound, host=host, token=token, health=h)
