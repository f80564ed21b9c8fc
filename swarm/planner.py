"""Capacity planner: which agents go on which worker, and each worker's KV format.

Pure functions over plain data (model geometry, device profiles, calibration
tables, agent groups, a policy); it never imports Ray or the engine, so it can
plan for machines it is not running on. `plan(...) -> Plan` is a value: print
it, diff it, serialise it, then apply it.

The model (see docs/PLANNER.md for the derivations):

* Memory of a worker = resident weights + engine scratch + KV blocks. KV is
  reserved in whole blocks of `block_tokens` positions, exactly as the engine's
  pool allocates them; the full blocks of a group's shared system prompt are
  held once per worker (the engine's prefix sharing).
* One decode step = weight-stream time for the batch (shared by every agent on
  the worker) + for each agent, context x layers x the measured attention cost
  per position per layer of the worker's (K, V) format.
* Objective: the sum over workers of agents / step time (aggregate decode
  tokens/s at every agent's reserved context), subject to memory and to each
  group's quality floor.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from swarm.errors import NoFeasiblePlan

KV_FORMATS = ("f32", "f16", "q8_0", "q8_head", "q4_0")
QUANTIZED = frozenset({"q8_0", "q8_head", "q4_0"})
# Quality rank when a model has no measured quality table (higher keeps more bits).
_WIDTH_RANK = {"f32": 4, "f16": 3, "q8_head": 2, "q8_0": 2, "q4_0": 0}
# The engine's attention splits contexts into chunks of this many positions (model.cpp kChunkPositions).
_ATTN_CHUNK = 512
# Rows of a matmul tile in the engine's per-thread scratch (model.cpp kRowTile).
_ROW_TILE = 8
# Bytes of one int8 activation block of 32 values plus two f32 scales (kernels.h BlockQ8A).
_ACT_BLOCK_BYTES = 40
# Exhaustive search when the number of distinct assignments is at most this.
_EXACT_STATES = 4000
# Local search (moves and swaps between every pair of workers, for every pair of groups) when
# workers^2 x groups^2 is at most this; beyond it one sweep would cost seconds in Python.
_LOCAL_SEARCH_WORK = 40_000

FormatPair = tuple[str, str]  # (K format, V format)


def pair_name(pair: FormatPair) -> str:
    return pair[0] if pair[0] == pair[1] else f"{pair[0]}/{pair[1]}"


def parse_pair(name: str) -> FormatPair:
    """'q8_0' -> (q8_0, q8_0); 'q8_0/f16' -> (q8_0, f16)."""
    parts = name.split("/")
    if len(parts) not in (1, 2) or any(p not in KV_FORMATS for p in parts):
        raise ValueError(
            f"'{name}' is not a KV format or K/V pair. To fix: use one of {', '.join(KV_FORMATS)} or 'K/V'"
        )
    return (parts[0], parts[-1])


def all_pairs(formats: Iterable[str] = KV_FORMATS) -> tuple[FormatPair, ...]:
    fs = tuple(formats)
    return tuple(itertools.product(fs, fs))


def kv_row_bytes(fmt: str, head_dim: int) -> int:
    """Bytes of one (position, kv head) row of head_dim values; mirrors native kv_row_bytes."""
    if fmt == "f32":
        return 4 * head_dim
    if fmt == "f16":
        return 2 * head_dim
    if fmt not in QUANTIZED:
        raise ValueError(f"unknown KV format '{fmt}'. To fix: use one of {', '.join(KV_FORMATS)}")
    if head_dim % 32:
        raise ValueError(f"KV format {fmt} needs head_dim divisible by 32, got {head_dim}")
    if fmt == "q8_0":
        return head_dim // 32 * (2 + 32)  # blocks of f16 scale + 32 int8
    if fmt == "q4_0":
        return head_dim // 32 * (2 + 16)  # blocks of f16 scale + 16 nibble bytes
    return head_dim + 4  # q8_head: int8 per value + one f32 scale per (position, head)


# -- inputs --------------------------------------------------------------------


@dataclass(frozen=True)
class ModelGeometry:
    """What the planner needs of a model (read from the GGUF header)."""

    name: str
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ff: int
    n_vocab: int
    n_ctx: int  # maximum context
    weight_stream_bytes: int  # weights one decode step reads (matmuls + output)
    resident_bytes: int  # every tensor of the file (what stays mapped)

    def kv_bytes_per_token(self, pair: FormatPair) -> int:
        k, v = pair
        return self.n_layer * self.n_kv_head * (kv_row_bytes(k, self.head_dim) + kv_row_bytes(v, self.head_dim))

    def supports(self, pair: FormatPair) -> bool:
        return all(f not in QUANTIZED or self.head_dim % 32 == 0 for f in pair)


@dataclass(frozen=True)
class EngineSettings:
    """Engine options that change memory (mirrors worker.engine.Engine's arguments)."""

    block_tokens: int = 16
    max_batch_tokens: int = 256
    threads: int = 2


def scratch_bytes(geom: ModelGeometry, settings: EngineSettings, n_seqs: int, max_context: int) -> int:
    """Upper bound of the engine's scratch (MemoryStats.scratch_bytes) for n_seqs sequences.

    A step holds at most max(n_seqs, max_batch_tokens) rows: every generating
    sequence decodes one token and prefill fills the rest of max_batch_tokens.
    Logits are kept for one row per sequence. Attention keeps partial softmax
    state for each (row, kv head, 512-position chunk).
    """
    if n_seqs <= 0:
        return 0
    rows = max(n_seqs, settings.max_batch_tokens)
    d, nff, hd = geom.n_embd, geom.n_ff, geom.head_dim
    q_dim, kv_dim = geom.n_head * hd, geom.n_kv_head * hd
    group = geom.n_head // geom.n_kv_head
    bt = settings.block_tokens
    chunk = max(bt, _ATTN_CHUNK // bt * bt)
    floats = rows * (d + max(d, nff) + 2 * q_dim + 2 * kv_dim + 2 * nff)  # x, xn, q, attn, k, v, gate, up
    floats += n_seqs * (d + geom.n_vocab)  # logits input rows and logits
    floats += settings.threads * max(_ROW_TILE * max(d, nff, q_dim), group * (_ATTN_CHUNK + hd))
    floats += rows * geom.n_kv_head * math.ceil(max_context / chunk) * group * (hd + 2)  # partials
    act_blocks = rows * (max(d, nff, q_dim) // 32)
    return 4 * floats + _ACT_BLOCK_BYTES * act_blocks


@dataclass(frozen=True)
class Quality:
    """A format's quality on a model, against f32 KV (next-token distributions)."""

    mean_kl: float  # mean KL(f32 || format), nats
    top1: float  # fraction of positions whose argmax agrees with f32


@dataclass(frozen=True)
class QualityFloor:
    """The least quality a format must show to be used when a better one fits (None: no bound)."""

    max_kl: float | None = None  # mean KL(f32 || format) at most this, nats
    min_top1: float | None = None  # top-1 agreement with f32 at least this

    def admits(self, q: Quality) -> bool:
        return (self.max_kl is None or q.mean_kl <= self.max_kl) and (self.min_top1 is None or q.top1 >= self.min_top1)

    def __str__(self) -> str:
        parts = ([f"KL <= {self.max_kl:g}"] if self.max_kl is not None else []) + (
            [f"top-1 >= {self.min_top1:g}"] if self.min_top1 is not None else []
        )
        return ", ".join(parts) or "none"


# The default floor (docs/PLANNER.md, "Quality"): a mean KL of 0.01 nats is about 4x what the
# engine's own 8-bit activations cost with an f32 cache (2.5e-3) and 13x what q8_0 KV costs (7.4e-4);
# top-1 0.90 lets at most one greedy choice in ten change, mostly at near-ties. On the default model
# it admits f16, q8_0, q8_head and q8_0/q4_0 and refuses q4_0/q4_0 (KL 0.12, top-1 0.78).
DEFAULT_QUALITY_FLOOR = QualityFloor(max_kl=0.01, min_top1=0.90)
# Without a measurement on the model (a model given only by its geometry, a catalog device with no
# local calibration), formats with any 4-bit half are assumed below the default floor: measured 4-bit
# keys cost 0.12 nats on the default model, and no model here has shown 4-bit KV under 0.01.
_UNMEASURED_BELOW_FLOOR = frozenset({"q4_0"})

Interval = tuple[float, float]  # (low, high)


@dataclass(frozen=True)
class Calibration:
    """Measured (or catalog-predicted) costs of one worker, each with its interval.

    weight_step_s[b - 1]: seconds of one decode step for a batch of b sequences at
    (almost) no context: the shared weight stream plus per-row work.
    attn_ns[pair]: nanoseconds per cached position per layer per sequence.
    Measured values are medians of repeats; the intervals are the repeats' interquartile range
    (worker/calibrate.py). A catalog prediction has no interval (a point).
    """

    source: str  # "measured" or "predicted from catalog..."
    weight_step_s: tuple[float, ...]
    attn_ns: dict[str, float]
    quality: dict[str, Quality] = field(default_factory=dict)
    machine: str = ""
    weight_step_interval: tuple[Interval, ...] = ()  # empty: points
    attn_ns_interval: dict[str, Interval] = field(default_factory=dict)
    reliable: bool = True
    problems: tuple[str, ...] = ()  # why it is not reliable
    read_bytes_per_s: float = 0.0  # the host's measured read bandwidth, 0 if unknown

    def weight_time(self, batch: int) -> float:
        return _extend(self.weight_step_s, batch)

    def weight_time_interval(self, batch: int) -> Interval:
        if not self.weight_step_interval:
            t = self.weight_time(batch)
            return (t, t)
        lows = tuple(lo for lo, _ in self.weight_step_interval)
        highs = tuple(hi for _, hi in self.weight_step_interval)
        return (_extend(lows, batch), _extend(highs, batch))

    def attn_seconds(self, pair: FormatPair) -> float | None:
        ns = self.attn_ns.get(pair_name(pair))
        return None if ns is None else ns * 1e-9

    def attn_interval_seconds(self, pair: FormatPair) -> Interval | None:
        name = pair_name(pair)
        if name not in self.attn_ns:
            return None
        lo, hi = self.attn_ns_interval.get(name, (self.attn_ns[name], self.attn_ns[name]))
        return (lo * 1e-9, hi * 1e-9)

    @staticmethod
    def from_bandwidth(
        geom: ModelGeometry, bytes_per_s: float, pairs: Iterable[FormatPair], source: str = "predicted from catalog"
    ) -> Calibration:
        """Bytes-only prediction for a device known from the catalog (never measured)."""
        attn = {}
        for p in pairs:
            if geom.supports(p):
                attn[pair_name(p)] = geom.kv_bytes_per_token(p) / geom.n_layer / bytes_per_s * 1e9
        return Calibration(source=source, weight_step_s=(geom.weight_stream_bytes / bytes_per_s,), attn_ns=attn)

    def to_dict(self) -> dict[str, Any]:
        """The form worker/calibrate.py writes (and `swarm calibrate --json` prints)."""
        attention = {}
        for name, ns in self.attn_ns.items():
            lo, hi = self.attn_ns_interval.get(name, (ns, ns))
            attention[name] = {"ns_per_position_layer": ns, "ns_per_position_layer_interval": [lo, hi]}
        return {
            "source": self.source,
            "machine": self.machine,
            "weight_step_s": list(self.weight_step_s),
            "weight_step_s_interval": [list(i) for i in self.weight_step_interval]
            or [[t, t] for t in self.weight_step_s],
            "attn_ns": dict(self.attn_ns),
            "attention": attention,
            "quality": {k: asdict(q) for k, q in self.quality.items()},
            "reliable": self.reliable,
            "problems": list(self.problems),
            "read_bytes_per_s": self.read_bytes_per_s,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Calibration:
        """Reads to_dict()'s form, or worker/calibrate.py's (which adds r2, samples, per-entry flags)."""
        attention = d.get("attention") or {}
        attn = {str(k): float(v) for k, v in d["attn_ns"].items()}
        for k, e in attention.items():
            attn.setdefault(str(k), float(e["ns_per_position_layer"]))
        intervals = {
            str(k): (float(e["ns_per_position_layer_interval"][0]), float(e["ns_per_position_layer_interval"][1]))
            for k, e in attention.items()
            if "ns_per_position_layer_interval" in e
        }
        return Calibration(
            source=str(d["source"]),
            machine=str(d.get("machine", "")),
            weight_step_s=tuple(float(x) for x in d["weight_step_s"]),
            attn_ns=attn,
            quality={str(k): Quality(**q) for k, q in d.get("quality", {}).items()},
            weight_step_interval=tuple((float(lo), float(hi)) for lo, hi in d.get("weight_step_s_interval", ())),
            attn_ns_interval=intervals,
            reliable=bool(d.get("reliable", True)),
            problems=tuple(str(x) for x in d.get("problems", ())),
            read_bytes_per_s=float(d.get("read_bytes_per_s", 0.0)),
        )


def _extend(t: tuple[float, ...], batch: int) -> float:
    """t[batch - 1], extrapolated linearly from the measured range beyond it."""
    if batch <= len(t):
        return t[batch - 1]
    slope = max(0.0, (t[-1] - t[0]) / (len(t) - 1)) if len(t) > 1 else 0.0
    return t[-1] + slope * (batch - len(t))


@dataclass(frozen=True)
class DeviceProfile:
    """One worker as the planner sees it."""

    name: str  # worker name, unique in a swarm
    device: str  # catalog id or "local"
    backend: str
    usable_bytes: int  # memory the engine may use: weights + scratch + KV
    calibration: Calibration

    @property
    def measured(self) -> bool:
        return self.calibration.source == "measured"


@dataclass(frozen=True)
class AgentGroup:
    name: str
    count: int
    context: int  # tokens each agent must be able to reach (reserved up front)
    shared_prefix_tokens: int = 0  # system-prompt tokens every agent of the group starts with
    max_kl: float | None = None  # quality floor: mean KL vs f32 KV at most this
    min_top1: float | None = None  # quality floor: top-1 agreement with f32 KV at least this


@dataclass(frozen=True)
class Policy:
    formats: tuple[FormatPair, ...] = all_pairs()
    objective: str = "throughput"  # aggregate decode tokens/s
    # Formats below it are used only when no format that meets it fits (None: only throughput counts).
    quality_floor: QualityFloor | None = DEFAULT_QUALITY_FLOOR

    @staticmethod
    def allow(
        k_formats: Iterable[str] = KV_FORMATS,
        v_formats: Iterable[str] | None = None,
        quality_floor: QualityFloor | None = DEFAULT_QUALITY_FLOOR,
    ) -> Policy:
        ks = tuple(k_formats)
        vs = ks if v_formats is None else tuple(v_formats)
        return Policy(formats=tuple(itertools.product(ks, vs)), quality_floor=quality_floor)


# -- the plan --------------------------------------------------------------------


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
        return "\n\n".join(_explain_worker(w) for w in self.workers if w.agents) + (
            f"\n\nTotal: {self.agents} agents, predicted {self.tokens_per_s:,.1f} decode tokens/s "
            f"{f'(interval {span}) ' if span else ''}at their reserved contexts (search: {self.search})."
        )


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
    rows.append("interval: predicted tokens/s from the low and high ends of the calibration's intervals")
    rows.append("crossover: context per agent at which private KV bytes read per step equal the weight bytes")
    return "\n".join(rows)


def _explain_worker(w: WorkerPlan) -> str:
    ctx = ", ".join(f"{g.agents} x {g.context:,} ({g.group})" for g in w.groups)
    free = w.usable_bytes - w.weight_bytes - w.scratch_bytes
    lines = [
        f"{w.worker} ({w.device}, {w.backend}, costs {w.source}): {w.agents} agents, contexts {ctx}.",
        f"  Memory: {_gb(w.usable_bytes)} usable - {_gb(w.weight_bytes)} weights - {_gb(w.scratch_bytes)} scratch "
        f"= {_gb(free)} for KV; {w.format} reserves {w.kv_blocks:,} blocks x {w.block_bytes:,} B = {_gb(w.kv_bytes)}.",
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


# -- the search --------------------------------------------------------------------


class _Model:
    """Precomputed per-(device class, format) arrays; evaluates one worker's agent counts."""

    def __init__(
        self,
        geom: ModelGeometry,
        devices: Sequence[DeviceProfile],
        groups: Sequence[AgentGroup],
        policy: Policy,
        settings: EngineSettings,
        quality: dict[str, Quality],
    ) -> None:
        self.geom, self.devices, self.groups, self.settings = geom, devices, groups, settings
        bt = settings.block_tokens
        self.pairs = [p for p in dict.fromkeys(policy.formats) if geom.supports(p)]
        if not self.pairs:
            raise NoFeasiblePlan(
                f"no allowed KV format works with head_dim {geom.head_dim} (quantized formats need a multiple of 32). "
                "To fix: allow f16 or f32"
            )
        self.block_bytes = np.array([geom.kv_bytes_per_token(p) * bt for p in self.pairs], dtype=np.float64)
        self.shared = np.array([min(g.shared_prefix_tokens, g.context - 1) // bt for g in groups], dtype=np.int64)
        self.private = np.array([-(-g.context // bt) for g in groups], dtype=np.int64) - self.shared
        self.context = np.array([g.context for g in groups], dtype=np.float64)
        # {device index: class index}; identical profiles share the evaluation cache
        keys: dict[Any, int] = {}
        self.dclass = [keys.setdefault((d.usable_bytes, id(d.calibration)), len(keys)) for d in devices]
        self.cache: dict[tuple[int, tuple[int, ...]], tuple[float, int]] = {}
        # per device: attention seconds per position per layer (NaN = not calibrated), quality mask per group
        self.attn = np.array(
            [[_nan(d.calibration.attn_seconds(p)) for p in self.pairs] for d in devices], dtype=np.float64
        )
        self.qual_ok = np.ones((len(devices), len(groups), len(self.pairs)), dtype=bool)
        self.qual_reason: dict[tuple[int, int, int], str] = {}
        for di, d in enumerate(devices):
            table = d.calibration.quality or quality
            for gi, g in enumerate(groups):
                if g.max_kl is None and g.min_top1 is None:
                    continue
                for pi, p in enumerate(self.pairs):
                    q = table.get(pair_name(p))
                    if q is None:
                        if p == ("f32", "f32"):
                            continue  # the reference itself
                        self.qual_ok[di, gi, pi] = False
                        self.qual_reason[di, gi, pi] = f"no quality measured for group {g.name}'s floor"
                    elif (g.max_kl is not None and q.mean_kl > g.max_kl) or (
                        g.min_top1 is not None and q.top1 < g.min_top1
                    ):
                        self.qual_ok[di, gi, pi] = False
                        self.qual_reason[di, gi, pi] = (
                            f"below group {g.name}'s quality floor (KL {q.mean_kl:.2e}, top-1 {q.top1:.3f})"
                        )
        self.rank = np.array(
            [
                -(quality[pair_name(p)].mean_kl) if pair_name(p) in quality else _WIDTH_RANK[p[0]] + _WIDTH_RANK[p[1]]
                for p in self.pairs
            ]
        )
        # the ends of each attention cost's interval (seconds per position per layer)
        spans = [[d.calibration.attn_interval_seconds(p) for p in self.pairs] for d in devices]
        self.attn_lo = np.array([[math.nan if i is None else i[0] for i in row] for row in spans], dtype=np.float64)
        self.attn_hi = np.array([[math.nan if i is None else i[1] for i in row] for row in spans], dtype=np.float64)
        # floor_ok[device, pair]: the pair meets the policy's default quality floor on that device
        self.floor = policy.quality_floor
        self.floor_ok = np.ones((len(devices), len(self.pairs)), dtype=bool)
        if self.floor is not None:
            for di, d in enumerate(devices):
                table = d.calibration.quality or quality
                for pi, p in enumerate(self.pairs):
                    q = table.get(pair_name(p))
                    if q is not None:
                        self.floor_ok[di, pi] = self.floor.admits(q)
                    elif p != ("f32", "f32"):
                        self.floor_ok[di, pi] = not (set(p) & _UNMEASURED_BELOW_FLOOR)

    def free_bytes(self, di: int, n_seqs: int, max_context: int) -> float:
        d = self.devices[di]
        return d.usable_bytes - self.geom.resident_bytes - scratch_bytes(self.geom, self.settings, n_seqs, max_context)

    def options(self, di: int, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For every allowed pair: (kv bytes, fits memory, meets quality, tokens/s or 0)."""
        present = counts > 0
        n = int(counts.sum())
        blocks = int(counts @ self.private + self.shared[present].sum())
        kv = blocks * self.block_bytes
        max_ctx = int(self.context[present].max()) if n else 0
        fits = kv <= self.free_bytes(di, n, max_ctx)
        qual = self.qual_ok[di][present].all(axis=0) if n else np.ones(len(self.pairs), dtype=bool)
        cal = self.devices[di].calibration
        t = cal.weight_time(n) + self.attn[di] * self.geom.n_layer * float(counts @ self.context) if n else None
        tps = np.where(fits & qual & ~np.isnan(self.attn[di]), n / t, 0.0) if n else np.zeros(len(self.pairs))
        return kv, fits, qual, np.nan_to_num(tps)

    def choose(self, di: int, counts: np.ndarray) -> _Choice | None:
        """The format for these agents on worker di, or None when nothing fits.

        Among the formats that fit memory and every group's floor: only those meeting the default
        quality floor, unless none of them fits (then the choice is forced). Among those, the
        fastest by predicted median tokens/s, unless a higher-quality format is slower by less than
        the two formats' combined uncertainty (the half-widths of their tokens/s intervals from the
        attention costs' intervals; the weight-stream time is shared by both and cancels): a tie,
        which goes to the higher quality.
        """
        kv, fits, qual, tps = self.options(di, counts)
        ok = fits & qual & (tps > 0)
        if not ok.any():
            return None
        tier = ok & self.floor_ok[di]
        forced = not tier.any()
        if forced:
            tier = ok
        n = int(counts.sum())
        cal = self.devices[di].calibration
        w_med = cal.weight_time(n)
        positions = self.geom.n_layer * float(counts @ self.context)
        with np.errstate(invalid="ignore", divide="ignore"):
            fast = n / (w_med + self.attn_lo[di] * positions)
            slow = n / (w_med + self.attn_hi[di] * positions)
        half = np.nan_to_num((fast - slow) / 2)
        cands = np.flatnonzero(tier)
        best = int(cands[np.argmax(tps[cands])])
        tied = cands[tps[best] - tps[cands] <= half[best] + half[cands]]
        pi = int(max(tied, key=lambda i: (self.rank[i], tps[i])))
        return _Choice(float(tps[pi]), pi, best, forced, kv, fits, qual, tps)

    def value(self, di: int, counts: np.ndarray) -> tuple[float, int]:
        """(tokens/s, chosen pair index); (-inf, -1) when nothing fits."""
        key = (self.dclass[di], tuple(counts.tolist()))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if not counts.any():
            out = (0.0, -1)
        else:
            c = self.choose(di, counts)
            out = (-math.inf, -1) if c is None else (c.tokens_per_s, c.pair)
        self.cache[key] = out
        return out

    def interval(self, di: int, counts: np.ndarray, pi: int) -> Interval:
        """(low, high) tokens/s of pair pi: the slow and fast ends of the weight and attention intervals."""
        n = int(counts.sum())
        if not n or np.isnan(self.attn_lo[di, pi]):
            return (0.0, 0.0)
        w_lo, w_hi = self.devices[di].calibration.weight_time_interval(n)
        positions = self.geom.n_layer * float(counts @ self.context)
        return (n / (w_hi + self.attn_hi[di, pi] * positions), n / (w_lo + self.attn_lo[di, pi] * positions))


@dataclass(frozen=True)
class _Choice:
    tokens_per_s: float
    pair: int  # chosen
    fastest: int  # the fastest by median among the formats considered
    forced: bool  # no format meeting the default quality floor fits
    kv: np.ndarray
    fits: np.ndarray
    qual: np.ndarray
    tps: np.ndarray


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _total(m: _Model, counts: np.ndarray) -> float:
    return sum(m.value(w, counts[w])[0] for w in range(len(m.devices)))


def _greedy(m: _Model, counts: np.ndarray, order: Sequence[int]) -> bool:
    """Places every agent, group by group in `order`, where it adds the most tokens/s. False if one does not fit."""
    n_dev = len(m.devices)
    for g in order:
        left = m.groups[g].count - int(counts[:, g].sum())
        heap: list[tuple[float, int]] = []
        for w in range(n_dev):
            gain = _gain(m, counts, w, g)
            if gain is not None:
                heap.append((-gain, w))
        heapq.heapify(heap)
        while left > 0:
            if not heap:
                return False
            _, w = heapq.heappop(heap)
            counts[w, g] += 1
            left -= 1
            gain = _gain(m, counts, w, g)
            if gain is not None:
                heapq.heappush(heap, (-gain, w))
    return True


def _gain(m: _Model, counts: np.ndarray, w: int, g: int) -> float | None:
    before = m.value(w, counts[w])[0]
    counts[w, g] += 1
    after = m.value(w, counts[w])[0]
    counts[w, g] -= 1
    return None if after == -math.inf else after - before


def _first_fit(m: _Model, counts: np.ndarray) -> bool:
    """Feasibility fallback: largest agents first onto the worker with the most free room."""
    order = sorted(range(len(m.groups)), key=lambda g: (-m.groups[g].context, g))
    for g in order:
        for _ in range(m.groups[g].count - int(counts[:, g].sum())):
            best, best_w = -math.inf, -1
            for w in range(len(m.devices)):
                counts[w, g] += 1
                if m.value(w, counts[w])[0] > -math.inf:
                    c = counts[w]
                    kv, fits, _, _ = m.options(w, c)
                    room = m.free_bytes(w, int(c.sum()), int(m.context[c > 0].max())) - kv[fits].min()
                    if room > best:
                        best, best_w = room, w
                counts[w, g] -= 1
            if best_w < 0:
                return False
            counts[best_w, g] += 1
    return True


def _local_search(m: _Model, counts: np.ndarray, max_sweeps: int = 50) -> None:
    """Moves one or two agents of a group between two workers, alone or against one or two agents of
    another group coming back, while the total improves."""
    n_dev, n_grp = counts.shape
    vals = [m.value(w, counts[w])[0] for w in range(n_dev)]
    for _ in range(max_sweeps):
        improved = False
        for a, b in itertools.permutations(range(n_dev), 2):
            for g in range(n_grp):
                for k in (1, 2):
                    if counts[a, g] < k:
                        break
                    counts[a, g] -= k
                    counts[b, g] += k
                    if _keep_if_better(m, counts, vals, a, b, vals[a] + vals[b]):
                        improved = True
                        break
                    if _swap_back(m, counts, vals, a, b, g):
                        improved = True
                        break
                    counts[a, g] += k
                    counts[b, g] -= k
        if not improved:
            return


def _heuristic(m: _Model, shape: tuple[int, int], local: bool) -> tuple[np.ndarray | None, str]:
    """Greedy placement from a few group orders (largest contexts first, smallest first, largest groups
    first), each improved by local search when `local`; the best result wins."""
    ctx = [g.context for g in m.groups]
    orders = [sorted(range(shape[1]), key=lambda g: (-ctx[g], g))]
    if local:
        orders.append(sorted(range(shape[1]), key=lambda g: (ctx[g], g)))
        orders.append(sorted(range(shape[1]), key=lambda g: (-m.groups[g].count * ctx[g], g)))
    best, best_v = None, -math.inf
    for order in dict.fromkeys(tuple(o) for o in orders):
        counts = np.zeros(shape, dtype=np.int64)
        if not _greedy(m, counts, order):
            counts = np.zeros(shape, dtype=np.int64)
            if not _first_fit(m, counts):
                continue
        if local:
            _local_search(m, counts)
        v = _total(m, counts)
        if v > best_v:
            best, best_v = counts, v
    return best, "greedy+local" if local else "greedy"


def _keep_if_better(m: _Model, counts: np.ndarray, vals: list[float], a: int, b: int, before: float) -> bool:
    """True (and vals updated) when workers a and b together now beat `before` by more than rounding."""
    va, vb = m.value(a, counts[a])[0], m.value(b, counts[b])[0]
    if va + vb > before + 1e-9 * abs(before):
        vals[a], vals[b] = va, vb
        return True
    return False


def _swap_back(m: _Model, counts: np.ndarray, vals: list[float], a: int, b: int, g: int) -> bool:
    """After one agent of g moved a -> b: moves one or two agents of another group b -> a if that
    makes the pair of workers better than before the move (keeps the change and returns True)."""
    before = vals[a] + vals[b]
    for h in range(counts.shape[1]):
        if h == g:
            continue
        for k in (1, 2):
            if counts[b, h] < k:
                break
            counts[b, h] -= k
            counts[a, h] += k
            if _keep_if_better(m, counts, vals, a, b, before):
                return True
            counts[b, h] += k
            counts[a, h] -= k
    return False


def _compositions(n: int, k: int) -> Iterable[tuple[int, ...]]:
    """Every way to split n identical agents over k workers."""
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        prev, out = -1, []
        for b in bars:
            out.append(b - prev - 1)
            prev = b
        out.append(n + k - 1 - prev - 1)
        yield tuple(out)


def _n_states(groups: Sequence[AgentGroup], n_dev: int) -> int:
    total = 1
    for g in groups:
        total *= math.comb(g.count + n_dev - 1, n_dev - 1)
        if total > _EXACT_STATES:
            break
    return total


def _exhaustive(m: _Model, shape: tuple[int, int]) -> np.ndarray | None:
    n_dev, n_grp = shape
    best, best_counts = -math.inf, None
    splits = [list(_compositions(g.count, n_dev)) for g in m.groups]
    for choice in itertools.product(*splits):
        counts = np.array(choice, dtype=np.int64).T.reshape(n_dev, n_grp)
        v = _total(m, counts)
        if v > best:
            best, best_counts = v, counts.copy()
    return best_counts


def plan(
    geom: ModelGeometry,
    devices: Sequence[DeviceProfile],
    groups: Sequence[AgentGroup],
    policy: Policy | None = None,
    *,
    settings: EngineSettings | None = None,
    quality: dict[str, Quality] | None = None,
    search: str = "auto",
) -> Plan:
    """Assigns every agent to a worker and a (K, V) format to every worker.

    search: "auto" (exhaustive when small, else greedy + local search),
    "exact", "greedy" (greedy placement only) or "greedy+local".
    Raises NoFeasiblePlan, saying what would fit, when the agents cannot all be placed.
    """
    policy = policy or Policy()
    settings = settings or EngineSettings()
    _validate(geom, devices, groups, policy, settings, search)
    m = _Model(geom, devices, groups, policy, settings, quality or {})
    shape = (len(devices), len(groups))
    counts: np.ndarray | None
    if search == "exact" or (search == "auto" and _n_states(groups, len(devices)) <= _EXACT_STATES):
        counts, used = _exhaustive(m, shape), "exact"
        if counts is not None and _total(m, counts) == -math.inf:
            counts = None
    else:
        counts, used = _heuristic(
            m, shape, local=search != "greedy" and (len(devices) * len(groups)) ** 2 <= _LOCAL_SEARCH_WORK
        )
    if counts is None:
        raise NoFeasiblePlan(_why_nothing_fits(m))
    return _build(m, counts, used)


def _validate(
    geom: ModelGeometry,
    devices: Sequence[DeviceProfile],
    groups: Sequence[AgentGroup],
    policy: Policy,
    settings: EngineSettings,
    search: str,
) -> None:
    if search not in ("auto", "exact", "greedy", "greedy+local"):
        raise ValueError(f"search '{search}' is unknown. To fix: use auto, exact, greedy or greedy+local")
    if policy.objective != "throughput":
        raise ValueError(f"policy.objective '{policy.objective}' is unknown. To fix: use 'throughput'")
    if not devices:
        raise NoFeasiblePlan("no workers to plan for. To fix: add at least one worker")
    if len({d.name for d in devices}) != len(devices):
        raise ValueError("worker names repeat. To fix: give every worker a unique name")
    if not groups or sum(g.count for g in groups) == 0:
        raise ValueError("no agents to place. To fix: give an agent group a count of at least 1")
    for f in policy.formats:
        if f[0] not in KV_FORMATS or f[1] not in KV_FORMATS:
            raise ValueError(f"policy format {f} is unknown. To fix: use formats from {', '.join(KV_FORMATS)}")
    if settings.block_tokens < 1 or settings.max_batch_tokens < 1 or settings.threads < 1:
        raise ValueError("engine settings must be positive")
    for g in groups:
        if g.count < 0:
            raise ValueError(f"group {g.name}: count {g.count} is negative")
        if not 1 <= g.context <= geom.n_ctx:
            raise ValueError(
                f"group {g.name}: context {g.context:,} is outside 1..{geom.n_ctx:,}, the model's maximum. "
                "To fix: lower the context or use a model with a longer context"
            )
        if not 0 <= g.shared_prefix_tokens <= g.context:
            raise ValueError(f"group {g.name}: shared_prefix_tokens must be between 0 and its context")


def _build(m: _Model, counts: np.ndarray, search: str) -> Plan:
    workers = []
    geom, bt = m.geom, m.settings.block_tokens
    for w, d in enumerate(m.devices):
        c = counts[w]
        n = int(c.sum())
        tps, pi = m.value(w, c)
        present = c > 0
        max_ctx = int(m.context[present].max()) if n else 0
        scratch = scratch_bytes(geom, m.settings, n, max_ctx)
        kv, fits, qual, all_tps = m.options(w, c)
        if pi < 0:  # no agents: report the widest allowed format
            pi = int(np.argmax(m.rank))
        pair = m.pairs[pi]
        choice = m.choose(w, c) if n else None
        free = m.free_bytes(w, n, max_ctx)
        options = []
        for oi, p in enumerate(m.pairs):
            below = "" if m.floor_ok[w, oi] else f", below the default quality floor ({m.floor})"
            if oi == pi and n:
                verdict = "chosen"
            elif not fits[oi]:
                verdict = f"over memory by {_gb(kv[oi] - free)}"
            elif not qual[oi]:
                bad = [gi for gi in range(len(m.groups)) if present[gi] and not m.qual_ok[w, gi, oi]]
                verdict = m.qual_reason.get((w, bad[0], oi), "below a quality floor")
            elif np.isnan(m.attn[w, oi]):
                verdict = "not calibrated on this worker"
            else:
                verdict = (f"fits, {all_tps[oi] / tps:.3f}x the chosen tokens/s" if n and tps > 0 else "fits") + below
            options.append(
                FormatOption(
                    format=pair_name(p),
                    kv_bytes=int(kv[oi]),
                    memory_bytes=int(kv[oi]) + geom.resident_bytes + scratch,
                    tokens_per_s=float(all_tps[oi]) if all_tps[oi] > 0 else None,
                    verdict=verdict,
                    tokens_per_s_interval=m.interval(w, c, oi) if all_tps[oi] > 0 else None,
                    meets_floor=bool(m.floor_ok[w, oi]),
                )
            )
        decision = _decision(m, w, choice, free) if choice is not None else ""
        gw = tuple(
            GroupOnWorker(
                group=g.name,
                agents=int(c[gi]),
                context=g.context,
                blocks_per_agent=int(m.private[gi]),
                shared_blocks=int(m.shared[gi]),
            )
            for gi, g in enumerate(m.groups)
            if c[gi]
        )
        bpt = geom.kv_bytes_per_token(pair)
        crossover = geom.weight_stream_bytes / bpt
        reserved = int(c @ m.context.astype(np.int64))
        step = n / tps if n and tps > 0 else 0.0
        workers.append(
            WorkerPlan(
                worker=d.name,
                device=d.device,
                backend=d.backend,
                source=d.calibration.source,
                kv_k=pair[0],
                kv_v=pair[1],
                groups=gw,
                agents=n,
                block_bytes=bpt * bt,
                kv_blocks=int(kv[pi] // (bpt * bt)),
                kv_bytes=int(kv[pi]),
                weight_bytes=geom.resident_bytes,
                scratch_bytes=scratch,
                usable_bytes=d.usable_bytes,
                crossover_context=crossover,
                crossover_per_agent=crossover / n if n else crossover,
                reserved_context=reserved,
                step_seconds=step,
                tokens_per_s=tps if n else 0.0,
                agent_tokens_per_s=tps / n if n else 0.0,
                options=tuple(options),
                tokens_per_s_interval=m.interval(w, c, pi) if n else (0.0, 0.0),
                decision=decision,
            )
        )
    total = sum(w.tokens_per_s for w in workers)
    return Plan(
        model=geom.name,
        settings=m.settings,
        workers=tuple(workers),
        tokens_per_s=total,
        agents=int(counts.sum()),
        search=search,
        tokens_per_s_interval=(
            sum(w.tokens_per_s_interval[0] for w in workers),
            sum(w.tokens_per_s_interval[1] for w in workers),
        ),
    )


def _decision(m: _Model, w: int, c: _Choice, free: float) -> str:
    """Why worker w got its format, in words and numbers."""
    name = pair_name(m.pairs[c.pair])
    if c.forced:
        better = [
            f"{pair_name(p)}{' needs' if not n else ''} {_gb(c.kv[i])}"
            for n, (i, p) in enumerate(
                [
                    (i, p)
                    for i, p in sorted(enumerate(m.pairs), key=lambda ip: -c.kv[ip[0]])
                    if m.floor_ok[w, i] and c.qual[i] and not np.isnan(m.attn[w, i])
                ][-3:]  # the three narrowest that meet the floor
            )
        ]
        return (
            f"forced by memory: it is below the default quality floor ({m.floor}), but no format meeting it "
            f"fits: {' and '.join(better) or 'none is allowed'}; the worker has {_gb(free)} for KV."
        )
    lines = []
    if c.fastest != c.pair:
        f = pair_name(m.pairs[c.fastest])
        gain = c.tps[c.fastest] / c.tps[c.pair] - 1
        lines.append(
            f"{f} predicts {gain:.1%} more tokens/s, within the calibration's noise, so it is a tie and the "
            f"tie goes to the higher quality ({name})."
        )
    else:
        narrower = [
            i for i in np.flatnonzero(c.fits & c.qual & m.floor_ok[w]) if m.rank[i] > m.rank[c.pair] and c.tps[i] > 0
        ]
        if narrower:
            i = int(max(narrower, key=lambda i: m.rank[i]))
            gain = c.tps[c.pair] / c.tps[i] - 1
            lines.append(
                f"faster than the higher-quality {pair_name(m.pairs[i])} by {gain:.1%}, more than the "
                "calibration's noise."
            )
        else:
            lines.append("the fastest of the formats that fit, and no format of higher quality fits.")
    below = [
        pair_name(p)
        for i, p in enumerate(m.pairs)
        if not m.floor_ok[w, i] and c.fits[i] and c.qual[i] and c.tps[i] > c.tps[c.pair]
    ]
    if below and m.floor is not None:
        lines.append(
            f"Faster but below the default quality floor ({m.floor}), so not used while a format meeting it "
            f"fits: {', '.join(below)}."
        )
    return " ".join(lines)


def _why_nothing_fits(m: _Model) -> str:
    """Says what would fit: fewer agents, shorter contexts, a narrower format, another device."""
    geom, bt = m.geom, m.settings.block_tokens
    n_agents = sum(g.count for g in m.groups)
    max_ctx = max(g.context for g in m.groups)
    # the narrowest format every group's quality floor accepts on some worker (else the narrowest allowed)
    accepted = m.qual_ok.all(axis=1).any(axis=0)
    narrow = (
        int(np.argmin(np.where(accepted, m.block_bytes, np.inf))) if accepted.any() else int(np.argmin(m.block_bytes))
    )
    narrow_name = pair_name(m.pairs[narrow])
    bpt = geom.kv_bytes_per_token(m.pairs[narrow])
    need = sum(g.count * (-(-g.context // bt)) * bt for g in m.groups) * bpt
    free = [max(0.0, m.free_bytes(w, 1, max_ctx)) for w in range(len(m.devices))]
    total_free = sum(free)
    lines = [
        f"the {n_agents} agents do not fit: with the narrowest allowed format ({narrow_name}, {bpt:,} bytes per "
        f"token) their reserved contexts need {_gb(need)} of KV; the workers have {_gb(total_free)} free after "
        f"weights ({_gb(geom.resident_bytes)} each) and scratch"
    ]
    per_agent = need / n_agents
    fit_agents = int(sum(f // per_agent for f in free)) if per_agent else 0
    if fit_agents < n_agents:
        lines.append(f"- fewer agents: about {fit_agents} of {n_agents} fit at the requested contexts")
    if total_free > 0 and total_free < need:
        share = total_free / n_agents / bpt
        lines.append(f"- shorter contexts: about {int(share // bt * bt):,} tokens per agent fit for all {n_agents}")
    biggest = max(free)
    if max_ctx * bpt > biggest:
        lines.append(
            f"- one agent's {max_ctx:,}-token context needs {_gb(max_ctx * bpt)}, more than the largest worker's "
            f"{_gb(biggest)} free"
        )
    narrowest_any = min(all_pairs(), key=geom.kv_bytes_per_token)
    if narrowest_any not in m.pairs and geom.supports(narrowest_any):
        nb = geom.kv_bytes_per_token(narrowest_any)
        verdict = "would fit in total" if need / bpt * nb <= total_free else "would still not fit"
        lines.append(f"- a narrower format: allowing {pair_name(narrowest_any)} ({nb:,} bytes per token) {verdict}")
    if any(not m.qual_ok[:, gi, :].all() for gi in range(len(m.groups))):
        lines.append("- a looser quality floor: some groups' floors exclude formats that would fit")
    if need > total_free:
        lines.append(f"- add a device: {_gb(need - total_free)} more free memory is needed")
    return "\n".join(lines)
