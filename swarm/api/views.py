"""Domain values as the API's protobuf messages (the inverse of swarm/api/requests.py)."""

from __future__ import annotations

from typing import Any

from swarm.jobs import Job
from swarm.v1 import swarm_pb2 as pb


def job_pb(job: Job) -> pb.Job:
    return pb.Job(**job.snapshot())


def info_pb(info: dict[str, Any]) -> pb.SwarmInfo:
    return pb.SwarmInfo(**info)


def worker_placement_pb(w: dict[str, Any]) -> pb.WorkerPlacement:
    plain = {k: v for k, v in w.items() if k not in ("sessions", "lifecycle")}
    return pb.WorkerPlacement(**plain, sessions=[pb.SessionState(**s) for s in w.get("sessions", ())],
                              lifecycle=pb.Lifecycle(**w.get("lifecycle", {})))  # fmt: skip


def placement_pb(p: dict[str, Any]) -> pb.Placement:
    return pb.Placement(swarm=p["swarm"], generation=p["generation"],
                        workers=[worker_placement_pb(w) for w in p["workers"]])  # fmt: skip
