"""Zero regret, measured: is the planner's KV format the one that decodes fastest here?

Sweeps points of (agents, context per agent, memory cap) on this machine. At each
point the planner chooses a format from this run's calibration (diagonal K/V
pairs, the default quality floor); then the engine measures the decode
tokens/s of every allowed format that fits the cap, the formats interleaved
(every format timed once per repeat, in an order rotating per repeat) so that
the machine's drift hits them alike. "Allowed" is the planner's own rule: the
formats that meet the default quality floor, or every format that fits when
none of those does.

A point has zero regret when the chosen format's measured median is within the
measured noise of the best one's: best median - chosen median <= the sum of the
two formats' half interquartile ranges. The prediction error is the planner's
predicted tokens/s for its choice over the chosen format's measured median, less one.

    python bench/plan_regret.py [--cached] [--json bench/results/plan_regret.json]

Targets (trust issue): zero regret at >= 95% of points, median |prediction
error| <= 10%, every point within 25%.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from swarm.gguf_header import read_geometry
from swarm.planner import AgentGroup, Calibration, DeviceProfile, EngineSettings, Policy, plan
from worker.calibrate import CalibrationOptions, Estimate, calibrate, machine_id
from worker.engine import Engine, Sampling
from worker.models import resolve_model

FORMATS = ("f32", "f16", "q8_0", "q8_head", "q4_0")
# (agents, context per agent, memory cap): "none" leaves 16 GiB; a format name caps memory at what that
# format needs (weights + scratch + its KV, plus one block per agent of slack), so wider formats do not fit.
# Total context stays <= 16k positions so that every format of a point is filled in seconds.
POINTS = [
    (1, 512, "none"), (1, 2048, "none"), (1, 4096, "none"), (1, 7900, "none"),
    (2, 1024, "none"), (2, 4096, "none"), (2, 7900, "q8_0"),
    (4, 512, "none"), (4, 1024, "q8_0"), (4, 2048, "none"), (4, 4000, "none"), (4, 4000, "q4_0"),
    (8, 256, "none"), (8, 1024, "none"), (8, 2000, "q8_0"), (8, 2000, "none"),
    (12, 1024, "none"), (12, 1300, "q4_0"),
    (16, 256, "none"), (16, 512, "f16"), (16, 1000, "none"), (16, 1000, "q8_0"),
]  # fmt: skip
REPEATS = 5  # timings per format per point; the median and quartiles of these
STEPS, WARMUP = 5, 1  # decode steps per timing (their median), after untimed ones
ROOMY = 16 * 2**30


def _device(cal: Calibration, usable: int) -> DeviceProfile:
    return DeviceProfile("host", "local", "cpu", usable, cal)


def _cap(geom, cal: Calibration, settings: EngineSettings, agents: int, context: int, cap: str) -> int:  # type: ignore[no-untyped-def]
    if cap == "none":
        return ROOMY
    p = plan(geom, [_device(cal, ROOMY)], [AgentGroup("a", agents, context)], Policy.allow([cap]), settings=settings)
    w = p.workers[0]
    return w.memory_bytes + agents * w.block_bytes  # one spare block per agent: the next format up must not fit


def _timing(eng: Engine, ids: list[int]) -> float:
    for sid in ids:
        eng.append(sid, [1], Sampling(max_new_tokens=STEPS + WARMUP + 2))
    eng.step()
    times = []
    for i in range(STEPS + WARMUP):
        t0 = time.perf_counter()
        eng.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    for sid in ids:
        eng.finish(sid)
        eng.score(sid, [])
    return len(ids) / statistics.median(times)


def measure(model, formats: list[str], agents: int, context: int, threads: int) -> dict[str, Estimate]:  # type: ignore[no-untyped-def]
    """Decode tokens/s of each format with `agents` sequences at `context`, interleaved over REPEATS."""
    engines, seqs = {}, {}
    for f in formats:
        eng = Engine(model, kv_k=f, kv_v=f, threads=threads, prefix_sharing=False)
        ids = [eng.add_sequence([], generate=False) for _ in range(agents)]
        start = context - REPEATS * (STEPS + WARMUP + 3)  # so the timed steps end near `context`
        for sid in ids:
            eng.fill_kv(sid, max(1, start), seed=sid)
        engines[f], seqs[f] = eng, ids
    samples: dict[str, list[float]] = {f: [] for f in formats}
    for r in range(REPEATS):
        for f in formats[r % len(formats) :] + formats[: r % len(formats)]:
            samples[f].append(_timing(engines[f], seqs[f]))
    return {f: Estimate.of(v) for f, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cached", action="store_true", help="use the cached calibration instead of measuring now")
    args = ap.parse_args()
    model = resolve_model(None)
    geom = read_geometry(model)
    settings = EngineSettings(threads=args.threads)
    opts = CalibrationOptions(pairs=tuple((f, f) for f in FORMATS), threads=args.threads)
    # Calibrate in this run by default: a prediction is judged against the machine as it is now.
    cal = Calibration.from_dict(calibrate(model, opts, remeasure=not args.cached, progress=print))
    if not cal.reliable:
        print("calibration UNRELIABLE on this run:", "; ".join(cal.problems))
    policy = Policy(formats=tuple((f, f) for f in FORMATS))
    rows = []
    print(f"machine: {machine_id()}; {time.strftime('%Y-%m-%d')}; {args.threads} threads")
    head = (
        f"{'agents':>6} {'context':>7} {'cap':>5} {'chosen':>8} {'best':>8} {'chosen tok/s':>16} "
        f"{'best tok/s':>16} {'predicted':>9} {'error':>7} {'regret':>7}"
    )
    print(head)
    print("-" * len(head))
    for agents, context, cap in POINTS:
        usable = _cap(geom, cal, settings, agents, context, cap)
        p = plan(geom, [_device(cal, usable)], [AgentGroup("a", agents, context)], policy, settings=settings)
        w = p.workers[0]
        fitting = [o for o in w.options if o.tokens_per_s is not None]
        allowed = [o.format for o in fitting if o.meets_floor] or [o.format for o in fitting]
        measured = measure(model, allowed, agents, context, args.threads)
        best = max(allowed, key=lambda f: measured[f].median)
        chosen = w.format

        half = {f: (e.high - e.low) / 2 for f, e in measured.items()}
        gap = measured[best].median - measured[chosen].median
        zero_regret = gap <= half[best] + half[chosen]
        error = w.tokens_per_s / measured[chosen].median - 1
        row = {
            "agents": agents, "context": context, "cap": cap, "usable_bytes": usable, "allowed": allowed,
            "chosen": chosen, "best": best, "predicted": w.tokens_per_s, "decision": w.decision,
            "measured": {f: {"median": e.median, "interval": [e.low, e.high]} for f, e in measured.items()},
            "zero_regret": bool(zero_regret), "prediction_error": error,
        }  # fmt: skip
        rows.append(row)
        c, b = measured[chosen], measured[best]
        print(
            f"{agents:>6} {context:>7} {cap:>5} {chosen:>8} {best:>8} "
            f"{c.median:>7.1f} ({c.low:.0f}-{c.high:.0f}) {b.median:>7.1f} ({b.low:.0f}-{b.high:.0f}) "
            f"{w.tokens_per_s:>9.1f} {error:>+7.1%} {'none' if zero_regret else f'{gap / b.median:.1%}':>7}"
        )
    share = sum(r["zero_regret"] for r in rows) / len(rows)
    errors = [abs(r["prediction_error"]) for r in rows]
    med, worst = float(np.median(errors)), max(errors)
    print(
        f"zero regret (within measured noise) at {share:.0%} of {len(rows)} points (target >= 95%); "
        f"median |prediction error| {med:.1%} (target <= 10%); max {worst:.1%} (target <= 25%)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": machine_id(), "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"),
                    "threads": args.threads, "calibration": cal.to_dict(), "points": rows,
                    "zero_regret_share": share, "median_abs_error": med, "max_abs_error": worst,
                },
                f, indent=1,
            )  # fmt: skip


if __name__ == "__main__":
    main()
