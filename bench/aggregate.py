"""Aggregate decode tokens/s for 1, 4, 8, 16 concurrent sequences (256-token
prompts), ours (one batched step per token of every sequence) against llama.cpp
(one llama_decode per step over a batch with one token of each sequence id); both
prefill and take one step untimed, then time n_new steps of n_seq tokens each.

    .venv/bin/python bench/aggregate.py [--model PATH|NAME] [--peer-python PATH]

llama.cpp runs four configurations per cell: its KV cache unified (one cache that
every sequence's attention spans, masked) or split per sequence (kv_unified off),
each with flash attention off and on. Each cell alternates --rounds samples: ours,
the four llama.cpp configurations, ours, ... and prints median (min-max); the
ratio is our median over llama.cpp's best median (named in 'best'). Both sides
and the setup go to bench/results/aggregate.json (aggregate-<model>.json for another
--model: a path or a name `swarm models` lists).

With --temperature T (and --top-k, --top-p) both sides draw every token and feed it
back: ours through the engine's sampler, llama.cpp through its sampler chain (top-k,
top-p, temp, dist) per sequence, so the figures include the draw that agent
frameworks' requests (temperature 0.7, top_p 0.9 or 1) ask for. Those runs go to
aggregate-sampled.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any

from peer import (  # bench/peer.py (bench scripts run from bench/)
    Peer,
    check_prompt_vocab,
    print_best_of_any_kv,
    record_name,
    show,
    spread,
    write_record,
)  # bench/peer.py (bench scripts run from bench/)

from worker.engine import Engine, Sampling
from worker.models import resolve_model

# llama.cpp configurations per cell: {name: (kv_unified, flash_attn)}
PEER_CONFIGS = {
    "uni fa=0": (True, False),
    "uni fa=1": (True, True),
    "seq fa=0": (False, False),
    "seq fa=1": (False, True),
}


def ours_sample(eng: Engine, n_seq: int, prompt_len: int, n_new: int, sampling: dict[str, Any]) -> dict[str, float]:
    """Prefill n_seq distinct prompts (untimed, without sampling), take one untimed
    step, then time n_new steps that each feed one token of every sequence, as
    llama.cpp's side does (so every timed step is a batch of n_seq). sampling: the
    draw's settings (temperature 0: greedy), sequence s seeded with s."""
    ids = [
        # llama_peer.prompt_tokens(s, prompt_len)
        eng.add_sequence([(17 * s + 31 * i) % 40000 + 100 for i in range(prompt_len)], generate=False)
        for s in range(n_seq)
    ]
    while eng.busy():
        eng.step()
    for s, i in enumerate(ids):
        eng.append(i, [504 + s], Sampling(max_new_tokens=n_new + 1, stop_tokens=(), seed=s, **sampling))
    eng.step()  # untimed first step, as llama.cpp's side
    t0 = time.perf_counter()
    made = 0
    while eng.busy():
        made += len(eng.step())
    dt = time.perf_counter() - t0
    for i in ids:
        eng.free(i)
    if made != n_seq * n_new:
        sys.exit(f"ours made {made} of {n_seq * n_new} tokens")
    return {"tokens_per_s": made / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="GGUF path or a name `swarm models` lists (default: the default model)"
    )
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--n-seq", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--kv", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--n-new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="samples per side per cell, alternated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--peer-cache",
        default=None,
        help="JSON file of llama.cpp samples, reused only on an exact parameter match (and rewritten)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="> 0: both sides draw every token (ours: Sampling; llama.cpp: its sampler chain) and feed it back",
    )
    ap.add_argument("--top-k", type=int, default=0, help="with --temperature; 0: off")
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature; 1: off")
    args = ap.parse_args()
    model = resolve_model(args.model)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p} if args.temperature else {}
    check_prompt_vocab(model)
    peer = Peer(args.peer_python, model, args.peer_cache)

    def configs(kv: str, n: int) -> dict[str, dict]:
        return {
            name: {
                "mode": "aggregate",
                "kv": kv,
                "flash_attn": fa,
                "unified": unified,
                "n_seq": n,
                "prompt_len": args.prompt_len,
                "n_new": args.n_new,
                "threads": args.threads,
                **({"sampling": sampling} if sampling else {}),
            }
            for name, (unified, fa) in PEER_CONFIGS.items()
        }

    print(
        f"# aggregate decode, {args.prompt_len}-token prompts, {args.n_new} new tokens each, {args.threads} threads, "
        f"{args.rounds} alternated rounds per cell"
    )
    if sampling:
        print(f"# every token drawn on both sides: {sampling} (llama.cpp: top-k, top-p, temp, dist chain)")
    print("# tok/s as median (min-max); uni = llama.cpp's unified KV cache, seq = one cache stream per sequence")
    print("# ratio = our median / llama.cpp's best median over the four configurations for the same KV type")
    head = " ".join(f"{'llama ' + n:>19}" for n in PEER_CONFIGS)
    print(f"{'seqs':>4} {'kv':>5} {'ours tok/s':>19} {head} {'ratio':>6} {'best':>8}")
    cells = []
    started = time.time()
    for n in args.n_seq:
        for kv in args.kv:
            load = os.getloadavg()[0]  # other tenants' work: the doc quotes it next to the figures
            eng = Engine(model, kv_k=kv, kv_v=kv, threads=args.threads, max_batch_tokens=512)
            sample = functools.partial(ours_sample, eng, n, args.prompt_len, args.n_new, sampling)
            mine, theirs = peer.cell(configs(kv, n), args.rounds, sample)
            del eng
            cell: dict = {"n_seq": n, "kv": kv, "load_1min": load, "ours": {"samples": mine}, "peer": theirs}
            cell["ours"]["tokens_per_s"] = spread([s["tokens_per_s"] for s in mine])
            best = None
            for name, t in theirs.items():
                if t.get("samples"):
                    t["tokens_per_s"] = spread([s["tokens_per_s"] for s in t["samples"]])
                    if best is None or t["tokens_per_s"]["median"] > theirs[best]["tokens_per_s"]["median"]:
                        best = name
            cell["best_peer"] = best
            cell["ratio"] = (
                cell["ours"]["tokens_per_s"]["median"] / theirs[best]["tokens_per_s"]["median"] if best else None
            )
            cells.append(cell)
            peer.save()  # after every cell, so an interrupted run keeps what it measured
            row = " ".join(show(theirs[name].get("tokens_per_s")) for name in PEER_CONFIGS)
            ratio = f"{cell['ratio']:6.2f}" if best else f"{'n/a':>6}"
            print(f"{n:4d} {kv:>5} {show(cell['ours']['tokens_per_s'])} {row} {ratio} {best or 'n/a':>8}", flush=True)

    print("\n# best of any KV type per sequence count (tok/s medians)")
    print_best_of_any_kv(cells, "n_seq", args.n_seq, "{} seqs")
    cached = sum(t["cached"] for c in cells for t in c["peer"].values())
    print(f"# llama-cpp-python {peer.version}; peer configurations from cache: {cached}; {time.time() - started:.0f} s")
    parameters = {
        "model": model.name,
        "model_sha256": peer.model_sha256,
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "n_new": args.n_new,
        "rounds": args.rounds,
        "n_seq": args.n_seq,
        "kv": args.kv,
        "peer_configs": {k: {"kv_unified": u, "flash_attn": fa} for k, (u, fa) in PEER_CONFIGS.items()},
        "sampling": sampling or "fixed tokens",
    }
    bench_name = "aggregate-sampled" if sampling else "aggregate"
    print(
        f"# written: {write_record(record_name(bench_name, args.model), parameters, cells, peer_version=peer.version)}"
    )
    peer.save()
    peer.close()


if __name__ == "__main__":
    main()
