"""One worker's evaluation: for given agent counts, every format's bytes, fit, quality and tokens/s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from swarm.errors import NoFeasiblePlan
from swarm.planner.calibration import _UNMEASURED_BELOW_FLOOR, DeviceProfile, Interval, Quality
from swarm.planner.geometry import ModelGeometry, scratch_bytes
from swarm.planner.request import AgentGroup, Policy
from worker.formats import pair_name
from worker.settings import EngineSettings

# Quality rank when a model has no measured quality table (higher keeps more bits).
_WIDTH_RANK = {"f32": 4, "f16": 3, "q8_head": 2, "q8_0": 2, "q4_0": 0}


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
        # Two block classes of bt positions (docs/PLANNER.md): the global layers' (a sequence holds
        # ceil(context / bt), its shared prefix's full blocks once per worker) and the sliding-window
        # layers' (a bounded number per sequence, never shared; none for models without them).
        per_token = [geom.class_bytes_per_token(p) for p in self.pairs]
        self.block_bytes = np.array([g * bt for g, _ in per_token], dtype=np.float64)
        self.sliding_block_bytes = np.array([s * bt for _, s in per_token], dtype=np.float64)
        # the engine shares prefix blocks only for models without sliding layers (docs/ARCHITECTURE.md)
        sharing = geom.n_sliding == 0
        self.shared = np.array(
            [min(g.shared_prefix_tokens, g.context - 1) // bt if sharing else 0 for g in groups], dtype=np.int64
        )
        self.private = np.array([-(-g.context // bt) for g in groups], dtype=np.int64) - self.shared
        self.sliding = np.array([geom.sliding_blocks(g.context, settings) for g in groups], dtype=np.int64)
        self.context = np.array([g.context for g in groups], dtype=np.float64)
        # (layer, position) pairs one decode step of an agent reads: context x layers, windows capped
        self.positions = np.array([geom.attended_positions(g.context) for g in groups], dtype=np.float64)
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
        kv = blocks * self.block_bytes + int(counts @ self.sliding) * self.sliding_block_bytes
        max_ctx = int(self.context[present].max()) if n else 0
        fits = kv <= self.free_bytes(di, n, max_ctx)
        qual = self.qual_ok[di][present].all(axis=0) if n else np.ones(len(self.pairs), dtype=bool)
        cal = self.devices[di].calibration
        if not n:
            return kv, fits, qual, np.zeros(len(self.pairs))
        t = cal.weight_time(n) + self.attn[di] * float(counts @ self.positions)
        tps = np.where(fits & qual & ~np.isnan(self.attn[di]), n / t, 0.0)
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
        positions = float(counts @ self.positions)
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
        positions = float(counts @ self.positions)
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
