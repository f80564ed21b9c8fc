"""What to place and how to choose: agent groups and the policy."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from swarm.planner.calibration import DEFAULT_QUALITY_FLOOR, QualityFloor
from worker.formats import KV_FORMATS, FormatPair, all_pairs


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
