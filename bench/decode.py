"""Single-sequence decode and prefill speed, side by side with llama.cpp (same
GGUF, same threads, same KV type), printed as ratios.

    .venv/bin/python bench/decode.py [--peer-python PATH] [--depths 0 512] [--kv f16 q8_0 q4_0]

The llama.cpp side runs bench/llama_peer.py under --peer-python (default: this
interpreter), which needs `pip install llama-cpp-python` (it compiles llama.cpp).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from peer import Peer  # bench/peer.py (bench scripts run from bench/)

from worker import _native
from worker.engine import Engine, Sampling
from worker.models import resolve_model


def ours(model: Path, kv: str, depth: int, n_decode: int, threads: int) -> dict:
    """Decode rate at a context depth (the cache filled by Engine.fill_kv: decode
    cost does not depend on how the cache was made), and prefill rate of a
    512-token prompt."""
    eng = Engine(model, kv_k=kv, kv_v=kv, threads=threads, max_batch_tokens=512)
    seq = eng.add_sequence([], generate=False)
    if depth > 0:
        eng.fill_kv(seq, depth, seed=1)
    eng.append(seq, [504], Sampling(max_new_tokens=n_decode + 1, stop_tokens=()))
    eng.step()
    t0 = time.perf_counter()
    made = 0
    while eng.busy():
        made += len(eng.step())
    decode_s = time.perf_counter() - t0
    eng.free(seq)
    prompt = [(17 + 31 * i) % 40000 + 100 for i in range(512)]
    t0 = time.perf_counter()
    seq = eng.add_sequence(prompt, Sampling(max_new_tokens=1, stop_tokens=()))
    while not eng.step():
        pass
    prefill_s = time.perf_counter() - t0
    eng.free(seq)
    mem = eng.memory()
    step_bytes = mem["weight_bytes"] + (depth + 1) * mem["bytes_per_token"]
    return {"tokens_per_s": made / decode_s, "prefill_tokens_per_s": 512 / prefill_s, "step_bytes": step_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--kv", nargs="+", default=["f32", "f16", "q8_0", "q8_head", "q4_0"])
    ap.add_argument(
        "--peer-cache",
        default=None,
        help="JSON file to reuse llama.cpp results from (written when missing); the peer is slow at depth",
    )
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = resolve_model(args.model)

    peer = Peer(args.peer_python, args.peer_cache)

    def peer_for(kv: str, depth: int) -> list[dict]:
        """llama.cpp for one (KV type, depth), flash attention off and on."""
        if kv == "q8_head":  # llama.cpp has no per-head int8 cache
            return []
        cfg = {
            "model": str(model),
            "n_decode": args.n_decode,
            "threads": args.threads,
            "cases": [{"kv": kv, "flash_attn": fa, "depth": depth} for fa in (False, True)],
        }
        return peer.run(cfg, lambda r: r["kv"] == kv and r["depth"] == depth)

    bandwidth = _native.measure_read_bandwidth(args.threads, 1 << 30, 3)
    print(f"# decode, 1 sequence, {args.threads} threads, {model.name}, {platform.processor() or platform.machine()}")
    print(
        f"# read bandwidth measured now with {args.threads} threads: {bandwidth / 1e9:.1f} GB/s; "
        "'of limit' = ours / (bandwidth / bytes a decode step must read: weights + KV)"
    )
    print("# ratio = ours / llama.cpp's faster flash-attention setting for the same KV type, measured back to back")
    print(
        f"{'depth':>6} {'kv':>6} {'ours tok/s':>11} {'llama fa=0':>11} {'llama fa=1':>11} {'ratio':>6}"
        f" {'of limit':>8} {'llama':>6} {'ours pp/s':>10} {'llama pp/s':>10} {'ratio':>6}"
    )
    for d in args.depths:
        for kv in args.kv:
            peer_rows = peer_for(kv, d)
            mine = ours(model, kv, d, args.n_decode, args.threads)
            theirs = {r["flash_attn"]: r for r in peer_rows}
            rates = {fa: r.get("tokens_per_s") for fa, r in theirs.items()}
            best = max((v for v in rates.values() if v), default=None)
            pp = max((r.get("prefill_tokens_per_s") or 0 for r in theirs.values()), default=0)
            fmt = lambda v: f"{v:11.1f}" if v else f"{'n/a':>11}"  # noqa: E731
            limit = bandwidth / mine["step_bytes"]
            print(
                f"{d:6d} {kv:>6} {mine['tokens_per_s']:11.1f} {fmt(rates.get(False))} {fmt(rates.get(True))} "
                f"{(mine['tokens_per_s'] / best if best else float('nan')):6.2f} "
                f"{mine['tokens_per_s'] / limit:8.2f} {(best or 0) / limit:6.2f} "
                f"{mine['prefill_tokens_per_s']:10.1f} {pp:10.1f} {mine['prefill_tokens_per_s'] / pp if pp else 0:6.2f}"
            )

    print(f"# llama-cpp-python {peer.version}")
    peer.save()


if __name__ == "__main__":
    main()
