"""Placement as data: what a new plan changes about the workers and agents running now.

`diff(plan, current) -> PlacementChange` is pure (no Ray, no engine); the runtime applies the change in
one place (swarm/runtime/apply.py). The order of a change's steps is the contract:

    stop -> agents leave -> resize -> start -> agents arrive -> reserve

NOTE: agents leave their old workers (freeing KV) before a kept worker's budget moves, and arrive (re-prefilled
from their history) only after it has: a budget never shrinks under sessions that are still there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from swarm.runtime.names import agent_key, compact_names

if TYPE_CHECKING:
    from swarm.planner import Plan, WorkerPlan


@dataclass(frozen=True, order=True)
class GroupKey:
    """A planner group: a configured group at one reserved context (agents that grew get their own)."""

    name: str
    context: int | None = None  # None: the group's configured context

    def __str__(self) -> str:  # the planner's group name
        return self.name if self.context is None else f"{self.name}@{self.context}"


@dataclass(frozen=True)
class Reservation:
    label: str  # an agent's name, or "<group>.prefix" for a group's shared system-prompt blocks
    kv_bytes: int


@dataclass(frozen=True)
class WorkerNow:
    """A worker as it runs now."""

    running: bool
    kv_k: str
    kv_v: str
    kv_budget_bytes: int
    reservations: tuple[Reservation, ...] = ()  # as held (zero-byte ones are not held)


@dataclass(frozen=True)
class AgentNow:
    name: str
    group: GroupKey
    worker: str | None  # None: unplaced (its worker was lost, or it is new)


@dataclass(frozen=True)
class Current:
    """What runs now: the swarm's workers (in start order) and its unfinished agents."""

    workers: Mapping[str, WorkerNow] = field(default_factory=dict)
    agents: tuple[AgentNow, ...] = ()


@dataclass(frozen=True)
class WorkerStop:
    worker: str
    reason: str


@dataclass(frozen=True)
class WorkerResize:
    """Same formats, a new KV budget: the engine's budget moves in place and its sessions stay."""

    worker: str
    kv_budget_bytes: int
    agents: tuple[str, ...]  # the agents it holds after the change, in agent_key order


@dataclass(frozen=True)
class WorkerStart:
    plan: WorkerPlan
    agents: tuple[str, ...]  # in agent_key order

    @property
    def worker(self) -> str:
        return self.plan.worker


@dataclass(frozen=True)
class AgentMove:
    """src None: newly placed; dst None: unplaced; src == dst: its worker restarts (it is re-prefilled)."""

    agent: str
    src: str | None
    dst: str | None


@dataclass(frozen=True)
class PlacementChange:
    stop: tuple[WorkerStop, ...] = ()
    resize: tuple[WorkerResize, ...] = ()
    start: tuple[WorkerStart, ...] = ()
    moves: tuple[AgentMove, ...] = ()
    reserve: tuple[str, ...] = ()  # workers whose reservations change (started ones included)
    # {worker: the reservations it holds after the change}, every planned worker
    reservations: Mapping[str, tuple[Reservation, ...]] = field(default_factory=dict, compare=False)
    assignment: Mapping[str, str | None] = field(default_factory=dict, compare=False)  # {agent: worker} after

    @property
    def empty(self) -> bool:
        return not (self.stop or self.resize or self.start or self.moves or self.reserve)

    def __bool__(self) -> bool:
        return not self.empty

    @property
    def leaving(self) -> tuple[AgentMove, ...]:
        """Agents whose session ends on a worker that stays up (a stopped worker's agents go with it)."""
        stopped = {s.worker for s in self.stop}
        return tuple(m for m in self.moves if m.src is not None and m.src not in stopped)

    @property
    def arriving(self) -> tuple[AgentMove, ...]:
        return tuple(m for m in self.moves if m.dst is not None)

    def steps(self) -> list[str]:
        out = [f"stop {s.worker}: {s.reason}" for s in self.stop]
        out += [f"leave {m.agent} from {m.src}" for m in self.leaving]
        out += [f"resize {r.worker} to {r.kv_budget_bytes:,} bytes of KV ({compact_names(r.agents)})"
                for r in self.resize]  # fmt: skip
        out += [f"start {s.worker} with KV {s.plan.format} ({compact_names(s.agents)})" for s in self.start]
        out += [f"place {m.agent} on {m.dst}" + (f" (from {m.src})" if m.src else "") for m in self.arriving]
        out += [f"unplace {m.agent} (from {m.src})" for m in self.moves if m.dst is None]
        for w in self.reserve:
            res = self.reservations[w]
            out.append(f"reserve {sum(r.kv_bytes for r in res):,} bytes of KV on {w} ({len(res)} reservations)")
        return out

    def __str__(self) -> str:
        return "\n".join(self.steps()) if self else "no change"


