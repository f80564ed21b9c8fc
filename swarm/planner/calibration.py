"""What a worker's formats cost and how good they are: quality, floors, calibration, the device."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from swarm.planner.geometry import ModelGeometry
from worker.formats import FormatPair, pair_name


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
    # seconds each sequence beyond weight_step_s adds; None: the measured range's mean slope
    weight_step_tail_slope: float | None = None

    def weight_time(self, batch: int) -> float:
        return _extend(self.weight_step_s, batch, self.weight_step_tail_slope)

    def weight_time_interval(self, batch: int) -> Interval:
        if not self.weight_step_interval:
            t = self.weight_time(batch)
            return (t, t)
        lows = tuple(lo for lo, _ in self.weight_step_interval)
        highs = tuple(hi for _, hi in self.weight_step_interval)
        slope = self.weight_step_tail_slope
        return (_extend(lows, batch, slope), _extend(highs, batch, slope))

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
        """Bytes-only prediction for a device known from the catalog (never measured).

        A dense model's step reads the same weights at every batch size; a mixture of experts' step
        reads more distinct experts as the batch grows (geom.stream_bytes), listed per batch size up
        to where every expert is expected to be read (within half an expert's bytes), then flat.
        """
        attn = {}
        for p in pairs:
            if geom.supports(p):
                attn[pair_name(p)] = geom.kv_bytes_per_token(p) / geom.n_layer / bytes_per_s * 1e9
        steps = [geom.stream_bytes(1)]
        if geom.expert_count:
            full = geom.stream_bytes(1 << 30)  # every expert read
            while full - steps[-1] > geom.expert_bytes / 2 and len(steps) < _MAX_PREDICTED_BATCH:
                steps.append(geom.stream_bytes(len(steps) + 1))
        return Calibration(
            source=source,
            weight_step_s=tuple(b / bytes_per_s for b in steps),
            attn_ns=attn,
            weight_step_tail_slope=0.0,
        )

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
            "weight_step_tail_slope": self.weight_step_tail_slope,
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
            weight_step_tail_slope=None
            if d.get("weight_step_tail_slope") is None
            else float(d["weight_step_tail_slope"]),
        )


# Batch sizes a bandwidth prediction lists at most (a mixture of experts' curve flattens long before).
_MAX_PREDICTED_BATCH = 4096


def _extend(t: tuple[float, ...], batch: int, tail_slope: float | None = None) -> float:
    """t[batch - 1], extrapolated linearly beyond it (tail_slope, else the range's mean slope)."""
    if batch <= len(t):
        return t[batch - 1]
    if tail_slope is not None:
        slope = tail_slope
    else:
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
