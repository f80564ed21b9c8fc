"""gRPC server for swarm.v1.SwarmService (protos/swarm/v1/swarm.proto).

One server holds one Ray connection and any number of swarms, each a
`SwarmRun` in serve mode (its agents work through their tasks, then wait for
jobs). Handlers validate every field before it reaches a swarm, and map the
swarm layer's typed errors onto status codes. Nothing a client sends is
unpickled or executed: requests are protobuf messages and YAML parsed with
`yaml.safe_load`.

Security: binds 127.0.0.1 unless told otherwise; every call but health
checking needs `authorization: Bearer <token>` unless auth is disabled; TLS
when a certificate and key are given; limits on message size, prompt size and
concurrent streams per client.
"""

from __future__ import annotations

import functools
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from swarm import scheduler
from swarm.config import SwarmConfig, load_config
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
from swarm.jobs import Job
from swarm.launch import SwarmRun
from swarm.planning import plan_config, plan_inputs
from swarm.store import Store
from swarm.v1 import swarm_pb2 as pb
from swarm.v1 import swarm_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["SwarmService"].full_name
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 4 << 20  # one request or response
    max_prompt_chars: int = 256 << 10  # all messages of one job together
    max_messages: int = 256
    max_streams_per_client: int = 256  # StreamJob + WatchPlacement at once, per client
    max_jobs_per_request: int = 1024  # a group submission


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


def _code(e: BaseException) -> grpc.StatusCode | None:
    return next((c for t, c in _CODES if isinstance(e, t)), None)


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except SwarmError as e:
            context.abort(_code(e) or grpc.StatusCode.UNKNOWN, str(e))

    return wrapper


