"""The exchange rate the planner lives on: for each KV format, the attention cost
in ns per cached position per layer at 1k, 4k and 8k context, next to its bytes
per position per layer. Cost = (decode step time at depth d - step time at depth
1) / (d x layers), with the cache filled by Engine.fill_kv (no long prefill);
step time = the fastest of --steps steps. Every format is measured --rounds times
(formats interleaved round by round, so load changes hit them alike) and the
table prints the median cost with its range (min-max) over rounds; the figures
go to bench/results/exchange_rate.json.

    .venv/bin/python bench/exchange_rate.py [--plot docs/exchange_rate.png]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from peer import spread, write_record  # bench/peer.py (bench scripts run from bench/)

from worker.engine import Engine, Sampling
from worker.models import resolve_model

FORMATS = ["f32", "f16", "q8_0", "q8_head", "q4_0"]


def step_seconds(eng: Engine, depth: int, steps: int) -> float:
    seq = eng.add_sequence([], generate=False)
    if depth > 1:
        eng.fill_kv(seq, depth - 1, seed=depth)
    eng.append(seq, [504], Sampling(max_new_tokens=steps + 1, stop_tokens=()))
    eng.step()  # first step, warms caches
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        best = min(best, time.perf_counter() - t0)
    eng.free(seq)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--depths", type=int, nargs="+", default=[1024, 4096, 8000])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="measurements of every format, interleaved")
    ap.add_argument("--plot", default=None, help="write a PNG of cost and bytes per position")
    args = ap.parse_args()
    model = resolve_model(args.model)
    engines = {fmt: Engine(model, kv_k=fmt, kv_v=fmt, threads=args.threads) for fmt in FORMATS}
    eng = engines["f16"]
    layers = eng.config["n_layer"]
    bytes_pos = {fmt: e.memory()["bytes_per_token"] / layers for fmt, e in engines.items()}
    # {format: {depth: [ns per position per layer, one per round]}}
    samples: dict[str, dict[int, list[float]]] = {fmt: {d: [] for d in args.depths} for fmt in FORMATS}
    for _ in range(args.rounds):
        for fmt, e in engines.items():
            base = step_seconds(e, 1, args.steps)
            for d in args.depths:
                samples[fmt][d].append((step_seconds(e, d, args.steps) - base) / (d * layers) * 1e9)
    table = {fmt: {d: statistics.median(v) for d, v in per.items()} for fmt, per in samples.items()}
    f16 = table["f16"]
    print(
        f"# attention cost per cached position per layer (all {eng.config['n_head_kv']} KV heads), "
        f"{args.threads} threads, {model.name}, ns as median (min-max) of {args.rounds} rounds"
    )
    head = " ".join(f"{'ns@' + str(d):>17} {'x f16':>6}" for d in args.depths)
    print(f"{'format':>8} {'bytes/pos':>9} {'x f16':>6} {head}")
    for fmt in FORMATS:
        cells = " ".join(
            f"{table[fmt][d]:7.1f} ({min(samples[fmt][d]):.0f}-{max(samples[fmt][d]):.0f})".rjust(17)
            + f" {table[fmt][d] / f16[d]:6.2f}"
            for d in args.depths
        )
        print(f"{fmt:>8} {bytes_pos[fmt]:9.0f} {bytes_pos[fmt] / bytes_pos['f16']:6.2f} {cells}")
    record = [
        {
            "format": fmt,
            "bytes_per_position_per_layer": bytes_pos[fmt],
            "ns_per_position_per_layer": {
                str(d): {**spread(samples[fmt][d]), "samples": samples[fmt][d], "x_f16": table[fmt][d] / f16[d]}
                for d in args.depths
            },
        }
        for fmt in FORMATS
    ]
    parameters = {"model": model.name, "threads": args.threads, "depths": args.depths, "steps": args.steps}
    print(f"# written: {write_record('exchange_rate', {**parameters, 'rounds': args.rounds}, record)}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for fmt in FORMATS:
            a1.plot(args.depths, [table[fmt][d] for d in args.depths], marker="o", label=fmt)
        a1.set_xlabel("context (positions)")
        a1.set_ylabel("ns per position per layer")
        a1.set_title("measured attention cost")
        a1.legend()
        a2.bar(FORMATS, [bytes_pos[f] for f in FORMATS], color="slategray")
        a2.set_ylabel("bytes per position per layer")
        a2.set_title("KV bytes (K + V, all KV heads)")
        fig.suptitle(f"KV format exchange rate, {model.name}, {args.threads} threads")
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
