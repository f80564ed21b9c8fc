"""How close does the heuristic search (greedy + local search) get to the exact optimum?

Random memory-tight instances small enough to solve exactly (at most 8 agents over 3
workers): the ratio of the heuristic plan's predicted tokens/s to the exhaustive
search's, over many seeds. docs/PLANNER.md quotes the worst ratio found. Costs
are synthetic (per-device speed and per-format twists around this machine's
measured exchange rate), and the default quality floor is off: this measures
the search, not the objective.

    python bench/plan_search_quality.py [--instances 2000] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from swarm.errors import NoFeasiblePlan
from swarm.planner import AgentGroup, Calibration, DeviceProfile, ModelGeometry, Policy, all_pairs, pair_name, plan

SMOLLM = ModelGeometry("smollm2", 30, 9, 3, 64, 576, 1536, 49152, 8192, 96_436_224, 100_000_000)
BASE_NS = {"f32": 150.0, "f16": 103.0, "q8_0": 50.0, "q8_head": 86.0, "q4_0": 67.0}  # docs/BENCHMARKS.md
NO_FLOOR = Policy(quality_floor=None)


def instance(rng: random.Random) -> tuple[list[DeviceProfile], list[AgentGroup]]:
    devs = []
    for i in range(rng.randint(2, 3)):
        speed, w0 = rng.uniform(0.3, 3.0), rng.uniform(0.003, 0.02)
        twist = {f: rng.uniform(0.7, 1.4) for f in BASE_NS}
        attn = {
            pair_name(p): speed * (BASE_NS[p[0]] * twist[p[0]] + BASE_NS[p[1]] * twist[p[1]]) / 2 for p in all_pairs()
        }
        cal = Calibration("measured", tuple(w0 * (1 + 0.05 * b) for b in range(16)), attn)
        devs.append(DeviceProfile(f"w{i}", "x", "cpu", int(rng.uniform(0.12e9, 0.5e9)), cal))  # tight memory
    groups, left = [], rng.randint(3, 8)
    for j in range(rng.randint(1, 3)):
        if left <= 0:
            break
        count = rng.randint(1, left)
        left -= count
        groups.append(AgentGroup(f"g{j}", count, rng.choice([257, 1024, 2048, 4096, 8192])))
    return devs, groups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ratios = []
    for _ in range(args.instances):
        devs, groups = instance(rng)
        try:
            exact = plan(SMOLLM, devs, groups, NO_FLOOR, search="exact").tokens_per_s
        except NoFeasiblePlan:
            continue
        try:
            heur = plan(SMOLLM, devs, groups, NO_FLOOR, search="greedy+local").tokens_per_s
        except NoFeasiblePlan:
            heur = 0.0
        ratios.append(heur / exact)
    worst = min(ratios)
    below = sum(r < 0.999 for r in ratios)
    print(
        f"{len(ratios)} feasible instances (seed {args.seed}): greedy+local / exact "
        f"median {statistics.median(ratios):.4f}, worst {worst:.4f}; {below} below 0.999"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "instances": len(ratios), "worst": worst, "below_0.999": below,
                       "median": statistics.median(ratios)}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
