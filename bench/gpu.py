"""Decode speed on a Vulkan device: tokens/s at 1, 16 and 64 sequences, depths 0 and 4096, for each KV
format, each figure also as a share of the device's memory-bandwidth limit.

    .venv/bin/python bench/gpu.py [--model PATH|NAME] [--device N] [--kv f16 q8_0 ...] [--seqs 1 16 64]
                                  [--depths 0 4096] [--steps 8] [--cpu-peer] [--quick]

One engine per KV format (K and V alike) on `--backend vulkan --device N`. A cell (format, sequences,
depth): that many sequences whose caches Engine.fill_kv fills to `depth` positions (decode cost does not
depend on how a cache was made), one untimed step, then --steps timed decode steps; the cell's figure is
the median step. tokens/s = sequences / step seconds.

The bandwidth limit: one decode step reads the weights once (the model's weight stream) and each
sequence's cached K/V rows (depth + 1 positions of every layer; a sliding layer at most its window). At
the device's measured copy bandwidth (bytes read plus bytes written per second of a device-local copy,
`_backend_copy_bandwidth`) those bytes take bytes / bandwidth seconds; "share" is that time over the
measured step time (1.00: the step streams at the device's copy bandwidth; launch overhead and compute
make it lower).

--cpu-peer also runs every cell on the CPU engine in the same run and prints GPU / CPU tokens/s.
--quick (lavapipe, CI: correctness of the script, no meaningful figures): f16 and q8_0, 1 and 4
sequences, depths 0 and 64, 3 steps, a 64 MiB bandwidth copy (--kv, --seqs, --depths, --steps given
on the command line win).
The record goes to bench/results/gpu.json (gpu-<model>.json for another --model), with the device,
its driver and the date.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peer
from peer import record_name, write_record  # bench/peer.py (bench scripts run from bench/)

from swarm.gguf_header import read_geometry
from swarm.planner.geometry import ModelGeometry
from worker import _native
from worker.devices import DeviceError, vulkan_device
from worker.engine import Engine, Sampling
from worker.formats import KV_FORMATS
from worker.models import resolve_model

TOKEN = 504  # the token every sequence feeds at its first decode step (any id in the vocabulary)
BANDWIDTH_BYTES = 1 << 30  # bytes per timed copy: large enough that submission overhead is ~1% on a fast GPU
QUICK_BANDWIDTH_BYTES = 64 << 20
BANDWIDTH_REPEATS = 5  # the fastest copy counts (a bandwidth is a best case, like the step it bounds)
FULL: dict[str, Any] = {"kv": list(KV_FORMATS), "seqs": [1, 16, 64], "depths": [0, 4096], "steps": 8}
QUICK: dict[str, Any] = {"kv": ["f16", "q8_0"], "seqs": [1, 4], "depths": [0, 64], "steps": 3}


@dataclass(frozen=True)
class Cell:
    kv: str
    seqs: int
    depth: int


def kv_read_bytes(geom: ModelGeometry, kv: str, context: int) -> int:
    """K/V bytes one decode step of one sequence at `context` cached positions reads (every layer's rows;
    a sliding layer at most its window)."""
    return sum(
        layer.row_bytes((kv, kv)) * (min(context, layer.window) if layer.window else context)
        for layer in geom.kv_layers
    )


def step_bytes(geom: ModelGeometry, cell: Cell) -> float:
    """Bytes a decode step of the cell reads: the weights once, each sequence's KV (depth + the new row)."""
    return geom.stream_bytes(cell.seqs) + cell.seqs * kv_read_bytes(geom, cell.kv, cell.depth + 1)


