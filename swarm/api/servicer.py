"""swarm.v1.SwarmService's handlers, kept thin: each converts the request (swarm/api/requests.py), calls the
hub or a swarm, and converts back (swarm/api/views.py); every failure maps to a code in swarm/api/status.py."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from swarm.api import requests, status
from swarm.api.hub import Hub
from swarm.api.requests import Limits, ListJobsQuery, SubmitRequest
from swarm.api.views import info_pb, job_pb, placement_pb
from swarm.config import show
from swarm.errors import AlreadyExists, InvalidArgument
from swarm.planning import plan_config
from swarm.v1 import swarm_pb2 as pb
from swarm.v1 import swarm_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["SwarmService"].full_name
HEARTBEAT_S = 5.0  # WatchPlacement sends fresh numbers at least this often, even with no change
# Placement fields that change all the time: a change in them alone is not a new placement.
_LIVE_FIELDS = ("measured_tokens_per_s", "kv_bytes_used", "kv_bytes_reserved", "queue_depth", "sessions", "lifecycle")


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            requests.check_names(request, self.limits)
            return fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure gets a defined code (status.code)
            status.abort(context, e)

    return wrapper


def _streaming(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            requests.check_names(request, self.limits)
            yield from fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure gets a defined code (status.code)
            status.abort(context, e)

    return wrapper


def _deadline(deadline_s: float, context: grpc.ServicerContext) -> float | None:
    """A job's deadline (time.time()): its own deadline_s, else the call's, else none."""
    remaining: float | None = context.time_remaining()
    if deadline_s > 0:
        return time.time() + deadline_s
    if remaining is not None and remaining < 1e6:
        return time.time() + remaining  # the call's deadline carries over to its jobs
    return None


class Servicer(pb_grpc.SwarmServiceServicer):
    POLL_S = 0.5

    def __init__(self, hub: Hub, limits: Limits) -> None:
        self.hub, self.limits = hub, limits

    # -- swarms ---------------------------------------------------------------------------------
    @_unary
    def PlanSwarm(self, request: pb.PlanSwarmRequest, context: grpc.ServicerContext) -> pb.PlanSwarmResponse:
        cfg, _ = requests.config_from_request(request, self.hub.served_model)
        plan, _ = plan_config(cfg, calibrate=self.hub.calibrate)
        return pb.PlanSwarmResponse(plan_json=plan.to_json(), table=str(plan), explanation=plan.explain(),
                                    predicted_tokens_per_s=plan.tokens_per_s)  # fmt: skip

    @_unary
    def LaunchSwarm(self, request: pb.LaunchSwarmRequest, context: grpc.ServicerContext) -> pb.LaunchSwarmResponse:
        cfg, data = requests.config_from_request(request, self.hub.served_model)
        if cfg.model.geometry is not None:
            raise InvalidArgument("model.geometry", "describes a model with no weights: it can be planned "
                                  "(PlanSwarm), not launched; give model.path")  # fmt: skip
        run = self.hub.launch(cfg, data)
        return pb.LaunchSwarmResponse(swarm=info_pb(run.info()), plan_json=run.plan.to_json() if run.plan else "")

    @_unary
    def StopSwarm(self, request: pb.StopSwarmRequest, context: grpc.ServicerContext) -> pb.StopSwarmResponse:
        if not request.swarm:
            raise InvalidArgument("swarm", "is empty; name the swarm to stop")
        return pb.StopSwarmResponse(swarm=info_pb(self.hub.stop(request.swarm).info()))

    @_unary
    def ListSwarms(self, request: pb.ListSwarmsRequest, context: grpc.ServicerContext) -> pb.ListSwarmsResponse:
        return pb.ListSwarmsResponse(swarms=[info_pb(r.info()) for r in list(self.hub.swarms.values())])

    # -- jobs -----------------------------------------------------------------------------------
    @_unary
    def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        sub = SubmitRequest.parse(request, self.limits, lambda name: self.hub.swarm(name).inputs.geometry.n_ctx)
        run = self.hub.swarm(sub.swarm)
        key = sub.idempotency_key
        with self.hub.lock:
            if key and key in self.hub.idempotency:  # a retry: the first submission's jobs, if it is the same body
                first = [self.hub.job(j)[1] for j in self.hub.idempotency[key]]
                if not sub.same_as(first):
                    raise AlreadyExists(f"idempotency_key {show(key)} was used for a different request (jobs "
                                        f"{', '.join(j.id for j in first[:4])}); resend that request unchanged to "
                                        "get its jobs, or use a new key")  # fmt: skip
                return pb.SubmitJobResponse(jobs=[job_pb(j) for j in first])
            jobs = run.submit_job(
                agent=sub.agent, group=sub.group, new_agent=sub.target == "new_agent",
                messages=sub.messages, max_tokens=sub.max_tokens, sampling=sub.sampling, stop=sub.stop,
                idempotency_key=key, deadline=_deadline(sub.deadline_s, context),
            )  # fmt: skip
            if key:
                self.hub.idempotency[key] = [j.id for j in jobs]
        return pb.SubmitJobResponse(jobs=[job_pb(j) for j in jobs])

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
                    ev.job.CopyFrom(job_pb(job))
                yield ev
                offset += len(tokens)
                if finished:
                    return

    @_unary
    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        return job_pb(self.hub.job(request.job_id)[1])

    @_unary
    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsResponse:
        query = ListJobsQuery.parse(request, self.limits)
        if query.swarm:
            self.hub.swarm(query.swarm)
        jobs = [j for r in list(self.hub.swarms.values()) for j in list(r.jobs.values())]
        jobs += list(self.hub.archive.values())
        jobs = [j for j in jobs if query.matches(j)]
        jobs.sort(key=lambda j: j.created, reverse=True)
        out, size = [], 0
        for j in jobs[: query.limit]:  # newest first, as many as fit in one response
            p = job_pb(j)
            size += p.ByteSize() + 8
            if size > self.limits.max_message_bytes - (64 << 10):
                break
            out.append(p)
        return pb.ListJobsResponse(jobs=out)

    @_unary
    def CancelJob(self, request: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        run, job = self.hub.job(request.job_id)
        return job_pb(run.cancel_job(job.id) if run is not None else job)

    # -- placement ------------------------------------------------------------------------------
    @_unary
    def GetPlacement(self, request: pb.GetPlacementRequest, context: grpc.ServicerContext) -> pb.Placement:
        return placement_pb(self.hub.swarm(request.swarm).placement())

    @_streaming
    def WatchPlacement(self, request: pb.GetPlacementRequest, context: grpc.ServicerContext) -> Iterator[pb.Placement]:
        run = self.hub.swarm(request.swarm)
        last, last_sent = None, 0.0
        while context.is_active():
            p = run.placement()
            shape = json.dumps([p["generation"], [{k: v for k, v in w.items() if k not in _LIVE_FIELDS}
                                                  for w in p["workers"]]], sort_keys=True)  # fmt: skip
            now = time.monotonic()
            if shape != last or now - last_sent > HEARTBEAT_S:  # a change, or a heartbeat with fresh numbers
                yield placement_pb(p)
                last, last_sent = shape, now
            if run.state in ("stopped", "failed"):
                return
            time.sleep(self.POLL_S)
