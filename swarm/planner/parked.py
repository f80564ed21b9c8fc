"""Parked agents in the plan: their KV is host memory (RAM or disk), not device KV, so they take no reservation.

A parked agent's KV was copied off the device (worker/park.py) and its pool blocks freed; what it holds is its
snapshot: every position of the global layers and, for sliding-window layers, the positions still in the window,
at its worker's (K, V) row bytes. The planner leaves it out of the agent counts it reserves blocks for, and reports
the bytes per worker and tier. Its next turn gets blocks on its worker as any turn does: the worker parks the idle
session of least value to make room (docs/RELIABILITY.md, "Session lifecycle").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from swarm.planner.geometry import ModelGeometry
from swarm.planner.request import AgentGroup

TIERS = ("ram", "disk")


@dataclass(frozen=True)
class ParkedAgent:
    """An agent whose KV is parked on a worker's host."""

    name: str
    group: str  # its planner group (the AgentGroup name it is counted in)
    worker: str
    tokens: int  # positions its snapshot holds
    kv_k: str
    kv_v: str
    where: str  # "ram" or "disk"

    def __post_init__(self) -> None:
        if self.where not in TIERS:
            raise ValueError(f"parked agent {self.name}: where {self.where!r} is not one of {TIERS}")
        if self.tokens < 0:
            raise ValueError(f"parked agent {self.name}: tokens {self.tokens} is negative")


@dataclass(frozen=True)
class ParkedOnWorker:
    """What one worker's host holds for its parked agents."""

    worker: str
    agents: tuple[str, ...]
    ram_bytes: int
    disk_bytes: int


def parked_bytes(geom: ModelGeometry, p: ParkedAgent) -> int:
    """Bytes of a parked agent's KV: tokens x the global layers' bytes per token, plus the window's positions x
    the sliding layers' (its snapshot holds no more of them)."""
    global_bpt, sliding_bpt = geom.class_bytes_per_token((p.kv_k, p.kv_v))
    window = min(p.tokens, geom.sliding_window) if sliding_bpt else 0
    return p.tokens * global_bpt + window * sliding_bpt


def resident_groups(groups: Sequence[AgentGroup], parked: Sequence[ParkedAgent]) -> list[AgentGroup]:
    """The groups with their parked agents taken out (a group left with none is dropped): what takes KV."""
    by_group: dict[str, int] = {}
    for p in parked:
        by_group[p.group] = by_group.get(p.group, 0) + 1
    known = {g.name for g in groups}
    unknown = sorted(set(by_group) - known)
    if unknown:
        raise ValueError(f"parked agents name groups not in the plan: {', '.join(unknown)}; known: {sorted(known)}")
    out = []
    for g in groups:
        n = by_group.get(g.name, 0)
        if n > g.count:
            raise ValueError(f"group {g.name}: {n} parked agents, more than its {g.count} agents")
        if g.count > n:
            out.append(dataclasses.replace(g, count=g.count - n))
    return out


def parked_by_worker(geom: ModelGeometry, parked: Sequence[ParkedAgent]) -> tuple[ParkedOnWorker, ...]:
    """Per worker (in name order): its parked agents and their bytes in host RAM and on disk."""
    workers: dict[str, list[ParkedAgent]] = {}
    for p in parked:
        workers.setdefault(p.worker, []).append(p)
    out = []
    for w in sorted(workers):
        ps = workers[w]
        ram = sum(parked_bytes(geom, p) for p in ps if p.where == "ram")
        disk = sum(parked_bytes(geom, p) for p in ps if p.where == "disk")
        out.append(ParkedOnWorker(w, tuple(sorted(p.name for p in ps)), ram, disk))
    return tuple(out)
