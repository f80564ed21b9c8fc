"""Domain values as the API's protobuf messages (the inverse of swarm/api/requests.py)."""

from __future__ import annotations

from typing import Any

from swarm.jobs import Job
from swarm.v1 import swarm_pb2 as pb


def job_pb(job: Job) -> pb.Job:
    return pb.Job(**job.snapshot())


def info_pb(info: dict[str, Any]) -> pb.SwarmInfo:
    return pb.SwarmInfo(**info)


def placement_pb(p: dict[str, Any]) -> pb.Placement:
    return pb.Placement(swarm=p["swarm"], generation=p["generation"],
                        workers=[pb.WorkerPlacement(**w) for w in p["workers"]])  # fmt: skip
