"""Before and after: decode tok/s of another build of the engine module against this one, alternated.

    .venv/bin/python bench/ab_builds.py --old /tmp/old/b/_native.cpython-311-x86_64-linux-gnu.so \
        [--depths 0 8150] [--kv q8_0 q4_0 f16] [--seqs 1 16] [--rounds 3]

Build the old module from an earlier commit beside the tree (`git archive REV native | tar -x -C /tmp/old`,
then `cmake -S /tmp/old/native -B /tmp/old/b -DKVS_PYTHON=ON -Dpybind11_DIR=...` and `cmake --build`).
Each round runs the old build, then this one (--new: another .so), in fresh subprocesses (one module per
process), so both see the same machine minutes apart; each cell is one sequence whose cache is filled to
the depth by Engine.fill_kv (--seqs N: N such sequences stepped together), one untimed step, then --steps
timed steps. Prints the median (min-max) per build and the ratio of the medians; the VM is noisy, so a
ratio whose ranges overlap is not a result.
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


def _measure(
    module: str, depths: list[int], kvs: list[str], seqs: list[int], steps: int, threads: int
) -> dict[str, float]:
    """{"kv@depth xN": tok/s} with the engine module at `module` ("" = this tree's)."""
    if module:
        spec = importlib.util.spec_from_file_location("worker._native", module)
        assert spec is not None and spec.loader is not None, module
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["worker._native"] = mod
    sys.path.insert(0, str(ROOT))
    from worker import _native
    from worker.models import resolve_model

    path = str(resolve_model(None))
    out: dict[str, float] = {}
    for kv in kvs:
        for depth in depths:
            for n in seqs:
                eng = _native.Engine(path, kv_k=kv, kv_v=kv, threads=threads)
                sp = _native.SamplingParams()
                for _ in range(n):
                    seq = eng.add_sequence([], sp, False)
                    eng.fill_kv(seq, max(depth, 1), 1)
                    eng.append(seq, [TOKEN], sp, True)
                eng.step()
                t0 = time.perf_counter()
                made = sum(len(eng.step()) for _ in range(steps))
                out[f"{kv}@{depth} x{n}"] = made / (time.perf_counter() - t0)
                del eng
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other build's _native*.so")
    ap.add_argument("--new", default="", help="this side's _native*.so (default: this tree's module)")
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 8150])
    ap.add_argument("--kv", nargs="+", default=["q8_0", "q4_0", "f16"])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1], help="sequences stepped together per cell")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24, help="timed decode steps per cell")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a subprocess: the module to load
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(_measure(args.child, args.depths, args.kv, args.seqs, args.steps, args.threads)))
        return
    if not Path(args.old).is_file():
        sys.exit(f"--old {args.old}: no such file; build the old module first (see the docstring)")
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for side, module in (("old", args.old), ("new", args.new)):
            argv = [sys.executable, __file__, "--old", args.old, "--child", module]
            argv += ["--depths", *map(str, args.depths), "--kv", *args.kv, "--seqs", *map(str, args.seqs)]
            argv += ["--steps", str(args.steps), "--threads", str(args.threads)]
            # cwd outside the tree: `worker` must come from sys.path[0] as set in _measure, not an installed copy
            p = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp", env=dict(os.environ))
            if p.returncode != 0:
                sys.exit(f"{side} build failed:\n{p.stderr[-3000:]}")
            runs[side].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"# decode tok/s, {args.threads} threads, {args.rounds} alternated rounds; median (min-max)")
    for cell in runs["old"][0]:
        old = [r[cell] for r in runs["old"]]
        new = [r[cell] for r in runs["new"]]
        mo, mn = statistics.median(old), statistics.median(new)
        print(f"{cell:18s} old {mo:7.1f} ({min(old):.1f}-{max(old):.1f})  new {mn:7.1f} ({min(new):.1f}-{max(new):.1f})"
              f"  new/old {mn / mo:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
