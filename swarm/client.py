"""Typed Python client for the kvswarm gRPC API.

    with SwarmClient("127.0.0.1:50051", token=TOKEN) as c:
        c.launch(Path("configs/demo.yaml").read_text())
        job = c.submit("demo", agent="researcher-0", messages=[("user", "Summarize your findings.")])[0]
        for piece in c.stream_text(job.id):
            print(piece, end="", flush=True)

Streams resume by themselves: `stream` reconnects from the last offset it
received when the connection drops, so no token is missed or repeated.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from swarm.v1 import swarm_pb2 as pb
from swarm.v1 import swarm_pb2_grpc as pb_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class SwarmClient:
    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout_s: float = 60.0,
        client_id: str | None = None,
    ) -> None:
        if root_certificates is not None:
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates))
        else:
            self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.SwarmServiceStub(self.channel)
        self.timeout_s = timeout_s
        self.metadata: list[tuple[str, str]] = []
        if token:
            self.metadata.append(("authorization", f"Bearer {token}"))
        if client_id:
            self.metadata.append(("x-client-id", client_id))

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        return method(request, timeout=timeout or self.timeout_s, metadata=self.metadata)

    # -- swarms ---------------------------------------------------------------------------------
    def health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel)
        r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s)
        result: str = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        return result

    def plan(self, config_yaml: str) -> pb.PlanSwarmResponse:
        result: pb.PlanSwarmResponse = self._call(
            self.stub.PlanSwarm, pb.PlanSwarmRequest(config_yaml=config_yaml), timeout=600
        )
        return result

    def launch(self, config_yaml: str | None = None, *, spec: pb.SwarmSpec | None = None) -> pb.LaunchSwarmResponse:
        req = pb.LaunchSwarmRequest(spec=spec) if spec is not None else pb.LaunchSwarmRequest(config_yaml=config_yaml)
        result: pb.LaunchSwarmResponse = self._call(self.stub.LaunchSwarm, req, timeout=900)
        return result

    def stop(self, swarm: str) -> pb.SwarmInfo:
        result: pb.SwarmInfo = self._call(self.stub.StopSwarm, pb.StopSwarmRequest(swarm=swarm), timeout=300).swarm
        return result

    def swarms(self) -> list[pb.SwarmInfo]:
        return list(self._call(self.stub.ListSwarms, pb.ListSwarmsRequest()).swarms)

    # -- jobs -----------------------------------------------------------------------------------
    def submit(
        self,
        swarm: str,
        *,
        agent: str | None = None,
        group: str | None = None,
        new_agent: bool = False,
        messages: Iterable[tuple[str, str]] | Sequence[pb.Message],
        max_tokens: int = 0,
        sampling: dict[str, Any] | None = None,
        stop: Sequence[str] = (),
        idempotency_key: str = "",
        deadline_s: float = 0.0,
    ) -> list[pb.Job]:
        msgs = [m if isinstance(m, pb.Message) else pb.Message(role=m[0], content=m[1]) for m in messages]
        req = pb.SubmitJobRequest(swarm=swarm, messages=msgs, max_tokens=max_tokens, stop=list(stop),
                                  idempotency_key=idempotency_key, deadline_s=deadline_s)  # fmt: skip
        if agent is not None:
            req.agent = agent
        elif group is not None:
            req.group = group
        elif new_agent:
            req.new_agent = True
        if sampling is not None:
            req.sampling.CopyFrom(pb.Sampling(**sampling))
        return list(self._call(self.stub.SubmitJob, req, timeout=300).jobs)

    def stream(self, job_id: str, offset: int = 0, *, retries: int = 5, cancel_on_disconnect: bool = False,
               timeout: float | None = None) -> Iterator[pb.JobEvent]:  # fmt: skip
        """Events from `offset` to the end; reconnects from the last offset seen if the stream breaks."""
        attempt = 0
        while True:
            req = pb.StreamJobRequest(job_id=job_id, offset=offset, cancel_job_on_disconnect=cancel_on_disconnect)
            try:
                for ev in self.stub.StreamJob(req, timeout=timeout, metadata=self.metadata):
                    attempt = 0
                    offset = ev.offset + len(ev.token_ids)
                    yield ev
                    if ev.done:
                        return
                return
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt >= retries:
                    raise
                attempt += 1
                time.sleep(min(0.2 * 2**attempt, 5.0))

    def stream_text(self, job_id: str, offset: int = 0) -> Iterator[str]:
        for ev in self.stream(job_id, offset):
            yield from ev.pieces

    def job(self, job_id: str) -> pb.Job:
        result: pb.Job = self._call(self.stub.GetJob, pb.GetJobRequest(job_id=job_id))
        return result

    def jobs(self, swarm: str = "", state: str = "", limit: int = 100) -> list[pb.Job]:
        return list(self._call(self.stub.ListJobs, pb.ListJobsRequest(swarm=swarm, state=state, limit=limit)).jobs)

    def cancel(self, job_id: str) -> pb.Job:
        result: pb.Job = self._call(self.stub.CancelJob, pb.CancelJobRequest(job_id=job_id))
        return result

    def generate(self, swarm: str, messages: Iterable[tuple[str, str]], **kwargs: Any) -> pb.Job:
        """Submit one job and wait for it; the finished Job."""
        job = self.submit(swarm, messages=messages, **kwargs)[0]
        for ev in self.stream(job.id):
            if ev.done:
                return ev.job
        return self.job(job.id)

    # -- placement --------------------------------------------------------------------------------
    def placement(self, swarm: str) -> pb.Placement:
        result: pb.Placement = self._call(self.stub.GetPlacement, pb.GetPlacementRequest(swarm=swarm))
        return result

    def watch_placement(self, swarm: str, timeout: float | None = None) -> Any:
        """An iterator of Placement messages (the call: `.cancel()` ends it)."""
        return self.stub.WatchPlacement(pb.GetPlacementRequest(swarm=swarm), timeout=timeout, metadata=self.metadata)