def _streaming(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from fn(self, request, context)
        except SwarmError as e:
            context.abort(_code(e) or grpc.StatusCode.UNKNOWN, str(e))

    return wrapper


# -- auth -------------------------------------------------------------------------------------


class _BearerAuth(grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` (health checks are open)."""

    OPEN = ("/grpc.health.v1.Health/",)

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'")  # fmt: skip

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(self.OPEN):
            return continuation(details)
        got = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(got, str) and hmac.compare_digest(got.encode(), self._expected):
            return continuation(details)
        handler = continuation(details)
        if handler is not None and handler.response_streaming:
            return self._deny_stream
        return self._deny_unary


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
        return SwarmRun(cfg, inputs, scheduler.Scheduler(cfg.name, self.conn), out, echo=self.echo, live=False,
                        serve=True, store=self.store)  # fmt: skip

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
            raise NotFound(f"no swarm {name!r} (running: {', '.join(self.swarms) or 'none'})")
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
        raise NotFound(f"no job {job_id!r}")

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
            raise InvalidArgument(f"{path}[{i}].role", f"{m.role!r} is not one of {', '.join(ROLES)}")
        chars += len(m.content)
        out.append({"role": m.role, "content": m.content})
    if chars > limits.max_prompt_chars:
        raise ResourceExhausted(f"{path}: {chars:,} characters, more than the limit of {limits.max_prompt_chars:,}")
    if out[-1]["role"] == "assistant":
        raise InvalidArgument(f"{path}[{len(out) - 1}].role", "the last message must not be the assistant's")
    return out


def _sampling(req: Any) -> dict[str, Any] | None:
    if not req.HasField("sampling"):
        return None
    s = req.sampling
    checks = [("temperature", s.temperature, 0, 100), ("top_p", s.top_p, 0, 1),
              ("repetition_penalty", s.repetition_penalty, 0, 10), ("top_k", s.top_k, 0, 1 << 20)]  # fmt: skip
    for name, v, lo, hi in checks:
        if not lo <= v <= hi or v != v:
            raise InvalidArgument(f"sampling.{name}", f"{v} is outside [{lo}, {hi}]")
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p or 1.0,
            "repetition_penalty": s.repetition_penalty or 1.0, "seed": s.seed}  # fmt: skip


def _config_from_request(req: Any) -> tuple[SwarmConfig, dict[str, Any]]:
    if req.WhichOneof("source") == "config_yaml" or isinstance(req, pb.PlanSwarmRequest):
        text = req.config_yaml
        if not text.strip():
            raise InvalidArgument("config_yaml", "is empty; send a swarm config (configs/swarm.schema.json)")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidArgument("config_yaml", f"is not valid YAML ({e})") from e
        return load_config(data), data
    if req.WhichOneof("source") != "spec":
        raise InvalidArgument("source", "send config_yaml or spec")
    sp = req.spec
    data: dict[str, Any] = {"name": sp.name, "agents": [], "workers": []}
    if sp.model_path:
        data["model"] = {"path": sp.model_path}
    for g in sp.agents:
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
            gs = g.sampling
            d["sampling"] = {"temperature": gs.temperature, "top_k": gs.top_k, "top_p": gs.top_p or 1.0,
                             "repetition_penalty": gs.repetition_penalty or 1.0, "seed": gs.seed}  # fmt: skip
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
    return load_config(data), data


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
        self._streams: dict[str, int] = {}
        self._streams_lock = threading.Lock()

    # -- streams per client ---------------------------------------------------------------
    def _client(self, context: grpc.ServicerContext) -> str:
        md = dict(context.invocation_metadata() or ())
        given = md.get("x-client-id")
        if isinstance(given, str) and given:
            return given[:128]
        peer = context.peer()  # "ipv4:127.0.0.1:54321"
        return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer

    def _open_stream(self, context: grpc.ServicerContext) -> Callable[[], None]:
        client = self._client(context)
        with self._streams_lock:
            n = self._streams.get(client, 0)
            if n >= self.limits.max_streams_per_client:
                raise ResourceExhausted(f"client {client} already has {n} open streams (the limit); "
                                        "close some or wait for their jobs to end")  # fmt: skip
            self._streams[client] = n + 1

        def close() -> None:
            with self._streams_lock:
                self._streams[client] -= 1

        return close

    # -- swarms ---------------------------------------------------------------------------------
    @_unary
    def PlanSwarm(self, request: pb.PlanSwarmRequest, context: grpc.ServicerContext) -> pb.PlanSwarmResponse:
        cfg, _ = _config_from_request(request)
        plan, _ = plan_config(cfg, calibrate=self.hub.calibrate)
        return pb.PlanSwarmResponse(plan_json=plan.to_json(), table=str(plan), explanation=plan.explain(),
                                    predicted_tokens_per_s=plan.tokens_per_s)  # fmt: skip

    @_unary
    def LaunchSwarm(self, request: pb.LaunchSwarmRequest, context: grpc.ServicerContext) -> pb.LaunchSwarmResponse:
        cfg, data = _config_from_request(request)
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
        if request.deadline_s < 0 or request.deadline_s != request.deadline_s:
            raise InvalidArgument("deadline_s", f"{request.deadline_s} is negative")
        for i, s in enumerate(request.stop):
            if not s:
                raise InvalidArgument(f"stop[{i}]", "is empty")
        messages = _messages(request.messages, self.limits)
        sampling = _sampling(request)
        key = request.idempotency_key
        with self.hub.lock:
            if key and key in self.hub.idempotency:  # a retry: the first submission's jobs
                return pb.SubmitJobResponse(jobs=[_job_pb(self.hub.job(j)[1]) for j in self.hub.idempotency[key]])
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
        close = self._open_stream(context)
        if request.cancel_job_on_disconnect and run is not None:
            context.add_callback(lambda: None if job.done else run.cancel_job(job.id, "client_cancelled"))
        offset = request.offset
        try:
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
        finally:
            close()

    @_unary
    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        return _job_pb(self.hub.job(request.job_id)[1])

    @_unary
    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsResponse:
        if request.limit < 0:
            raise InvalidArgument("limit", f"{request.limit} is negative")
        if request.swarm:
            self.hub.swarm(request.swarm)
        jobs = [j for r in list(self.hub.swarms.values()) for j in list(r.jobs.values())]
        jobs += list(self.hub.archive.values())
        jobs = [j for j in jobs if request.swarm in ("", j.swarm) and request.state in ("", j.state)]
        jobs.sort(key=lambda j: j.created, reverse=True)
        return pb.ListJobsResponse(jobs=[_job_pb(j) for j in jobs[: request.limit or 100]])

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
        close = self._open_stream(context)
        try:
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
        finally:
            close()


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
) -> Server:
    """Starts the server (token None: auth disabled, for local development only).

    Swarms and jobs are recorded in `store_path` (default <out_root>/kvswarm.db);
    swarms a previous server left running there are resumed before it listens.
    """
    hub = Hub(conn=conn, out_root=out_root, store=Store(store_path or out_root / "kvswarm.db"), echo=echo,
              calibrate=calibrate)  # fmt: skip
    hub.recover()
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes)]  # fmt: skip
    interceptors = [_BearerAuth(token)] if token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         interceptors=interceptors, options=options, maximum_concurrent_rpcs=max_workers)  # fmt: skip
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
    return Server(server=server, hub=hub, port=bound, host=host, token=token, health=h)
