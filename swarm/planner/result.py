"""The plan as a value: per-worker choices, their options, and the table and explanation of it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from swarm.planner.calibration import Interval
from swarm.planner.parked import ParkedOnWorker
from worker.formats import pair_name
from worker.settings import EngineSettings


@dataclass(frozen=True)
class FormatOption:
    """How one (K, V) format would do on a worker with its planned agents."""

    format: str
    kv_bytes: int
    memory_bytes: int
    tokens_per_s: float | None  # None when it does not fit or fails a quality floor
    verdict: str  # "chosen", "fits", "over memory by N bytes", "below the quality floor of group g"
    tokens_per_s_interval: Interval | None = None  # from the calibration's intervals
    meets_floor: bool = True  # meets the policy's default quality floor


@dataclass(frozen=True)
class GroupOnWorker:
    group: str
    agents: int
    context: int  # reserved per agent
    blocks_per_agent: int  # private KV blocks each agent holds
    shared_blocks: int  # blocks of the shared system prompt, held once on this worker
    sliding_blocks_per_agent: int = 0  # blocks of the sliding-window layers' class each agent holds at most


@dataclass(frozen=True)
class WorkerPlan:
    worker: str
    device: str
    backend: str
    source: str  # "measured" or "predicted from catalog"
    kv_k: str
    kv_v: str
    groups: tuple[GroupOnWorker, ...]
    agents: int
    block_bytes: int
    kv_blocks: int
    kv_bytes: int  # the engine's KV budget: exactly the reserved blocks
    weight_bytes: int
    scratch_bytes: int
    usable_bytes: int
    crossover_context: float  # total context where KV bytes read per step = weight bytes
    crossover_per_agent: float
    reserved_context: int  # sum of the agents' contexts
    step_seconds: float
    tokens_per_s: float  # aggregate on this worker
    agent_tokens_per_s: float
    options: tuple[FormatOption, ...]
    tokens_per_s_interval: Interval = (0.0, 0.0)  # low, high: the calibration's intervals carried through
    decision: str = ""  # why this format: forced by memory, a tie resolved by quality, or faster beyond noise
    sliding_block_bytes: int = 0  # a block of the sliding-window layers (0: the model has none)
    sliding_blocks: int = 0  # sliding-class blocks reserved on this worker (kv_blocks counts the global class)

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.scratch_bytes + self.kv_bytes

    @property
    def format(self) -> str:
        return pair_name((self.kv_k, self.kv_v))


@dataclass(frozen=True)
class Plan:
    model: str
    settings: EngineSettings
    workers: tuple[WorkerPlan, ...]
    tokens_per_s: float
    agents: int
    search: str  # "exact", "greedy", "greedy+local"
    tokens_per_s_interval: Interval = (0.0, 0.0)  # sum of the workers' lows and highs
    # agents parked in host RAM or on disk (not in `agents`: they take no KV reservation), per worker
    parked: tuple[ParkedOnWorker, ...] = ()

    def worker(self, name: str) -> WorkerPlan:
        for w in self.workers:
            if w.worker == name:
                return w
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for w, wd in zip(self.workers, d["workers"], strict=True):
            wd["memory_bytes"] = w.memory_bytes
            wd["format"] = w.format
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        return render_table(self)

    def explain(self) -> str:
        span = _tps_range(self.tokens_per_s_interval)
        return (
            "\n\n".join(_explain_worker(w) for w in self.workers if w.agents)
            + (
                f"\n\nTotal: {self.agents} agents, predicted {self.tokens_per_s:,.1f} decode tokens/s "
                f"{f'(interval {span}) ' if span else ''}at their reserved contexts (search: {self.search})."
            )
            + (f"\n\n{explain_parked(self.parked)}" if self.parked else "")
        )


def explain_parked(parked: tuple[ParkedOnWorker, ...]) -> str:
    """The parked agents in words: how many, where, and why they take no device KV."""
    n = sum(len(p.agents) for p in parked)
    ram, disk = sum(p.ram_bytes for p in parked), sum(p.disk_bytes for p in parked)
    lines = [
        f"Parked: {n} agents hold {_gb(ram)} of KV in host RAM and {_gb(disk)} on disk. That is host memory, not "
        "device memory: they take no KV reservation and are not among the agents above; a parked agent's next "
        "turn restores its KV (or re-prefills it, whichever its worker measured faster) into blocks the worker "
        "frees by parking the idle session of least value."
    ]
    for p in parked:
        lines.append(f"  {p.worker}: {len(p.agents)} parked ({_gb(p.ram_bytes)} RAM, {_gb(p.disk_bytes)} disk): "
                     + ", ".join(p.agents))  # fmt: skip
    return "\n".join(lines)


def _gb(n: float) -> str:
    """Bytes for people: GB with two decimals, MB with one below a gigabyte."""
    return f"{n / 1e9:,.2f} GB" if abs(n) >= 1e9 else f"{n / 1e6:,.1f} MB"


def _tps_range(t: Interval) -> str:
    return f"{t[0]:,.1f}-{t[1]:,.1f}" if t[1] > t[0] else ""


def render_table(p: Plan) -> str:
    head = (
        f"{'worker':<14} {'device':<14} {'K/V':<13} {'agents':>6} {'KV / budget':>21} {'crossover':>10} "
        f"{'tok/s':>9} {'interval':>15}"
    )
    rows = [f"Plan for {p.model}: {p.agents} agents on {len(p.workers)} workers", head, "-" * len(head)]
    for w in p.workers:
        free = w.usable_bytes - w.weight_bytes - w.scratch_bytes
        tps = f"{w.tokens_per_s:,.1f}" + ("" if w.source == "measured" else "*")
        rows.append(
            f"{w.worker:<14} {w.device:<14} {w.format if w.agents else '-':<13} {w.agents:>6} "
            f"{_gb(w.kv_bytes):>9} / {_gb(free):>9} {w.crossover_per_agent:>10,.0f} {tps:>9} "
            f"{_tps_range(w.tokens_per_s_interval):>15}"
        )
        for g in w.groups:
            rows.append(f"{'':<14}   {g.group}: {g.agents} x {g.context:,} tokens")
    rows.append(
        f"{'total':<14} {'':<14} {'':<13} {p.agents:>6} {'':>21} {'':>10} {p.tokens_per_s:>9,.1f} "
        f"{_tps_range(p.tokens_per_s_interval):>15}"
    )
    if any(w.source != "measured" for w in p.workers):
        rows.append("* predicted from catalog (bandwidth only), not measured on the device")
    if p.parked:
        n = sum(len(x.agents) for x in p.parked)
        ram, disk = sum(x.ram_bytes for x in p.parked), sum(x.disk_bytes for x in p.parked)
        rows.append(f"parked: {n} agents, {_gb(ram)} in host RAM + {_gb(disk)} on disk (no KV reservation)")
    rows.append("interval: predicted tokens/s from the low and high ends of the calibration's intervals")
    rows.append("crossover: context per agent at which private KV bytes read per step equal the weight bytes")
    return "\n".join(rows)


def _explain_worker(w: WorkerPlan) -> str:
    ctx = ", ".join(f"{g.agents} x {g.context:,} ({g.group})" for g in w.groups)
    free = w.usable_bytes - w.weight_bytes - w.scratch_bytes
    lines = [
        f"{w.worker} ({w.device}, {w.backend}, costs {w.source}): {w.agents} agents, contexts {ctx}.",
        f"  Memory: {_gb(w.usable_bytes)} usable - {_gb(w.weight_bytes)} weights - {_gb(w.scratch_bytes)} scratch "
        f"= {_gb(free)} for KV; {w.format} reserves {w.kv_blocks:,} blocks x {w.block_bytes:,} B"
        + (f" + {w.sliding_blocks:,} sliding-window blocks x {w.sliding_block_bytes:,} B" if w.sliding_blocks else "")
        + f" = {_gb(w.kv_bytes)}.",
    ]
    ratio = w.reserved_context / w.crossover_context if w.crossover_context else 0.0
    regime = "KV reads dominate the step, so bytes per position matter" if ratio > 1 else "the weight stream dominates"
    lines.append(
        f"  Crossover: {w.crossover_context:,.0f} total positions ({w.crossover_per_agent:,.0f} per agent); "
        f"reserved {w.reserved_context:,} = {ratio:.2f}x, {regime}."
    )
    if w.decision:
        lines.append(f"  Why {w.format}: {w.decision}")
    for o in sorted(w.options, key=lambda o: (o.verdict != "chosen", -(o.tokens_per_s or 0.0), o.kv_bytes)):
        if o.verdict == "not calibrated on this worker":
            continue
        tps = f"{o.tokens_per_s:,.1f} tok/s" if o.tokens_per_s is not None else "-"
        span = _tps_range(o.tokens_per_s_interval) if o.tokens_per_s_interval else ""
        lines.append(f"    {o.format:<15} KV {_gb(o.kv_bytes):>10}  {tps:>14} {span:>15}  {o.verdict}")
    return "\n".join(lines)
