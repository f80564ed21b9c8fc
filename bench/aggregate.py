"""Aggregate decode tokens/s for 1, 4, 8, 16 concurrent sequences (256-token
prompts), ours (one batched step per token of every sequence) against llama.cpp
(one llama_decode per step over a batch with one token of each sequence id).

    .venv/bin/python bench/aggregate.py [--peer-python PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from peer import Peer  # bench/peer.py (bench scripts run from bench/)

from worker.engine import Engine, Sampling
from worker.models import resolve_model


def ours(model: Path, kv: str, n_seq: int, prompt_len: int, n_new: int, threads: int) -> float:
    eng = Engine(model, kv_k=kv, kv_v=kv, threads=threads, max_batch_tokens=512)
    ids = [
        eng.add_sequence(
            [(17 * s + 31 * i) % 40000 + 100 for i in range(prompt_len)],
            Sampling(max_new_tokens=n_new + 1, stop_tokens=()),
        )
        for s in range(n_seq)
    ]
    first: set[int] = set()
    while len(first) < n_seq:  # prefill every sequence (each yields its first token)
        first.update(eng.step())
    t0 = time.perf_counter()
    made = 0
    while eng.busy():
        made += len(eng.step())
    dt = time.perf_counter() - t0
    for i in ids:
        eng.free(i)
    return made / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--n-seq", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--kv", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--n-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--peer-cache", default=None, help="JSON file to reuse llama.cpp results from (written when missing)"
    )
    args = ap.parse_args()
    model = resolve_model(args.model)
    peer = Peer(args.peer_python, args.peer_cache)

    def peer_for(kv: str, n: int) -> list[dict]:
        """llama.cpp for one (KV type, sequence count), flash attention off and on."""
        cfg = {
            "mode": "aggregate",
            "model": str(model),
            "prompt_len": args.prompt_len,
            "n_new": args.n_new,
            "threads": args.threads,
            "cases": [{"kv": kv, "flash_attn": fa, "n_seq": n} for fa in (False, True)],
        }
        return peer.run(cfg, lambda r: r["kv"] == kv and r["n_seq"] == n)

    print(f"# aggregate decode, {args.prompt_len}-token prompts, {args.n_new} new tokens each, {args.threads} threads")
    print("# ratio = ours / llama.cpp's faster flash-attention setting for the same KV type, measured back to back")
    print(f"{'seqs':>5} {'kv':>6} {'ours tok/s':>11} {'llama fa=0':>11} {'llama fa=1':>11} {'ratio':>6}")
    for n in args.n_seq:
        for kv in args.kv:
            peer_rows = peer_for(kv, n)
            mine = ours(model, kv, n, args.prompt_len, args.n_new, args.threads)
            rates = {r["flash_attn"]: r.get("tokens_per_s") for r in peer_rows}
            best = max((v for v in rates.values() if v), default=None)
            fmt = lambda v: f"{v:11.1f}" if v else f"{'n/a':>11}"  # noqa: E731
            ratio = mine / best if best else float("nan")
            print(f"{n:5d} {kv:>6} {mine:11.1f} {fmt(rates.get(False))} {fmt(rates.get(True))} {ratio:6.2f}")

    print(f"# llama-cpp-python {peer.version}")
    peer.save()


if __name__ == "__main__":
    main()
