"""Calibration statistics: medians with interquartile intervals, line fits, and when to distrust them.

Pure NumPy over the samples worker/calibrate.py times; no engine here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

INTERVAL = "interquartile range (25th-75th percentile) of the per-repeat estimates"
# A line through the pooled (context, step time) points must explain at least this share of their
# variance; below it the slope is mostly noise. The 1k-8k span of the default model moves a step by
# 2-10x its weight-stream time, so an honest fit clears 0.5 easily on a quiet machine.
MIN_R2 = 0.5


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The median of repeated estimates and their interquartile range."""

    median: float
    low: float
    high: float

    @staticmethod
    def of(samples: Sequence[float]) -> Estimate:
        a = np.asarray(samples, dtype=np.float64)
        lo, med, hi = np.percentile(a, [25, 50, 75])
        return Estimate(float(med), float(lo), float(hi))


def pooled_r2(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Share of the variance of ys that a least-squares line in xs explains (pooled over repeats)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if len(set(x.tolist())) < 2 or np.var(y) == 0:
        return 0.0
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (slope * x + icpt)
    return float(1.0 - np.sum(resid**2) / np.sum((y - y.mean()) ** 2))


def attention_problem(est: Estimate, r2: float) -> str | None:
    """Why a fitted attention cost cannot be trusted, or None."""
    if est.median <= 0:
        return f"negative slope (median {est.median:.1f} ns)"
    if est.low <= 0:
        return f"interval reaches zero ({est.low:.1f}..{est.high:.1f} ns)"
    if r2 < MIN_R2:
        return f"poor fit (R^2 {r2:.2f} < {MIN_R2})"
    return None


@dataclasses.dataclass(frozen=True)
class AttentionFit:
    estimate: Estimate  # ns per position per layer
    r2: float
    samples: tuple[float, ...]
    problem: str | None  # None: reliable

    def to_dict(self) -> dict[str, Any]:
        return {
            "ns_per_position_layer": self.estimate.median,
            "ns_per_position_layer_interval": [self.estimate.low, self.estimate.high],
            "r2": self.r2,
            "samples": list(self.samples),
            "reliable": self.problem is None,
            **({"problem": self.problem} if self.problem else {}),
        }