def kv_budget(wp: WorkerPlan) -> int:
    """The engine's KV budget for a planned worker: its reserved blocks, at least one block."""
    return max(wp.kv_bytes, wp.block_bytes)


def assign(plan: Plan, agents: Iterable[AgentNow]) -> dict[str, str | None]:
    """Agent -> worker for a plan, keeping agents where they are when the plan allows (None: no room)."""
    by: dict[GroupKey, list[AgentNow]] = {}
    for a in agents:
        by.setdefault(a.group, []).append(a)
    out: dict[str, str | None] = {}
    for key, members in by.items():
        want = {wp.worker: next((g.agents for g in wp.groups if g.group == str(key)), 0) for wp in plan.workers}
        movers = []
        for a in members:
            if a.worker is not None and want.get(a.worker, 0) > 0:
                want[a.worker] -= 1
                out[a.name] = a.worker
            else:
                movers.append(a)
        for a in movers:
            w = next((w for w, n in want.items() if n > 0), None)
            if w is not None:
                want[w] -= 1
            out[a.name] = w
    return out


def reservations(
    wp: WorkerPlan, assignment: Mapping[str, str | None], groups: Mapping[str, GroupKey]
) -> tuple[Reservation, ...]:
    """The KV a planned worker holds for the agents assigned to it: each group's shared prefix, then each agent."""
    keys = {str(k): k for k in groups.values()}
    out: list[Reservation] = []
    for g in wp.groups:
        names = sorted((n for n, w in assignment.items() if w == wp.worker and str(groups[n]) == g.group),
                       key=agent_key)  # fmt: skip
        if g.shared_blocks and names:
            out.append(Reservation(f"{keys[g.group].name}.prefix", g.shared_blocks * wp.block_bytes))
        per_agent = g.blocks_per_agent * wp.block_bytes + g.sliding_blocks_per_agent * wp.sliding_block_bytes
        out += [Reservation(name, per_agent) for name in names]
    return tuple(r for r in out if r.kv_bytes > 0)


def diff(plan: Plan, current: Current) -> PlacementChange:
    """What placing `plan` changes about `current`: nothing for a plan that is already in place."""
    planned = {wp.worker: wp for wp in plan.workers if wp.agents > 0}
    assignment = assign(plan, current.agents)
    groups = {a.name: a.group for a in current.agents}
    stop = []
    for w, now in current.workers.items():
        wp = planned.get(w)
        if now.running and wp is None:
            stop.append(WorkerStop(w, f"worker {w} has no agents in the new plan"))
        elif now.running and wp is not None and (now.kv_k, now.kv_v) != (wp.kv_k, wp.kv_v):
            stop.append(WorkerStop(w, f"{w} restarts with KV {wp.format}"))
        elif not now.running and wp is not None:
            stop.append(WorkerStop(w, f"{w} restarts: it is not running"))
    stopped = {s.worker for s in stop}
    moves = tuple(
        AgentMove(a.name, a.worker, assignment[a.name])
        for a in current.agents
        if a.worker != assignment[a.name] or a.worker in stopped
        or (a.worker is not None and a.worker not in current.workers)
    )  # fmt: skip
    resize, start, reserve, held = [], [], [], {}
    for w, wp in planned.items():
        names = tuple(sorted((n for n, x in assignment.items() if x == w), key=agent_key))
        here = current.workers.get(w)
        if here is None or w in stopped:
            start.append(WorkerStart(wp, names))
        elif here.kv_budget_bytes != kv_budget(wp):
            resize.append(WorkerResize(w, kv_budget(wp), names))
        held[w] = reservations(wp, assignment, groups)
        if here is None or w in stopped or held[w] != here.reservations:
            reserve.append(w)
    return PlacementChange(tuple(stop), tuple(resize), tuple(start), moves, tuple(reserve), held, assignment)


def apply_to(current: Current, change: PlacementChange) -> Current:
    """`current` after the change, as a value (what the runtime's applier brings about)."""
    workers = {w: now for w, now in current.workers.items() if w not in {s.worker for s in change.stop}}
    for r in change.resize:
        workers[r.worker] = replace(workers[r.worker], kv_budget_bytes=r.kv_budget_bytes)
    for s in change.start:
        workers[s.worker] = WorkerNow(True, s.plan.kv_k, s.plan.kv_v, kv_budget(s.plan))
    for w in change.reserve:
        workers[w] = replace(workers[w], reservations=change.reservations[w])
    dst = {m.agent: m.dst for m in change.moves}
    agents = tuple(replace(a, worker=dst.get(a.name, a.worker)) for a in current.agents)
    return Current(workers, agents)