def budget_bytes(geom: ModelGeometry, kv: str, seqs: int, depth: int, steps: int, block_tokens: int) -> int:
    """KV budget of an engine holding `seqs` sequences of depth + steps + 2 positions, in whole blocks."""
    positions = (-(-(depth + steps + 2) // block_tokens) + 1) * block_tokens  # one block to spare per sequence
    return seqs * positions * geom.kv_bytes_per_token((kv, kv))


def time_cell(eng: Engine, cell: Cell, steps: int) -> list[float]:
    """Seconds of each of `steps` decode steps of the cell (after one untimed step)."""
    turn = Sampling(max_new_tokens=steps + 2, stop_tokens=())
    n_vocab = int(eng.config["n_vocab"])
    ids = [eng.add_sequence([], generate=False) for _ in range(cell.seqs)]
    for i, sid in enumerate(ids):
        if cell.depth:
            eng.fill_kv(sid, cell.depth, seed=i + 1)
        eng.append(sid, [(TOKEN + i) % n_vocab], turn)
    eng.step()  # the appended token: a decode-shaped step, untimed (pipelines, first touch)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = eng.step()
        times.append(time.perf_counter() - t0)
        if len(out) != cell.seqs:
            sys.exit(f"{cell}: a step advanced {len(out)} of {cell.seqs} sequences")
    for sid in ids:
        eng.free(sid)
    return times


def engine(model: Path, kv: str, budget: int, on: dict[str, Any], threads: int) -> Engine:
    return Engine(model, kv_k=kv, kv_v=kv, kv_budget_bytes=budget, threads=threads, prefix_sharing=False, **on)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path or a `swarm models` name (default: SmolLM2-135M)")
    ap.add_argument("--device", type=int, default=0, help="Vulkan device index (`swarm devices`)")
    ap.add_argument("--kv", nargs="+", choices=KV_FORMATS, help="KV formats, K = V (default: every format)")
    ap.add_argument("--seqs", nargs="+", type=int, help="sequences decoding at once (default: 1 16 64)")
    ap.add_argument("--depths", nargs="+", type=int, help="cached positions per sequence (default: 0 4096)")
    ap.add_argument("--steps", type=int, help="timed decode steps per cell, their median counts (default: 8)")
    ap.add_argument("--threads", type=int, default=2, help="host threads (the CPU peer's compute threads)")
    ap.add_argument("--cpu-peer", action="store_true", help="also time every cell on the CPU engine")
    ap.add_argument("--quick", action="store_true", help="a few small cells (lavapipe: checks the script runs)")
    ap.add_argument("--out", default=None, help="folder for the record (default: bench/results)")
    args = ap.parse_args(argv)
    # Defaults (--quick: QUICK); a value given on the command line wins either way.
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.steps < 1 or min(args.seqs) < 1 or min(args.depths) < 0:
        ap.error("--steps and --seqs must be positive, --depths at least 0")
    try:
        gpu = vulkan_device(args.device)
    except DeviceError as e:
        sys.exit(f"bench/gpu.py: {e}")
    path = resolve_model(args.model)
    geom = read_geometry(path)
    if max(args.depths) + args.steps + 2 > geom.n_ctx:
        ap.error(f"depth {max(args.depths)} + {args.steps + 2} steps exceeds the model's {geom.n_ctx} tokens")
    on = {"backend": "vulkan", "device": args.device}
    copy_bytes = QUICK_BANDWIDTH_BYTES if args.quick else BANDWIDTH_BYTES
    bandwidth = float(_native._backend_copy_bandwidth("vulkan", args.device, copy_bytes, BANDWIDTH_REPEATS))
    print(f"device: {gpu.label}, Vulkan {gpu.api_version}, {gpu.memory_budget_bytes / 2**30:.1f} GiB")
    print(f"model: {geom.name}, weights {geom.weight_stream_bytes / 1e6:.1f} MB per step")
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + written, best of {BANDWIDTH_REPEATS} x "
          f"{copy_bytes >> 20} MiB)")  # fmt: skip

    head = f"{'KV':<8} {'seqs':>5} {'depth':>6} {'step ms':>9} {'tok/s':>10} {'MB/step':>9} {'share':>6}"
    if args.cpu_peer:
        head += f" {'cpu tok/s':>10} {'gpu/cpu':>8}"
    print(head)
    print("-" * len(head))
    cells: list[dict[str, Any]] = []
    block_tokens = 16  # the engine's default block (worker.settings)
    for kv in args.kv:
        budget = budget_bytes(geom, kv, max(args.seqs), max(args.depths), args.steps, block_tokens)
        peers = {"gpu": engine(path, kv, budget, on, args.threads)}
        if args.cpu_peer:
            peers["cpu"] = engine(path, kv, budget, {}, args.threads)
        for depth in args.depths:
            for seqs in args.seqs:
                cell = Cell(kv, seqs, depth)
                times = {side: time_cell(eng, cell, args.steps) for side, eng in peers.items()}
                step = statistics.median(times["gpu"])
                moved = step_bytes(geom, cell)
                share = moved / bandwidth / step if bandwidth > 0 else 0.0
                row = f"{kv:<8} {seqs:>5} {depth:>6} {step * 1e3:>9.2f} {seqs / step:>10.1f} {moved / 1e6:>9.1f} "
                row += f"{share:>6.2f}"
                record: dict[str, Any] = {
                    "kv": kv, "seqs": seqs, "depth": depth, "step_s": times["gpu"], "median_step_s": step,
                    "tokens_per_s": seqs / step, "bytes_per_step": moved, "bandwidth_share": share,
                }  # fmt: skip
                if "cpu" in times:
                    cpu_step = statistics.median(times["cpu"])
                    row += f" {seqs / cpu_step:>10.1f} {cpu_step / step:>7.2f}x"
                    record.update(cpu_step_s=times["cpu"], cpu_tokens_per_s=seqs / cpu_step)
                print(row, flush=True)
                cells.append(record)
        del peers
    params = {
        "model": str(path), "device": args.device, "kv": args.kv, "seqs": args.seqs, "depths": args.depths,
        "steps": args.steps, "threads": args.threads, "quick": args.quick, "copy_bytes": copy_bytes,
    }  # fmt: skip
    if args.out:
        peer.RESULTS = Path(args.out)  # write_record's folder
    out = write_record(
        record_name("gpu", args.model) + ("-quick" if args.quick else ""), params, cells,
        gpu=gpu.to_dict(), copy_bandwidth_bytes_per_s=bandwidth,
        weight_stream_bytes=geom.weight_stream_bytes,
    )  # fmt: skip
    print(f"share: (weights + KV read per step) / copy bandwidth / step time. Record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
