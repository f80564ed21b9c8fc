"""Decode speed at 1 and 2 threads, many runs each, interleaved: how steady is it?

One descheduled core should not stall a step. This runs a greedy decode of the
default model N times per thread count, alternating 1-thread and 2-thread runs
(so load that comes and goes on the machine hits both alike), and prints the
median and the range (min-max) of decode tokens/s for each.

    .venv/bin/python bench/threads.py [--runs 10] [--max-tokens 128] [--json results/threads_before.json]

Decode tokens/s is Completion.decode_tokens_per_s (tokens after the first, over
the time after the first; the prefill is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from worker.engine import Engine, Sampling
from worker.models import resolve_model

THREAD_COUNTS = (1, 2)


def decode_rate(eng: Engine, prompt: str, max_tokens: int) -> float:
    """Decode tokens/s of one greedy completion that runs to max_tokens."""
    done = eng.generate(prompt, max_tokens=max_tokens, sampling=Sampling(temperature=0.0), stop_at_eos=False)
    if len(done.token_ids) != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, got {len(done.token_ids)} ({done.finish_reason})")
    return done.decode_tokens_per_s


def summary(rates: list[float]) -> dict:
    return {
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "runs": [round(r, 2) for r in rates],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=10, help="runs per thread count")
    ap.add_argument("--json", default=None, help="write the results to this file")
    args = ap.parse_args()
    model = resolve_model(args.model)

    # One engine per thread count, built once: a run measures decode, not loading.
    engines = {t: Engine(model, threads=t) for t in THREAD_COUNTS}
    for eng in engines.values():  # warm-up: page the weights in, settle the allocator
        decode_rate(eng, args.prompt, 8)

    rates: dict[int, list[float]] = {t: [] for t in THREAD_COUNTS}
    load_before = os.getloadavg()
    for i in range(args.runs):
        for t in THREAD_COUNTS if i % 2 == 0 else reversed(THREAD_COUNTS):
            rates[t].append(decode_rate(engines[t], args.prompt, args.max_tokens))
    load_after = os.getloadavg()

    cores = os.cpu_count()
    print(f"# {model.name}, greedy, {args.max_tokens} tokens, {args.runs} runs per thread count, interleaved")
    print(f"# {platform.machine()}, {cores} cores, isa {engines[1].isa}")
    print(f"# 1-min load average: {load_before[0]:.2f} at start, {load_after[0]:.2f} at end")
    print(f"{'threads':>7} {'median tok/s':>12} {'min':>7} {'max':>7}  runs")
    results = {}
    for t in THREAD_COUNTS:
        s = summary(rates[t])
        results[str(t)] = s
        print(f"{t:7d} {s['median']:12.1f} {s['min']:7.1f} {s['max']:7.1f}  {' '.join(f'{r:.0f}' for r in rates[t])}")

    if args.json:
        out = {
            "model": model.name,
            "prompt": args.prompt,
            "max_tokens": args.max_tokens,
            "runs_per_thread_count": args.runs,
            "decode_tokens_per_s": results,
            "machine": platform.machine(),
            "cores": cores,
            "isa": engines[1].isa,
            "load_average_1min": {"start": load_before[0], "end": load_after[0]},
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "python": sys.version.split()[0],
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
