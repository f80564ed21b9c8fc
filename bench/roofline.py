"""Roofline of decode: how close each case runs to the memory-bandwidth limit, and where the time goes.

    .venv/bin/python bench/roofline.py [--model PATH|NAME] [--depths 0 8150] [--n-seq 1 16] [--kv f16 q8_0 q4_0]

A decode step must read every weight once (shared by all sequences of the step) and every cached
K/V row of every sequence. With the engine's timers on (Engine.set_timers), one case runs
--n-decode steps and the timers give the bytes the step read (weight rows streamed by the matmuls
plus the K/V rows attention read) and the split of the step's time: weights (matmuls), attention,
other (norms, RoPE, K/V writes, activations, embedding, sampling). Per case it prints

    bytes/step   weights + KV bytes one step read (the timers' count)
    limit        tok/s the measured read bandwidth allows: n_seq * bandwidth / bytes per step
    ours         tok/s over the timed steps (wall clock around Engine.step)
    of limit     ours / limit
    split        weights / attention / other, as shares of the timed step time

The bandwidth is worker._native.measure_read_bandwidth with the same threads (a read of 512 MiB in huge
pages, as the weights are), measured right before every sample: this VM's bandwidth swung from 34 to
52 GB/s within minutes, so a limit from the run's start or end misjudged samples taken in between. Each
sample's of-limit is its tok/s against its own limit. Cases run --rounds times, interleaved (every case
once, then again); figures are median (min-max) over the samples.
Deep contexts are made by Engine.fill_kv (decode cost does not depend on how the cache was made).
Cases whose KV would exceed --max-kv-gib are skipped and listed. Writes bench/results/roofline.json
(roofline-<model>.json for another --model).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from peer import record_name, spread, write_record  # bench/peer.py (bench scripts run from bench/)

from worker import _native
from worker.engine import Engine, Sampling
from worker.formats import KV_FORMATS, kv_row_bytes
from worker.models import resolve_model

TOKEN = 504  # the token every sequence feeds at its first step (as bench/decode.py)
BANDWIDTH_BYTES = 1 << 29  # read-bandwidth buffer: well past the last-level cache
BANDWIDTH_REPEATS = 2


@dataclass(frozen=True)
class Case:
    n_seq: int
    depth: int  # cached positions per sequence before the timed steps
    kv: str

    def name(self) -> str:
        return f"{self.n_seq}x d{self.depth} {self.kv}"


def run_case(eng: Engine, case: Case, n_decode: int) -> dict[str, Any]:
    """One sample: n_seq sequences at `depth`, one untimed step, then n_decode timed steps."""
    seqs = []
    for _ in range(case.n_seq):
        s = eng.add_sequence([], generate=False)
        eng.fill_kv(s, max(case.depth, 1), seed=1)
        eng.append(s, [TOKEN], Sampling(max_new_tokens=n_decode + 1, stop_tokens=()))
        seqs.append(s)
    eng.step()  # the first step also sets up scratch buffers
    eng.set_timers(True)
    eng.reset_timers()
    t0 = time.perf_counter()
    made = 0
    while eng.busy():
        made += len(eng.step())
    wall_s = time.perf_counter() - t0
    t = eng.timers()
    eng.set_timers(False)
    for s in seqs:
        eng.free(s)
    if made != case.n_seq * n_decode or t["steps"] != n_decode:
        sys.exit(f"{case.name()}: decoded {made} tokens in {t['steps']} steps, expected {case.n_seq} x {n_decode}")
    total = t["total_s"]
    return {
        "tokens_per_s": made / wall_s,
        "bytes_per_step": (t["weight_bytes"] + t["kv_bytes"]) / t["steps"],
        "weight_bytes_per_step": t["weight_bytes"] / t["steps"],
        "kv_bytes_per_step": t["kv_bytes"] / t["steps"],
        "weights_share": t["weights_s"] / total,
        "attention_share": t["attention_s"] / total,
        "other_share": t["other_s"] / total,
        "step_ms": 1e3 * total / t["steps"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="GGUF path or a name `swarm models` lists (default: the default model)"
    )
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 8150])
    ap.add_argument("--n-seq", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--kv", nargs="+", default=list(KV_FORMATS), choices=KV_FORMATS)
    ap.add_argument("--n-decode", type=int, default=16, help="timed decode steps per sample")
    ap.add_argument("--rounds", type=int, default=3, help="samples per case, interleaved across cases")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-kv-gib", type=float, default=4.0, help="skip cases whose KV cache would be larger")
    args = ap.parse_args()
    model = resolve_model(args.model)

    engines = {kv: Engine(model, kv_k=kv, kv_v=kv, threads=args.threads) for kv in args.kv}
    cfg = next(iter(engines.values())).config
    n_ctx = int(cfg["n_ctx_train"])
    cases, skipped = [], []
    for n_seq in args.n_seq:
        for depth in args.depths:
            for kv in args.kv:
                case = Case(n_seq, depth, kv)
                positions = max(depth, 1) + args.n_decode + 1
                kv_bytes = n_seq * positions * int(cfg["n_layer"]) * int(cfg["n_head_kv"]) * 2
                kv_bytes *= kv_row_bytes(kv, int(cfg["head_dim"]))
                if positions > n_ctx:
                    skipped.append(f"{case.name()} (depth + {args.n_decode + 1} steps > the model's {n_ctx} tokens)")
                elif kv_bytes > args.max_kv_gib * (1 << 30):
                    skipped.append(f"{case.name()} (KV {kv_bytes / (1 << 30):.1f} GiB > --max-kv-gib)")
                else:
                    cases.append(case)

    started = time.time()
    load = os.getloadavg()
    samples: dict[Case, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for c in cases:
            bandwidth = _native.measure_read_bandwidth(args.threads, BANDWIDTH_BYTES, BANDWIDTH_REPEATS)
            sample = run_case(engines[c.kv], c, args.n_decode)
            sample["read_bandwidth"] = bandwidth
            sample["limit_tokens_per_s"] = c.n_seq * bandwidth / sample["bytes_per_step"]
            sample["of_limit"] = sample["tokens_per_s"] / sample["limit_tokens_per_s"]
            samples[c].append(sample)
    bandwidths = spread([x["read_bandwidth"] for s in samples.values() for x in s])

    print(
        f"# roofline, {model.name}, {args.threads} threads, isa {next(iter(engines.values())).isa}, "
        f"{args.n_decode} timed steps x {args.rounds} interleaved rounds per case"
    )
    print(
        f"# read bandwidth before each sample {bandwidths['median'] / 1e9:.1f} GB/s "
        f"({bandwidths['min'] / 1e9:.1f}-{bandwidths['max'] / 1e9:.1f}); "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start"
    )
    print(
        "# limit = n_seq * bandwidth / bytes per step and of limit = tok/s / limit, per sample (the bandwidth "
        "measured before it); split = share of step time"
    )
    print(
        f"{'seqs':>4} {'depth':>5} {'kv':>7} {'MB/step':>8} {'(weights':>8} {'KV)':>7} {'limit':>7}"
        f" {'ours tok/s':>19} {'of limit':>16} {'weights':>7} {'attn':>5} {'other':>5} {'ms/step':>7}"
    )
    cells = []
    for c in cases:
        s = samples[c]
        tps = spread([x["tokens_per_s"] for x in s])
        bytes_step = statistics.median(x["bytes_per_step"] for x in s)
        limit = statistics.median(x["limit_tokens_per_s"] for x in s)
        of_limit = spread([x["of_limit"] for x in s])
        shares = {k: statistics.median(x[k] for x in s) for k in ("weights_share", "attention_share", "other_share")}
        cell = {
            "n_seq": c.n_seq,
            "depth": c.depth,
            "kv": c.kv,
            "samples": s,
            "tokens_per_s": tps,
            "bytes_per_step": bytes_step,
            "limit_tokens_per_s": limit,
            "of_limit": of_limit,
            **shares,
        }
        cells.append(cell)
        tps_text = f"{tps['median']:.1f} ({tps['min']:.0f}-{tps['max']:.0f})"
        of_text = f"{of_limit['median']:.2f} ({of_limit['min']:.2f}-{of_limit['max']:.2f})"
        print(
            f"{c.n_seq:4d} {c.depth:5d} {c.kv:>7} {bytes_step / 1e6:8.1f} "
            f"{statistics.median(x['weight_bytes_per_step'] for x in s) / 1e6:8.1f} "
            f"{statistics.median(x['kv_bytes_per_step'] for x in s) / 1e6:7.1f} {limit:7.1f} {tps_text:>19} "
            f"{of_text:>16} {shares['weights_share']:7.2f} {shares['attention_share']:5.2f} "
            f"{shares['other_share']:5.2f} {statistics.median(x['step_ms'] for x in s):7.2f}",
            flush=True,
        )
    for line in skipped:
        print(f"# skipped: {line}")
    print(f"# {time.time() - started:.0f} s")
    parameters = {
        "model": model.name,
        "threads": args.threads,
        "n_decode": args.n_decode,
        "rounds": args.rounds,
        "depths": args.depths,
        "n_seq": args.n_seq,
        "kv": args.kv,
    }
    path = write_record(
        record_name("roofline", args.model),
        parameters,
        cells,
        read_bandwidth_bytes_per_s=[x["read_bandwidth"] for c in cases for x in samples[c]],
        load_average=list(load),
    )
    print(f"# written: {path}")


if __name__ == "__main__":
    main()
