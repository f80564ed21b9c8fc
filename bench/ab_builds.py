"""Before and after: decode tok/s of another build of the engine module against this one, alternated.

    .venv/bin/python bench/ab_builds.py --old /tmp/old/b/_native.cpython-311-x86_64-linux-gnu.so \
        [--model PATH|NAME] [--depths 0 8150] [--kv q8_0 q4_0 f16] [--seqs 1 16] [--rounds 3]

Build the old module from an earlier commit beside the tree (`git archive REV native | tar -x -C /tmp/old`,
then `cmake -S /tmp/old/native -B /tmp/old/b -DKVS_PYTHON=ON -Dpybind11_DIR=...` and `cmake --build`).
Each round runs the old build, then this one (--new: another .so), in fresh subprocesses (one module per
process), so both see the same machine minutes apart; each cell is one sequence whose cache is filled to
the depth by Engine.fill_kv (--seqs N: N such sequences stepped together), one untimed step, then --steps
timed steps. Prints the median (min-max) per build and the ratio of the medians; the VM is noisy, so a
ratio whose ranges overlap is not a result. --metric quality gives the planner's quality figures per --kv (K and
V both that format; worker.calibrate.measure_quality, float32 activations): mean KL(f32 || format) and top-1
agreement over the calibration text's first --quality-tokens tokens, each build's own f32 cache the reference;
they do not depend on the machine's speed, so one round gives them. --metric attention_ms times only the
attention part of the steps (the engine's timers, Engine.set_timers), which swings less than the whole
step's tok/s; there a ratio below 1 is the faster side (--metric weights_ms: the matmuls' part, alike).
--best-of K times K blocks of --steps steps per cell and keeps the best (depth + 1 + K * steps must fit the
model's context).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = 504  # the token fed at the first timed step (bench/decode.py's)
PREFILL_LEN = 512  # --metric prefill_tok_s: the prompt's length (bench/decode.py's)
# Metrics read off the engine's step timers: {metric: the timer}, per decode step, best (lowest) block.
TIMER_METRICS = {"attention_ms": "attention_s", "weights_ms": "weights_s"}


def _measure(
    module: str,
    depths: list[int],
    kvs: list[str],
    seqs: list[int],
    steps: int,
    threads: int,
    metric: str,
    best_of: int,
    model: str | None,
    sampling: str,
    quality_tokens: int,
) -> dict[str, float]:
    """{"kv@depth xN": tok/s, or attention ms per step} with the engine module at `module` ("" = this tree's)."""
    if module:
        spec = importlib.util.spec_from_file_location("worker._native", module)
        assert spec is not None and spec.loader is not None, module
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["worker._native"] = mod
    sys.path.insert(0, str(ROOT))
    from worker import _native
    from worker.models import resolve_model

    path = str(resolve_model(model))
    out: dict[str, float] = {}
    if metric == "quality":
        from worker.calibrate import measure_quality
        from worker.formats import pair_name

        q = measure_quality(Path(path), [(kv, kv) for kv in kvs], quality_tokens, threads)
        for kv in kvs:
            out[f"{kv} mean KL"] = q[pair_name((kv, kv))]["mean_kl"]
            out[f"{kv} top-1"] = q[pair_name((kv, kv))]["top1"]
        return out
    for kv in kvs:
        if metric == "prefill_tok_s":  # a fresh PREFILL_LEN-token prompt, best of best_of
            eng = _native.Engine(path, kv_k=kv, kv_v=kv, threads=threads)
            prompt = [(31 * i) % 40000 + 100 for i in range(PREFILL_LEN)]
            rates = []
            for _ in range(best_of + 1):  # the first one untimed: scratch buffers, pages
                seq = eng.add_sequence(prompt, _native.SamplingParams(), False)
                t0 = time.perf_counter()
                while eng.busy():
                    eng.step()
                rates.append(PREFILL_LEN / (time.perf_counter() - t0))
                eng.free(seq)
            out[f"{kv} prefill {PREFILL_LEN}"] = max(rates[1:])
            del eng
            continue
        for depth in depths:
            for n in seqs:
                eng = _native.Engine(path, kv_k=kv, kv_v=kv, threads=threads)
                for i in range(n):
                    sp = _native.SamplingParams()
                    for kv_pair in filter(None, sampling.split(",")):  # "temperature=0.7,top_p=0.9"
                        key, value = kv_pair.split("=")
                        setattr(sp, key, type(getattr(sp, key))(value))
                    sp.seed = i
                    seq = eng.add_sequence([], sp, False)
                    eng.fill_kv(seq, max(depth, 1), 1)
                    eng.append(seq, [TOKEN], sp, True)
                eng.step()
                samples = []
                for _ in range(best_of):  # blocks of `steps` steps; the best block is the cell's figure
                    if metric in TIMER_METRICS:
                        eng.set_timers(True)
                        eng.reset_timers()
                    t0 = time.perf_counter()
                    made = sum(len(eng.step()) for _ in range(steps))
                    wall_s = time.perf_counter() - t0
                    if metric in TIMER_METRICS:
                        t = eng.timers(True)
                        if t["steps"] != steps:
                            sys.exit(f"{kv}@{depth} x{n}: {t['steps']} of {steps} steps ran (past the context?)")
                        samples.append(1e3 * t[TIMER_METRICS[metric]] / t["steps"])
                    else:
                        samples.append(made / wall_s)
                out[f"{kv}@{depth} x{n}"] = min(samples) if metric in TIMER_METRICS else max(samples)
                del eng
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other build's _native*.so")
    ap.add_argument("--model", default=None, help="GGUF path or a name `swarm models` lists (default: the default)")
    ap.add_argument("--new", default="", help="this side's _native*.so (default: this tree's module)")
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 8150])
    ap.add_argument("--kv", nargs="+", default=["q8_0", "q4_0", "f16"])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1], help="sequences stepped together per cell")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24, help="timed decode steps per cell")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--metric",
        choices=["tok_s", "attention_ms", "weights_ms", "prefill_tok_s", "quality"],
        default="tok_s",
        help="decode tok/s, the attention part of a step (the engine's timers: steadier on this noisy VM), or "
        "the prefill rate of a fresh 512-token prompt (one cell per --kv; --depths and --seqs unused)",
    )
    ap.add_argument("--quality-tokens", type=int, default=1024, help="--metric quality: tokens scored")
    ap.add_argument("--best-of", type=int, default=1, help="blocks of --steps steps per cell; the best block counts")
    ap.add_argument(
        "--sampling",
        default="",
        help="every sequence draws its tokens with these SamplingParams fields, e.g. temperature=0.7,top_p=0.9 "
        "(default: greedy); sequence i is seeded with i",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a subprocess: the module to load
    args = ap.parse_args()
    if args.child is not None:
        cells = _measure(
            args.child,
            args.depths,
            args.kv,
            args.seqs,
            args.steps,
            args.threads,
            args.metric,
            args.best_of,
            args.model,
            args.sampling,
            args.quality_tokens,
        )
        print(json.dumps(cells))
        return
    if not Path(args.old).is_file():
        sys.exit(f"--old {args.old}: no such file; build the old module first (see the docstring)")
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for side, module in (("old", args.old), ("new", args.new)):
            argv = [sys.executable, __file__, "--old", args.old, "--child", module]
            argv += ["--depths", *map(str, args.depths), "--kv", *args.kv, "--seqs", *map(str, args.seqs)]
            argv += ["--steps", str(args.steps), "--threads", str(args.threads), "--metric", args.metric]
            argv += ["--best-of", str(args.best_of), "--sampling", args.sampling]
            argv += ["--quality-tokens", str(args.quality_tokens)]
            if args.model:
                argv += ["--model", args.model]
            # cwd outside the tree: `worker` must come from sys.path[0] as set in _measure, not an installed copy
            p = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp", env=dict(os.environ))
            if p.returncode != 0:
                sys.exit(f"{side} build failed:\n{p.stderr[-3000:]}")
            runs[side].append(json.loads(p.stdout.strip().splitlines()[-1]))
    what = {
        "attention_ms": "attention ms per decode step",
        "weights_ms": "matmul (weights) ms per decode step",
        "prefill_tok_s": "prefill tok/s",
        "quality": f"quality over {args.quality_tokens} tokens",
    }.get(args.metric, "decode tok/s")
    digits = 4 if args.metric == "quality" else 2 if args.metric in TIMER_METRICS else 1
    drawn = f", tokens drawn with {args.sampling}" if args.sampling else ""
    print(f"# {what}, {args.threads} threads, {args.rounds} alternated rounds{drawn}; median (min-max)")
    for cell in runs["old"][0]:
        old = [r[cell] for r in runs["old"]]
        new = [r[cell] for r in runs["new"]]
        mo, mn = statistics.median(old), statistics.median(new)
        d = digits
        print(f"{cell:18s} old {mo:7.{d}f} ({min(old):.{d}f}-{max(old):.{d}f})  new {mn:7.{d}f} ({min(new):.{d}f}-"
              f"{max(new):.{d}f})  new/old {mn / mo if mo else float('nan'):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
