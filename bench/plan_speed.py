"""Planner speed: 10,000 agents over 1,000 heterogeneous workers (target: under 2 s).

Workers are catalog devices with memory caps drawn from the catalog's range,
agents come in 20 groups of 500 with contexts from 512 to 8192; the model is
the default SmolLM2 geometry. Prints the median of several runs and the ratio
to the 2-second target.

    python bench/plan_speed.py [--runs 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from swarm.devices import load_catalog
from swarm.planner import AgentGroup, Calibration, DeviceProfile, ModelGeometry, all_pairs, plan

SMOLLM = ModelGeometry("smollm2-135m", 30, 9, 3, 64, 576, 1536, 49152, 8192, 96_436_224, 100_000_000)
TARGET_S = 2.0


def fleet(n: int) -> list[DeviceProfile]:
    specs = list(load_catalog().values())
    out = []
    for i in range(n):
        spec = specs[i % len(specs)]
        cap = int(spec.usable_bytes * (0.02 + 0.01 * (i % 7)))  # each worker gets a slice of its device
        cal = Calibration.from_bandwidth(SMOLLM, spec.effective_bandwidth, all_pairs())
        out.append(DeviceProfile(f"w{i:04d}", spec.id, spec.backend, cap, cal))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1_000)
    args = ap.parse_args()
    devices = fleet(args.workers)
    n_groups = 20
    groups = [AgentGroup(f"g{j}", args.agents // n_groups, 512 + (8192 - 512) * j // (n_groups - 1), 64)
              for j in range(n_groups)]  # fmt: skip
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        p = plan(SMOLLM, devices, groups)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    used = sum(1 for w in p.workers if w.agents)
    print(f"machine: {platform.node()} {platform.machine()}, python {platform.python_version()}")
    print(f"{args.agents} agents, {args.workers} workers, search {p.search}: {used} workers used, "
          f"predicted {p.tokens_per_s:,.0f} tok/s")  # fmt: skip
    print(f"plan time: median {med:.3f} s of {args.runs} (min {min(times):.3f}, max {max(times):.3f}); "
          f"{med / TARGET_S:.2f}x the {TARGET_S:.0f} s target")  # fmt: skip


if __name__ == "__main__":
    main()
