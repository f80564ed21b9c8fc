"""Does the planner's cost model match reality on this machine?

For several (KV format, agents, context) points: the planner's predicted
aggregate decode tokens/s (from this machine's calibration) next to the engine
measured right after (every agent's KV filled to the context, median of timed
decode steps). The goal is |predicted / measured - 1| <= 20%.

    python bench/plan_vs_measured.py [--json bench/results/plan_vs_measured.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from swarm.gguf_header import read_geometry
from swarm.planner import AgentGroup, Calibration, DeviceProfile, EngineSettings, Policy, plan
from worker.calibrate import CalibrationOptions, calibrate, machine_id
from worker.engine import Engine, Sampling
from worker.models import resolve_model

# (format, agents, context per agent)
POINTS = [
    ("f16", 1, 1024), ("f16", 4, 2048), ("f16", 8, 4096),
    ("q8_0", 1, 4096), ("q8_0", 4, 2048), ("q8_0", 8, 4096),
    ("q4_0", 2, 8000), ("q4_0", 16, 1024),
    ("q8_head", 4, 4096), ("f32", 2, 4096),
]  # fmt: skip
STEPS, WARMUP = 9, 2


def measure(model, fmt: str, agents: int, context: int, threads: int) -> float:  # type: ignore[no-untyped-def]
    eng = Engine(model, kv_k=fmt, kv_v=fmt, threads=threads, prefix_sharing=False)
    ids = [eng.add_sequence([], generate=False) for _ in range(agents)]
    for sid in ids:
        eng.fill_kv(sid, context - 1, seed=sid)
        eng.append(sid, [1], Sampling(max_new_tokens=STEPS + WARMUP + 2))
    eng.step()
    times = []
    for i in range(STEPS + WARMUP):
        t0 = time.perf_counter()
        eng.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return agents / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cached", action="store_true", help="use the cached calibration instead of measuring now")
    args = ap.parse_args()
    model = resolve_model(None)
    geom = read_geometry(model)
    opts = CalibrationOptions(pairs=tuple((f, f) for f in ("f32", "f16", "q8_0", "q8_head", "q4_0")),
                              threads=args.threads)  # fmt: skip
    # Calibrate in this run by default: this VM's speed drifts by tens of percent between runs
    # (noisy neighbours), and a prediction should be judged against the machine as it is now.
    cal = Calibration.from_dict(calibrate(model, opts, remeasure=not args.cached, progress=print))
    dev = DeviceProfile("host", "local", "cpu", 16 * 2**30, cal)
    rows = []
    print(f"machine: {machine_id()}; {time.strftime('%Y-%m-%d')}")
    print(f"{'format':<8} {'agents':>6} {'context':>8} {'predicted':>10} {'measured':>9} {'pred/meas':>9}")
    for fmt, agents, context in POINTS:
        p = plan(geom, [dev], [AgentGroup("a", agents, context)], Policy.allow([fmt]),
                 settings=EngineSettings(threads=args.threads))  # fmt: skip
        predicted = p.tokens_per_s
        measured = measure(model, fmt, agents, context, args.threads)
        ratio = predicted / measured
        rows.append({"format": fmt, "agents": agents, "context": context, "predicted": predicted,
                     "measured": measured, "ratio": ratio})  # fmt: skip
        flag = "" if abs(ratio - 1) <= 0.2 else "  <- outside 20%"
        print(f"{fmt:<8} {agents:>6} {context:>8} {predicted:>10.1f} {measured:>9.1f} {ratio:>9.3f}{flag}")
    within = sum(abs(r["ratio"] - 1) <= 0.2 for r in rows)
    print(f"{within}/{len(rows)} points within 20%; median |error| "
          f"{statistics.median(abs(r['ratio'] - 1) for r in rows):.1%}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_id(), "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"),
                       "calibration": cal.to_dict(), "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
