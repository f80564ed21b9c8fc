"""Single-sequence decode and prefill speed, side by side with llama.cpp (same
GGUF, same threads, same KV type), printed as ratios of medians.

    .venv/bin/python bench/decode.py [--model PATH|NAME] [--peer-python PATH] [--depths 0 512] [--kv f16 q8_0 q4_0]

Each cell (depth, KV type) alternates --rounds samples: ours, llama.cpp with flash
attention off, on, ours, ... and prints median (min-max) per side; the ratio is
our median over llama.cpp's better median. Both sides and the setup go to
bench/results/decode.json (decode-<model>.json for another --model). The llama.cpp side runs bench/llama_peer.py under
--peer-python (default: this interpreter), which needs `pip install
llama-cpp-python` (it compiles llama.cpp).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

from peer import (  # bench/peer.py (bench scripts run from bench/)
    Peer,
    check_prompt_vocab,
    print_best_of_any_kv,
    record_name,
    show,
    spread,
    write_record,
)  # bench/peer.py (bench scripts run from bench/)

from swarm.gguf_header import read_geometry
from worker import _native
from worker.engine import Engine, Sampling
from worker.models import resolve_model

PREFILL_LEN = 512  # the fresh prompt whose prefill rate both sides report
TOKEN = 504  # the token both sides feed back at every decode step (no sampling cost difference)


def ours_sample(eng: Engine, depth: int, n_decode: int) -> dict[str, float]:
    """Decode rate at a context depth (the cache filled by Engine.fill_kv: decode
    cost does not depend on how the cache was made), after one untimed first step,
    and prefill rate of a fresh PREFILL_LEN-token prompt."""
    seq = eng.add_sequence([], generate=False)
    filled = max(depth, 1)  # llama.cpp's side needs at least one prompt token
    eng.fill_kv(seq, filled, seed=1)
    eng.append(seq, [TOKEN], Sampling(max_new_tokens=n_decode + 1, stop_tokens=()))
    eng.step()
    t0 = time.perf_counter()
    made = 0
    while eng.busy():
        made += len(eng.step())
    decode_s = time.perf_counter() - t0
    eng.free(seq)
    if made != n_decode:
        sys.exit(f"ours decoded {made} of {n_decode} tokens at depth {depth}: lower --n-decode or the depth")
    prompt = [(31 * i) % 40000 + 100 for i in range(PREFILL_LEN)]  # llama_peer.prompt_tokens(0, PREFILL_LEN)
    t0 = time.perf_counter()
    seq = eng.add_sequence(prompt, Sampling(max_new_tokens=1, stop_tokens=()))
    while not eng.step():
        pass
    prefill_s = time.perf_counter() - t0
    eng.free(seq)
    return {"tokens_per_s": made / decode_s, "prefill_tokens_per_s": PREFILL_LEN / prefill_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="GGUF path or a name `swarm models` lists (default: the default model)"
    )
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--kv", nargs="+", default=["f32", "f16", "q8_0", "q8_head", "q4_0"])
    ap.add_argument(
        "--peer-cache",
        default=None,
        help="JSON file of llama.cpp samples, reused only on an exact parameter match (and rewritten)",
    )
    ap.add_argument("--n-decode", type=int, default=32, help="timed decode steps per sample (8150 + 33 fits 8192)")
    ap.add_argument("--rounds", type=int, default=3, help="samples per side per cell, alternated")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = resolve_model(args.model)
    check_prompt_vocab(model)
    geom = read_geometry(model)
    peer = Peer(args.peer_python, model, args.peer_cache)

    def configs(kv: str, depth: int) -> dict[str, dict]:
        """llama.cpp's configurations for one (KV type, depth): flash attention off and on."""
        if kv == "q8_head":  # llama.cpp has no per-head int8 cache
            return {}
        return {
            f"fa={int(fa)}": {
                "mode": "decode",
                "kv": kv,
                "flash_attn": fa,
                "depth": depth,
                "n_decode": args.n_decode,
                "prefill_len": PREFILL_LEN,
                "threads": args.threads,
            }
            for fa in (False, True)
        }

    bandwidth = _native.measure_read_bandwidth(args.threads, 1 << 30, 3)
    print(f"# decode, 1 sequence, {args.threads} threads, {model.name}, {args.rounds} alternated rounds per cell")
    print(
        f"# read bandwidth measured now with {args.threads} threads: {bandwidth / 1e9:.1f} GB/s; "
        "'of limit' = median tok/s / (bandwidth / bytes a decode step must read: weights + KV)"
    )
    print("# tok/s as median (min-max); ratio = our median / llama.cpp's better median for the same KV type")
    print(
        f"{'depth':>5} {'kv':>7} {'ours tok/s':>19} {'llama fa=0':>19} {'llama fa=1':>19} {'ratio':>6} {'best':>5}"
        f" {'of limit':>8} {'llama':>6}"
    )
    cells = []
    started = time.time()
    for d in args.depths:
        for kv in args.kv:
            load = os.getloadavg()[0]  # other tenants' work: the doc quotes it next to the figures
            eng = Engine(model, kv_k=kv, kv_v=kv, threads=args.threads, max_batch_tokens=PREFILL_LEN)
            mem = eng.memory()
            # weights one sequence's step reads (a mixture of experts: k experts a layer, not all),
            # the global layers' cache, and the sliding layers' up to their window
            positions = max(d, 1) + 1
            step_bytes = (
                int(geom.stream_bytes(1))
                + positions * mem["bytes_per_token"]
                + min(positions, geom.sliding_window) * mem.get("swa_bytes_per_token", 0)
            )
            mine, theirs = peer.cell(configs(kv, d), args.rounds, functools.partial(ours_sample, eng, d, args.n_decode))
            del eng
            cell: dict = {
                "depth": d,
                "kv": kv,
                "load_1min": load,
                "step_bytes": step_bytes,
                "ours": {"samples": mine},
                "peer": theirs,
            }
            for metric in ("tokens_per_s", "prefill_tokens_per_s"):
                cell["ours"][metric] = spread([s[metric] for s in mine])
                best = None
                for name, t in theirs.items():
                    if t.get("samples"):
                        t[metric] = spread([s[metric] for s in t["samples"]])
                        if best is None or t[metric]["median"] > theirs[best][metric]["median"]:
                            best = name
                cell[f"best_peer_{metric}"] = best
                cell[f"ratio_{metric}"] = (
                    cell["ours"][metric]["median"] / theirs[best][metric]["median"] if best else None
                )
            cells.append(cell)
            peer.save()  # after every cell, so an interrupted run keeps what it measured
            best = cell["best_peer_tokens_per_s"]
            limit = bandwidth / step_bytes
            ratio = f"{cell['ratio_tokens_per_s']:6.2f}" if best else f"{'n/a':>6}"
            peer_limit = f"{theirs[best]['tokens_per_s']['median'] / limit:6.2f}" if best else f"{'n/a':>6}"
            print(
                f"{d:5d} {kv:>7} {show(cell['ours']['tokens_per_s'])} "
                f"{show(theirs.get('fa=0', {}).get('tokens_per_s'))} "
                f"{show(theirs.get('fa=1', {}).get('tokens_per_s'))} "
                f"{ratio} {best or 'n/a':>5} {cell['ours']['tokens_per_s']['median'] / limit:8.2f} {peer_limit}",
                flush=True,
            )

    print(f"\n# prefill of a fresh {PREFILL_LEN}-token prompt (measured in the same rounds), tokens/s median (min-max)")
    print(f"{'depth':>5} {'kv':>7} {'ours pp/s':>19} {'llama pp/s (best)':>19} {'best':>5} {'ratio':>6}")
    for c in cells:
        best = c["best_peer_prefill_tokens_per_s"]
        ratio = f"{c['ratio_prefill_tokens_per_s']:6.2f}" if best else f"{'n/a':>6}"
        print(
            f"{c['depth']:5d} {c['kv']:>7} {show(c['ours']['prefill_tokens_per_s'])} "
            f"{show(c['peer'][best]['prefill_tokens_per_s'] if best else None)} {best or 'n/a':>5} {ratio}"
        )
    print("\n# best of any KV type per depth (decode tok/s medians)")
    print_best_of_any_kv(cells, "depth", args.depths, "depth {}")
    cached = sum(t["cached"] for c in cells for t in c["peer"].values())
    print(f"# llama-cpp-python {peer.version}; peer configurations from cache: {cached}; {time.time() - started:.0f} s")
    parameters = {
        "model": model.name,
        "model_sha256": peer.model_sha256,
        "threads": args.threads,
        "n_decode": args.n_decode,
        "prefill_len": PREFILL_LEN,
        "rounds": args.rounds,
        "depths": args.depths,
        "kv": args.kv,
    }
    path = write_record(
        record_name("decode", args.model),
        parameters,
        cells,
        peer_version=peer.version,
        read_bandwidth_bytes_per_s=bandwidth,
    )
    print(f"# written: {path}")
    peer.save()
    peer.close()


if __name__ == "__main__":
    main()
